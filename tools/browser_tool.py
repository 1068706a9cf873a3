"""Browser tools: drive one page of a remote Chromium over CDP with Playwright.

Needs ``pip install playwright`` (no bundled browser: it attaches to a running Chromium
at ``browser.cdp_url`` / ``BROWSER_CDP_URL``). Each episode gets its own browser context
and page, kept in ``ctx.state["browser"]`` under its task id. Playwright objects belong
to the event loop that created them, while tool calls may each run on a fresh loop, so a
session drives its page from a private loop thread. Sessions are closed through
``ctx.on_close`` when the episode ends, or when garbage collected.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import re
import threading
import weakref
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from tools.registry import ToolUnavailable, registry, tool_error, tool_result
from tools.settings import ToolContext, ToolSettings
from tools.truncate import truncate_text

logger = logging.getLogger(__name__)

TOOLSET = "browser"
STATE_KEY = "browser"
_REF = re.compile(r"^e\d+$")
_PLAYWRIGHT_HELP = "pip install playwright (it attaches to a running Chromium; no download)"
_CDP_HELP = (
    "set browser.cdp_url in the job's tools: section or the environment variable "
    "BROWSER_CDP_URL (for example http://127.0.0.1:9222)"
)
PageAction = Callable[[Any], Awaitable[dict[str, Any]]]


def _missing(settings: ToolSettings) -> list[str]:
    missing = []
    if importlib.util.find_spec("playwright") is None:
        missing.append(_PLAYWRIGHT_HELP)
    if not settings.option(TOOLSET, "cdp_url", env="BROWSER_CDP_URL"):
        missing.append(_CDP_HELP)
    return missing


def check_browser(settings: ToolSettings) -> bool:
    missing = _missing(settings)
    if missing:
        raise ToolUnavailable("browser tools need: " + "; ".join(missing))
    return True


async def _close_objects(objects: dict[str, Any]) -> None:
    for key in ("context", "browser"):
        obj = objects.pop(key, None)
        if obj is not None:
            await obj.close()
    objects.pop("page", None)
    playwright = objects.pop("playwright", None)
    if playwright is not None:
        await playwright.stop()


def _serve(loop: asyncio.AbstractEventLoop) -> None:
    try:
        loop.run_forever()
    finally:
        loop.close()


def _shutdown(
    loop: asyncio.AbstractEventLoop, thread: threading.Thread, objects: dict[str, Any]
) -> None:
    if loop.is_closed():
        return
    future = asyncio.run_coroutine_threadsafe(_close_objects(objects), loop)
    # Garbage collection may run this on the session thread itself: never wait there.
    if threading.current_thread() is not thread:
        try:
            future.result(timeout=10)
        except Exception:  # cleanup must not fail the caller; the remote browser survives it
            logger.warning("closing a browser session failed", exc_info=True)
    loop.call_soon_threadsafe(loop.stop)


class BrowserSession:
    """One browser context and page, driven from the session's own loop thread."""

    def __init__(self, cdp_url: str, timeout_ms: int) -> None:
        self._cdp_url = cdp_url
        self._timeout_ms = timeout_ms
        self._loop = asyncio.new_event_loop()
        self._objects: dict[str, Any] = {}
        thread = threading.Thread(target=_serve, args=(self._loop,), name="browser", daemon=True)
        thread.start()
        self._finalizer = weakref.finalize(self, _shutdown, self._loop, thread, self._objects)

    async def run(self, action: PageAction) -> dict[str, Any]:
        future = asyncio.run_coroutine_threadsafe(self._on_page(action), self._loop)
        return await asyncio.wrap_future(future)

    async def _on_page(self, action: PageAction) -> dict[str, Any]:
        page = self._objects.get("page")
        if page is None:
            page = await self._open()
        return await action(page)

    async def _open(self) -> Any:
        try:
            return await self._connect()
        except BaseException:
            # Do not leak a half-open connection; the next call starts afresh.
            await _close_objects(self._objects)
            raise

    async def _connect(self) -> Any:
        from playwright.async_api import async_playwright

        self._objects["playwright"] = playwright = await async_playwright().start()
        browser = await playwright.chromium.connect_over_cdp(
            self._cdp_url, timeout=self._timeout_ms
        )
        self._objects["browser"] = browser
        # A fresh context per episode: no cookies or storage leak between episodes.
        self._objects["context"] = context = await browser.new_context()
        page = await context.new_page()
        page.set_default_timeout(self._timeout_ms)
        self._objects["page"] = page
        return page

    def close(self) -> None:
        self._finalizer()


def close_browser_sessions(state: MutableMapping[str, Any]) -> None:
    """Close every browser session kept in an episode's state."""
    for session in state.pop(STATE_KEY, {}).values():
        session.close()


def _session(ctx: ToolContext) -> BrowserSession:
    missing = _missing(ctx.settings)
    if missing:
        raise ToolUnavailable("browser tools need: " + "; ".join(missing))
    sessions = ctx.state.setdefault(STATE_KEY, {})
    session = sessions.get(ctx.task_id)
    if session is None:
        cdp_url = str(ctx.settings.option(TOOLSET, "cdp_url", env="BROWSER_CDP_URL"))
        timeout_s = float(ctx.settings.option(TOOLSET, "timeout_s", default=30.0))
        session = sessions[ctx.task_id] = BrowserSession(cdp_url, int(timeout_s * 1000))
        state = ctx.state
        ctx.on_close(lambda: close_browser_sessions(state))
    return session


def _page_errors() -> tuple[type[BaseException], ...]:
    from playwright.async_api import Error as PlaywrightError

    return (PlaywrightError, asyncio.TimeoutError, OSError)


async def _run(name: str, kwargs: dict[str, Any], action: PageAction) -> str:
    ctx = kwargs.get("ctx")
    if not isinstance(ctx, ToolContext):
        return tool_error(f"{name} needs an episode context (ctx) to run")
    try:
        session = _session(ctx)
    except ToolUnavailable as exc:
        return tool_error(f"{name}: {exc}")
    try:
        data = await session.run(action)
    except _page_errors() as exc:
        return tool_error(f"{name} failed: {str(exc).splitlines()[0] if str(exc) else exc!r}")
    if "text" in data:  # only snapshots carry page text; keep them inside the budget
        data["text"] = truncate_text(data["text"], max(ctx.max_result_chars // 2, 200)).text
    return tool_result(data)


_SNAPSHOT_JS = """() => {
  const attr = 'data-hermes-ref';
  for (const e of document.querySelectorAll(`[${attr}]`)) e.removeAttribute(attr);
  const sel = 'a[href], button, input, select, textarea, summary, [role=button], [role=link]';
  const lines = [];
  for (const el of document.querySelectorAll(sel)) {
    const box = el.getBoundingClientRect();
    if (box.width === 0 && box.height === 0) continue;
    const ref = 'e' + (lines.length + 1);
    el.setAttribute(attr, ref);
    const label = (el.innerText || el.value || el.getAttribute('aria-label') ||
      el.getAttribute('placeholder') || '').replace(/\\s+/g, ' ').trim().slice(0, 80);
    const kind = el.tagName.toLowerCase() + (el.type ? ':' + el.type : '');
    const href = el.getAttribute('href');
    lines.push(`[${ref}] ${kind} "${label}"` + (href ? ` -> ${href}` : ''));
    if (lines.length >= 200) break;
  }
  return {elements: lines.join('\\n'), text: document.body ? document.body.innerText : ''};
}"""


def _spec(handler: Callable[..., Awaitable[str]], description: str, **props: Any) -> Any:
    """``registry.register`` arguments; ``props`` maps name -> (JSON schema, required)."""
    schema = {
        "name": handler.__name__,
        "description": description,
        "parameters": {
            "type": "object",
            "properties": {key: spec for key, (spec, _) in props.items()},
            "required": [key for key, (_, needed) in props.items() if needed],
        },
    }
    return {
        "name": handler.__name__,
        "toolset": TOOLSET,
        "schema": schema,
        "handler": handler,
        "check_fn": check_browser,
        "is_async": True,
        "emoji": "🌐",
    }


def _string(description: str, required: bool = True) -> tuple[dict[str, Any], bool]:
    return {"type": "string", "description": description}, required


_REF_ARG = _string("Element ref from browser_snapshot, like e3.", required=False)
_SELECTOR_ARG = _string("CSS selector, when there is no ref.", required=False)


async def _snapshot(page: Any) -> dict[str, Any]:
    data = await page.evaluate(_SNAPSHOT_JS)
    return {"url": page.url, "title": await page.title(), **data}


async def _location(page: Any) -> dict[str, Any]:
    return {"url": page.url, "title": await page.title()}


def _selector(args: dict[str, Any]) -> str:
    target = str(args.get("ref") or args.get("selector") or "").strip()
    if not target:
        raise ValueError("give a ref from browser_snapshot (like e3) or a CSS selector")
    return f'[data-hermes-ref="{target}"]' if _REF.match(target) else target


async def browser_navigate(args: dict[str, Any], **kwargs: Any) -> str:
    url = str(args.get("url") or "")
    if not url.lower().startswith(("http://", "https://")):
        return tool_error("browser_navigate only opens http:// and https:// URLs")

    async def action(page: Any) -> dict[str, Any]:
        response = await page.goto(url, wait_until="domcontentloaded")
        return {"status": response.status if response else None, **await _snapshot(page)}

    return await _run("browser_navigate", kwargs, action)


registry.register(
    **_spec(
        browser_navigate,
        "Open a URL; returns the page's elements (with refs) and text.",
        url=_string("The http(s) URL to open."),
    )
)


async def browser_snapshot(args: dict[str, Any], **kwargs: Any) -> str:
    return await _run("browser_snapshot", kwargs, _snapshot)


registry.register(**_spec(browser_snapshot, "List the page's elements with refs, and its text."))


async def browser_click(args: dict[str, Any], **kwargs: Any) -> str:
    try:
        selector = _selector(args)
    except ValueError as exc:
        return tool_error(str(exc))

    async def action(page: Any) -> dict[str, Any]:
        await page.click(selector)
        return {"clicked": selector, **await _location(page)}

    return await _run("browser_click", kwargs, action)


registry.register(
    **_spec(
        browser_click,
        "Click an element, by ref (preferred) or CSS selector.",
        ref=_REF_ARG,
        selector=_SELECTOR_ARG,
    )
)


async def browser_type(args: dict[str, Any], **kwargs: Any) -> str:
    try:
        selector = _selector(args)
    except ValueError as exc:
        return tool_error(str(exc))
    text = str(args.get("text", ""))

    async def action(page: Any) -> dict[str, Any]:
        await page.fill(selector, text)
        return {"typed_into": selector, **await _location(page)}

    return await _run("browser_type", kwargs, action)


registry.register(
    **_spec(
        browser_type,
        "Replace the text of an input field, found by ref or CSS selector.",
        ref=_REF_ARG,
        selector=_SELECTOR_ARG,
        text=_string("The text to enter."),
    )
)


async def browser_scroll(args: dict[str, Any], **kwargs: Any) -> str:
    down = args.get("direction", "down") != "up"
    script = "(down) => window.scrollBy(0, (down ? 1 : -1) * window.innerHeight * 0.8)"

    async def action(page: Any) -> dict[str, Any]:
        await page.evaluate(script, down)
        return {"scroll_y": await page.evaluate("() => window.scrollY"), **await _location(page)}

    return await _run("browser_scroll", kwargs, action)


registry.register(
    **_spec(
        browser_scroll,
        "Scroll the page up or down by most of a screen.",
        direction=({"type": "string", "enum": ["up", "down"]}, True),
    )
)


async def browser_back(args: dict[str, Any], **kwargs: Any) -> str:
    async def action(page: Any) -> dict[str, Any]:
        await page.go_back(wait_until="domcontentloaded")
        return await _location(page)

    return await _run("browser_back", kwargs, action)


registry.register(**_spec(browser_back, "Go back to the previous page in the history."))


async def browser_press(args: dict[str, Any], **kwargs: Any) -> str:
    key = str(args.get("key") or "").strip()
    if not key:
        return tool_error("key must name a key, like Enter, Tab, ArrowDown or Control+a")

    async def action(page: Any) -> dict[str, Any]:
        await page.keyboard.press(key)
        return {"pressed": key, **await _location(page)}

    return await _run("browser_press", kwargs, action)


registry.register(
    **_spec(
        browser_press,
        "Press a key or chord on the focused element (Enter, Control+a).",
        key=_string("A Playwright key name."),
    )
)
