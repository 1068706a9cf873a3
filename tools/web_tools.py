"""Web search (SearXNG, Tavily or Brave) and page extraction to readable text.

``web_search`` is hidden until a backend is configured. ``web_extract`` only needs
outbound HTTP, so it is available by default; a page that cannot be fetched is an error
entry in its result, never an exception. By default it refuses addresses that are not
public (loopback, private ranges, link-local such as cloud metadata services), because
the URLs are model-written and the worker may sit next to credentials.
"""

from __future__ import annotations

import asyncio
import codecs
import errno
import ipaddress
import json
import logging
import re
import socket
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from yarl import URL

from tools.html_text import html_to_text
from tools.registry import ToolUnavailable, registry, tool_error, tool_result
from tools.settings import ToolContext, ToolSettings
from tools.truncate import truncate_text

logger = logging.getLogger(__name__)

TOOLSET = "web"
DEFAULT_TAVILY_URL = "https://api.tavily.com/search"
DEFAULT_BRAVE_URL = "https://api.search.brave.com/res/v1/web/search"
BACKENDS = ("searxng", "tavily", "brave")
MAX_SEARCH_RESULTS = 20
MAX_URLS = 5
MAX_REDIRECTS = 5
DEFAULT_READ_CAP_BYTES = 2 * 1024 * 1024
DEFAULT_TIMEOUT_S = 20.0
EXCERPT_CHARS = 300
USER_AGENT = "hermes-batch/0.1 (web tools)"
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_TRUE = frozenset({"1", "true", "yes", "on"})


def _flag(value: Any, default: bool) -> bool:
    if value is None:
        return default
    if isinstance(value, str):
        return value.strip().lower() in _TRUE
    return bool(value)


def _context(kwargs: dict[str, Any]) -> ToolContext | None:
    ctx = kwargs.get("ctx")
    return ctx if isinstance(ctx, ToolContext) else None


def _timeout(settings: ToolSettings) -> aiohttp.ClientTimeout:
    seconds = float(settings.option(TOOLSET, "timeout_s", default=DEFAULT_TIMEOUT_S))
    return aiohttp.ClientTimeout(total=min(seconds, settings.call_timeout_s))


def _excerpt(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= EXCERPT_CHARS else text[:EXCERPT_CHARS] + "..."


# -- search backends --------------------------------------------------------------------

_SEARCH_HELP = (
    "set web.searxng_url in the job's tools: section (or SEARXNG_URL), or the environment "
    "variable TAVILY_API_KEY or BRAVE_API_KEY; web.backend (or WEB_SEARCH_BACKEND) picks one "
    "when several are set"
)


@dataclass(frozen=True, slots=True)
class SearchBackend:
    """A configured search service. ``key`` is never logged nor returned."""

    name: str
    url: str
    key: str = ""


def _backend_config(settings: ToolSettings, name: str) -> SearchBackend | None:
    if name == "searxng":
        url = settings.option(TOOLSET, "searxng_url", env="SEARXNG_URL")
        return SearchBackend("searxng", str(url)) if url else None
    env_name = "TAVILY_API_KEY" if name == "tavily" else "BRAVE_API_KEY"
    # Keys only come from the environment: job files are copied into the output.
    key = settings.env.get(env_name)
    if not key:
        return None
    default = DEFAULT_TAVILY_URL if name == "tavily" else DEFAULT_BRAVE_URL
    return SearchBackend(name, str(settings.option(TOOLSET, f"{name}_url", default=default)), key)


def search_backend(settings: ToolSettings) -> SearchBackend:
    """The backend ``web_search`` uses; ToolUnavailable says what to configure."""
    forced = settings.option(TOOLSET, "backend", env="WEB_SEARCH_BACKEND")
    if forced:
        name = str(forced).strip().lower()
        if name not in BACKENDS:
            raise ToolUnavailable(f"web.backend is {forced!r}; use one of {', '.join(BACKENDS)}")
        backend = _backend_config(settings, name)
        if backend is None:
            need = {
                "searxng": "web.searxng_url (or SEARXNG_URL)",
                "tavily": "the environment variable TAVILY_API_KEY",
                "brave": "the environment variable BRAVE_API_KEY",
            }[name]
            raise ToolUnavailable(f"web.backend is {name!r} but {need} is not set")
        return backend
    for name in BACKENDS:
        backend = _backend_config(settings, name)
        if backend is not None:
            return backend
    raise ToolUnavailable(f"web_search needs a search backend: {_SEARCH_HELP}")


def check_web_search(settings: ToolSettings) -> bool:
    search_backend(settings)
    return True


class SearchError(Exception):
    """A backend answered with an error status or an unreadable body."""

    def __init__(self, message: str, status: int | None = None, body: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.body = body


async def _read_json(response: aiohttp.ClientResponse, backend: str) -> Any:
    text = await response.text(errors="replace")
    if response.status >= 400:
        hint = ""
        if backend == "searxng" and response.status == 403:
            hint = " (is 'json' listed under search.formats in SearXNG's settings.yml?)"
        raise SearchError(
            f"{backend} answered HTTP {response.status}{hint}", response.status, _excerpt(text)
        )
    try:
        return json.loads(text)
    except ValueError:
        raise SearchError(
            f"{backend} returned a body that is not JSON", response.status, _excerpt(text)
        ) from None


def _searxng_request(backend: SearchBackend, query: str, count: int) -> dict[str, Any]:
    base = backend.url.rstrip("/")
    url = base if base.endswith("/search") else base + "/search"
    return {"method": "GET", "url": url, "params": {"q": query, "format": "json"}}


def _tavily_request(backend: SearchBackend, query: str, count: int) -> dict[str, Any]:
    return {
        "method": "POST",
        "url": backend.url,
        "json": {"query": query, "max_results": count},
        "headers": {"Authorization": f"Bearer {backend.key}"},
    }


def _brave_request(backend: SearchBackend, query: str, count: int) -> dict[str, Any]:
    return {
        "method": "GET",
        "url": backend.url,
        "params": {"q": query, "count": str(count)},
        "headers": {"X-Subscription-Token": backend.key, "Accept": "application/json"},
    }


def _map_results(backend: str, data: Any) -> list[dict[str, str]]:
    """Backend JSON -> [{"title", "url", "snippet"}]."""
    container = data.get("web", {}) if backend == "brave" and isinstance(data, dict) else data
    items = container.get("results") if isinstance(container, dict) else None
    if not isinstance(items, list):
        raise SearchError(f"{backend} returned JSON without a results list")
    snippet_key = "description" if backend == "brave" else "content"
    mapped = []
    for item in items:
        if not isinstance(item, dict) or not item.get("url"):
            continue
        snippet = str(item.get(snippet_key) or "")
        if backend == "brave":  # Brave marks matches with <strong> tags
            snippet = html_to_text(snippet).text
        mapped.append(
            {"title": str(item.get("title") or ""), "url": str(item["url"]), "snippet": snippet}
        )
    return mapped


_REQUEST_BUILDERS = {
    "searxng": _searxng_request,
    "tavily": _tavily_request,
    "brave": _brave_request,
}


async def run_search(settings: ToolSettings, query: str, count: int) -> dict[str, Any]:
    backend = search_backend(settings)
    request = _REQUEST_BUILDERS[backend.name](backend, query, count)
    headers = {"User-Agent": USER_AGENT, **request.pop("headers", {})}
    async with (
        aiohttp.ClientSession(timeout=_timeout(settings)) as session,
        session.request(headers=headers, **request) as response,
    ):
        data = await _read_json(response, backend.name)
    return {"results": _map_results(backend.name, data)[:count], "backend": backend.name}


def _result_count(value: Any) -> int:
    count = 5 if value is None else int(value)
    return max(1, min(count, MAX_SEARCH_RESULTS))


async def web_search(args: dict[str, Any], **kwargs: Any) -> str:
    ctx = _context(kwargs)
    if ctx is None:
        return tool_error("web_search needs an episode context (ctx) to run")
    query = args.get("query")
    if not isinstance(query, str) or not query.strip():
        return tool_error("query must be a non-empty string")
    try:
        count = _result_count(args.get("max_results"))
    except (TypeError, ValueError):
        return tool_error("max_results must be an integer")
    try:
        return tool_result(await run_search(ctx.settings, query.strip(), count))
    except ToolUnavailable as exc:
        return tool_error(f"web_search is not configured: {exc}")
    except SearchError as exc:
        return tool_error(str(exc), status=exc.status, body=exc.body)
    except asyncio.TimeoutError:
        return tool_error("search request timed out")
    except aiohttp.ClientError as exc:
        return tool_error(f"search request failed: {type(exc).__name__}: {exc}")


# -- page extraction --------------------------------------------------------------------


class FetchError(Exception):
    """A page could not be fetched or read; the message goes into its result entry."""


def _is_internal(host: str) -> bool:
    address = ipaddress.ip_address(host.split("%", 1)[0])
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return not address.is_global or address.is_multicast


_PRIVATE_HINT = "set web.allow_private_networks: true to allow private and local addresses"


class PublicOnlyResolver(AbstractResolver):
    """Drops non-public addresses from DNS answers, so names cannot reach internal hosts."""

    def __init__(self) -> None:
        self._inner = aiohttp.ThreadedResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        answers = await self._inner.resolve(host, port, family)
        public = [a for a in answers if not _is_internal(a["host"])]
        if not public:
            # aiohttp shows only strerror, so give one.
            message = f"{host} resolves only to non-public addresses; {_PRIVATE_HINT}"
            raise OSError(errno.EACCES, message)
        return public

    async def close(self) -> None:
        await self._inner.close()


def validate_url(raw: str, allow_private: bool) -> URL:
    """Parse a URL a page may be fetched from, or raise FetchError saying why not."""
    try:
        url = URL(raw)
    except (ValueError, TypeError) as exc:
        raise FetchError(f"not a valid URL: {exc}") from None
    if url.scheme not in ("http", "https"):
        raise FetchError(f"only http and https URLs can be fetched, not {url.scheme or 'a bare'!r}")
    if not url.host:
        raise FetchError("the URL has no host")
    if not allow_private:
        try:
            internal = _is_internal(url.host)
        except ValueError:  # a name, checked by the resolver when it is looked up
            internal = False
        if internal:
            raise FetchError(f"{url.host} is not a public address; {_PRIVATE_HINT}")
    return url


@dataclass(frozen=True, slots=True)
class FetchedPage:
    url: str
    content_type: str
    charset: str | None
    body: bytes
    cut: bool


async def _read_capped(response: aiohttp.ClientResponse, cap: int) -> tuple[bytes, bool]:
    """Read at most ``cap`` bytes of the body; True when more was left unread."""
    chunks: list[bytes] = []
    total = 0
    async for chunk in response.content.iter_chunked(64 * 1024):
        remaining = cap - total
        if len(chunk) > remaining:
            chunks.append(chunk[:remaining])
            return b"".join(chunks), True
        chunks.append(chunk)
        total += len(chunk)
    return b"".join(chunks), False


async def fetch_page(
    session: aiohttp.ClientSession, raw_url: str, cap: int, allow_private: bool
) -> FetchedPage:
    """GET a page, following redirects ourselves so every hop is checked."""
    url = validate_url(raw_url, allow_private)
    for _ in range(MAX_REDIRECTS + 1):
        async with session.get(url, allow_redirects=False) as response:
            if response.status in _REDIRECTS:
                location = response.headers.get("Location")
                if not location:
                    raise FetchError(f"HTTP {response.status} redirect without a Location")
                url = validate_url(str(url.join(URL(location))), allow_private)
                continue
            if response.status >= 400:
                excerpt = _excerpt((await _read_capped(response, 4096))[0].decode(errors="replace"))
                raise FetchError(f"HTTP {response.status}: {excerpt}")
            body, cut = await _read_capped(response, cap)
            return FetchedPage(str(url), response.content_type, response.charset, body, cut)
    raise FetchError(f"more than {MAX_REDIRECTS} redirects")


_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?([A-Za-z0-9._:-]+)""", re.IGNORECASE)
_TEXT_TYPES = ("application/json", "application/xml", "application/javascript")


def page_kind(page: FetchedPage) -> str:
    """'html', 'text' or 'binary', from the content type and, when vague, the bytes."""
    ctype = page.content_type.lower()
    if ctype in ("text/html", "application/xhtml+xml"):
        return "html"
    if ctype.startswith("text/") or ctype in _TEXT_TYPES or ctype.endswith(("+json", "+xml")):
        return "text"
    if ctype not in ("", "application/octet-stream"):
        return "binary"
    head = page.body[:1024]
    if b"\x00" in head:
        return "binary"
    return "html" if head.lstrip()[:14].lower() in (b"<!doctype html", b"<html") else "text"


def decode_body(page: FetchedPage, kind: str) -> str:
    """Bytes to text by the declared (or meta) charset; undecodable bytes become U+FFFD."""
    encoding = page.charset
    if not encoding and kind == "html":
        match = _META_CHARSET.search(page.body[:4096])
        encoding = match.group(1).decode("ascii") if match else None
    try:
        codecs.lookup(encoding or "utf-8")
    except LookupError:
        encoding = None
    return page.body.decode(encoding or "utf-8", errors="replace")


def page_entry(raw_url: str, page: FetchedPage, budget: int) -> dict[str, Any]:
    """The result entry of one fetched page: title and readable text within ``budget``."""
    kind = page_kind(page)
    if kind == "binary":
        return {
            "url": raw_url,
            "error": f"unsupported content type {page.content_type!r}: "
            "web_extract reads HTML and text pages only",
        }
    text = decode_body(page, kind)
    title = ""
    if kind == "html":
        converted = html_to_text(text)
        title, text = converted.title, converted.text
    cut = truncate_text(text, budget)
    entry: dict[str, Any] = {"url": raw_url, "title": title, "content": cut.text}
    if page.url != raw_url:
        entry["final_url"] = page.url
    if page.cut:
        entry["download_truncated"] = True
    if cut.truncated:
        entry["omitted_chars"] = cut.omitted
    return entry


def _describe_fetch_error(exc: BaseException, timeout_s: float | None) -> str:
    if isinstance(exc, FetchError):
        return str(exc)
    if isinstance(exc, asyncio.TimeoutError):
        return f"timed out after {timeout_s:g} s" if timeout_s else "timed out"
    if isinstance(exc, aiohttp.TooManyRedirects):
        return f"more than {MAX_REDIRECTS} redirects"
    return f"connection error: {type(exc).__name__}: {exc}"


async def extract_pages(ctx: ToolContext, urls: list[str]) -> list[dict[str, Any]]:
    settings = ctx.settings
    cap = int(settings.option(TOOLSET, "max_download_bytes", default=DEFAULT_READ_CAP_BYTES))
    allow_private = _flag(settings.option(TOOLSET, "allow_private_networks"), default=False)
    # Leave room for the JSON around each page so the whole result fits the budget.
    budget = max((ctx.max_result_chars - 300 * len(urls)) // len(urls), 200)
    timeout = _timeout(settings)
    resolver = None if allow_private else PublicOnlyResolver()
    connector = aiohttp.TCPConnector(resolver=resolver, limit_per_host=2)
    async with aiohttp.ClientSession(
        timeout=timeout, connector=connector, headers={"User-Agent": USER_AGENT}
    ) as session:

        async def one(raw: str) -> dict[str, Any]:
            try:
                page = await fetch_page(session, raw, cap, allow_private)
            except (FetchError, asyncio.TimeoutError, aiohttp.ClientError, OSError) as exc:
                logger.debug("web_extract %s failed: %s", raw, exc)
                return {"url": raw, "error": _describe_fetch_error(exc, timeout.total)}
            return page_entry(raw, page, budget)

        return list(await asyncio.gather(*(one(u) for u in urls)))


def _url_list(args: dict[str, Any]) -> list[str]:
    urls = args.get("urls")
    if urls is None and args.get("url") is not None:
        urls = [args["url"]]
    if isinstance(urls, str):
        urls = [urls]
    if not isinstance(urls, list) or not urls:
        raise ValueError("urls must be a non-empty array of URL strings")
    if not all(isinstance(u, str) and u.strip() for u in urls):
        raise ValueError("every entry of urls must be a non-empty string")
    if len(urls) > MAX_URLS:
        raise ValueError(f"at most {MAX_URLS} urls per call (got {len(urls)})")
    return [u.strip() for u in dict.fromkeys(urls)]


async def web_extract(args: dict[str, Any], **kwargs: Any) -> str:
    ctx = _context(kwargs)
    if ctx is None:
        return tool_error("web_extract needs an episode context (ctx) to run")
    try:
        urls = _url_list(args)
    except ValueError as exc:
        return tool_error(str(exc))
    return tool_result(results=await extract_pages(ctx, urls))


def check_web_extract(settings: ToolSettings) -> bool:
    if not _flag(settings.option(TOOLSET, "extract_enabled"), default=True):
        raise ToolUnavailable(
            "web_extract is switched off by web.extract_enabled: false in the job's tools: section"
        )
    return True


WEB_SEARCH_SCHEMA = {
    "name": "web_search",
    "description": (
        "Search the web. Returns a list of results with title, url and a short snippet; "
        "use web_extract to read a page in full."
    ),
    "parameters": {
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "The search query."},
            "max_results": {
                "type": "integer",
                "minimum": 1,
                "maximum": MAX_SEARCH_RESULTS,
                "description": "How many results to return (default 5).",
            },
        },
        "required": ["query"],
    },
}

WEB_EXTRACT_SCHEMA = {
    "name": "web_extract",
    "description": (
        "Fetch web pages (http or https) and return each page's title and readable text. "
        f"Up to {MAX_URLS} URLs per call; a page that cannot be fetched gets an error entry."
    ),
    "parameters": {
        "type": "object",
        "properties": {
            "urls": {
                "type": "array",
                "items": {"type": "string"},
                "minItems": 1,
                "maxItems": MAX_URLS,
                "description": "The page URLs to read.",
            }
        },
        "required": ["urls"],
    },
}

registry.register(
    name="web_search",
    toolset=TOOLSET,
    schema=WEB_SEARCH_SCHEMA,
    handler=web_search,
    check_fn=check_web_search,
    is_async=True,
    emoji="🔍",
)

registry.register(
    name="web_extract",
    toolset=TOOLSET,
    schema=WEB_EXTRACT_SCHEMA,
    handler=web_extract,
    check_fn=check_web_extract,
    is_async=True,
    emoji="📄",
)
