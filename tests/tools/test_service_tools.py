"""vision_analyze and image_generate against fake loopback endpoints; browser availability."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import importlib.util
import json
import struct
import threading
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tools import browser_tool
from tools.image_generation_tool import image_generate
from tools.registry import registry
from tools.settings import ToolContext, ToolSettings
from tools.vision_tool import vision_analyze

KEY = "sk-service-secret"
HAS_PLAYWRIGHT = importlib.util.find_spec("playwright") is not None


def tiny_png() -> bytes:
    """A valid 1x1 red PNG, built by hand."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
    pixels = zlib.compress(b"\x00\xff\x00\x00")
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")
    )


class FakeModels:
    """Chat completions that describe the image they got, and an images endpoint."""

    def __init__(self, image_items: list[dict[str, Any]] | None = None) -> None:
        self.requests: list[tuple[str, dict[str, Any], str | None]] = []
        self.image_items = image_items

    async def chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(("chat", body, request.headers.get("Authorization")))
        if body["model"] == "bad-vision":
            return web.json_response({"error": {"message": "overloaded"}}, status=500)
        parts = body["messages"][0]["content"]
        url = next(p["image_url"]["url"] for p in parts if p["type"] == "image_url")
        message = {"role": "assistant", "content": f"saw {url[:30]}"}
        return web.json_response(
            {
                "id": "c",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            }
        )

    async def images(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(("images", body, request.headers.get("Authorization")))
        items = self.image_items
        if items is None:
            items = [{"b64_json": base64.b64encode(tiny_png()).decode(), "revised_prompt": "r"}]
        return web.json_response({"created": 0, "data": items})


@contextlib.asynccontextmanager
async def serve(fake: FakeModels) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", fake.chat)
    app.router.add_post("/v1/images/generations", fake.images)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
    finally:
        await runner.cleanup()


ToolFn = Callable[..., Awaitable[str]]


def call(
    tool: ToolFn,
    toolset: str,
    args: dict[str, Any],
    scratch: Path,
    fake: FakeModels,
    model: str = "m1",
    **extra: Any,
) -> dict[str, Any]:
    """Run ``tool`` with its toolset pointed at a fresh fake server."""

    async def scenario() -> dict[str, Any]:
        async with serve(fake) as base:
            options = {"model": model, "base_url": base, "api_key_env": "SVC_KEY",
                       "max_retries": 0, **extra}  # fmt: skip
            settings = ToolSettings(options={toolset: options}, env={"SVC_KEY": KEY})
            ctx = ToolContext(task_id="t", scratch_dir=scratch, settings=settings)
            return json.loads(await tool(args, ctx=ctx, task_id="t"))

    return asyncio.run(scenario())


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    path = tmp_path / "scratch"
    path.mkdir()
    return path


# -- vision -----------------------------------------------------------------------------


def test_vision_passes_a_web_url_through(scratch: Path) -> None:
    fake = FakeModels()
    args = {"image_url": "https://example.com/cat.png", "question": "What animal?"}
    result = call(vision_analyze, "vision", args, scratch, fake)
    assert result == {"analysis": "saw https://example.com/cat.png", "model": "m1"}
    [(_, body, auth)] = fake.requests
    assert auth == f"Bearer {KEY}"
    assert body["messages"][0]["content"] == [
        {"type": "text", "text": "What animal?"},
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
    ]


def test_vision_sends_a_scratch_file_inline(scratch: Path) -> None:
    (scratch / "shots").mkdir()
    (scratch / "shots" / "a.png").write_bytes(tiny_png())
    fake = FakeModels()
    result = call(vision_analyze, "vision", {"image_url": "shots/a.png", "question": "q"},
                  scratch, fake)  # fmt: skip
    assert result["analysis"] == "saw data:image/png;base64,iVBORw0K"
    url = fake.requests[0][1]["messages"][0]["content"][1]["image_url"]["url"]
    assert base64.b64decode(url.split(",", 1)[1]) == tiny_png()


def test_vision_refuses_files_outside_scratch_and_non_images(scratch: Path) -> None:
    outside = scratch.parent / "outside.png"
    outside.write_bytes(tiny_png())
    (scratch / "link.png").symlink_to(outside)
    (scratch / "notes.txt").write_text("not an image")
    (scratch / "big.png").write_bytes(tiny_png() + b"\x00" * 5000)
    fake = FakeModels()
    cases = {
        "../outside.png": "outside the scratch directory",
        str(outside): "outside the scratch directory",
        "link.png": "outside the scratch directory",
        "missing.png": "no such file",
        "notes.txt": "not a PNG, JPEG, GIF or WebP image",
        "big.png": "the limit is 1000 bytes",
        "file:///etc/passwd": "http(s) URL or a path",
    }
    for image, expected in cases.items():
        result = call(vision_analyze, "vision", {"image_url": image, "question": "q"}, scratch,
                      fake, max_image_bytes=1000)  # fmt: skip
        assert expected in result["error"], image
    assert fake.requests == []


def test_vision_endpoint_failure_is_an_error(scratch: Path) -> None:
    args = {"image_url": "https://example.com/x.png", "question": "q"}
    result = call(vision_analyze, "vision", args, scratch, FakeModels(), model="bad-vision")
    assert result["error"].startswith("vision model failed: HTTP 500")
    assert KEY not in result["error"]


# -- image generation -------------------------------------------------------------------


def test_image_generate_saves_png_files_in_scratch(scratch: Path) -> None:
    fake = FakeModels()
    args = {"prompt": "a red dot", "size": "512x512"}
    first = call(image_generate, "image_gen", args, scratch, fake, model="img-1")
    second = call(image_generate, "image_gen", args, scratch, fake, model="img-1")
    assert first == {
        "images": [{"path": "images/image_001.png", "bytes": len(tiny_png())}],
        "model": "img-1",
        "revised_prompt": "r",
    }
    assert second["images"][0]["path"] == "images/image_002.png"
    assert (scratch / "images" / "image_001.png").read_bytes() == tiny_png()
    kind, body, auth = fake.requests[0]
    assert kind == "images"
    assert body == {"model": "img-1", "prompt": "a red dot", "size": "512x512", "n": 1}
    assert auth == f"Bearer {KEY}"


def test_image_generate_returns_hosted_urls_and_rejects_bad_data(scratch: Path) -> None:
    hosted = FakeModels([{"url": "https://cdn.example/img.png"}])
    result = call(image_generate, "image_gen", {"prompt": "p"}, scratch, hosted,
                  response_format="url")  # fmt: skip
    assert result["images"] == [{"url": "https://cdn.example/img.png"}]
    assert hosted.requests[0][1]["response_format"] == "url"
    assert hosted.requests[0][1]["size"] == "1024x1024"
    junk = FakeModels([{"b64_json": "!!not base64!!"}])
    result = call(image_generate, "image_gen", {"prompt": "p"}, scratch, junk)
    assert "not valid base64" in result["images"][0]["error"]
    empty = call(image_generate, "image_gen", {"prompt": "p"}, scratch, FakeModels([]))
    assert empty["error"] == "the image endpoint returned no image"
    bad_size = call(image_generate, "image_gen", {"prompt": "p", "size": "9x9"}, scratch,
                    FakeModels())  # fmt: skip
    assert "size must be one of" in bad_size["error"]


# -- availability -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tool", "needles"),
    [
        ("vision_analyze", ("vision.model", "HERMES_VISION_MODEL", "vision.base_url",
                            "HERMES_VISION_BASE_URL", "vision.api_key_env")),
        ("image_generate", ("image_gen.model", "HERMES_IMAGE_MODEL", "image_gen.base_url",
                            "HERMES_IMAGE_BASE_URL")),
    ],
)  # fmt: skip
def test_model_tools_hidden_until_configured(tool: str, needles: tuple[str, ...]) -> None:
    reason = registry.check_availability(tool, ToolSettings(env={})).reason
    for needle in needles:
        assert needle in reason
    prefix = "HERMES_VISION" if tool == "vision_analyze" else "HERMES_IMAGE"
    env = {f"{prefix}_MODEL": "m", f"{prefix}_BASE_URL": "http://127.0.0.1:9/v1"}
    assert registry.check_availability(tool, ToolSettings(env=env)).available
    env[f"{prefix}_API_KEY_ENV"] = "UNSET_KEY_VAR"
    assert "UNSET_KEY_VAR" in registry.check_availability(tool, ToolSettings(env=env)).reason


def test_model_tools_without_configuration_or_context_return_errors(tmp_path: Path) -> None:
    ctx = ToolContext(task_id="t", scratch_dir=tmp_path, settings=ToolSettings(env={}))
    vision = asyncio.run(vision_analyze({"image_url": "https://x/y.png", "question": "q"}, ctx=ctx))
    assert "HERMES_VISION_MODEL" in json.loads(vision)["error"]
    image = asyncio.run(image_generate({"prompt": "p"}, ctx=ctx))
    assert "HERMES_IMAGE_MODEL" in json.loads(image)["error"]
    for tool in (vision_analyze, image_generate):
        assert "episode context" in json.loads(asyncio.run(tool({"prompt": "p"})))["error"]


BROWSER_TOOLS = [
    "browser_navigate",
    "browser_snapshot",
    "browser_click",
    "browser_type",
    "browser_scroll",
    "browser_back",
    "browser_press",
]


def test_browser_tools_say_what_is_missing() -> None:
    reason = registry.check_availability("browser_snapshot", ToolSettings(env={})).reason
    assert "browser.cdp_url" in reason
    assert "BROWSER_CDP_URL" in reason
    assert ("pip install playwright" in reason) is not HAS_PLAYWRIGHT
    with_url = ToolSettings(env={"BROWSER_CDP_URL": "http://127.0.0.1:9222"})
    for name in BROWSER_TOOLS:
        state = registry.check_availability(name, with_url)
        assert state.available is HAS_PLAYWRIGHT
        if not HAS_PLAYWRIGHT:
            assert state.reason == "browser tools need: " + browser_tool._PLAYWRIGHT_HELP


def test_browser_handlers_without_configuration_return_errors(tmp_path: Path) -> None:
    ctx = ToolContext(task_id="t", scratch_dir=tmp_path, settings=ToolSettings(env={}))
    calls = {
        "browser_navigate": {"url": "https://example.com"},
        "browser_snapshot": {},
        "browser_click": {"ref": "e1"},
        "browser_type": {"selector": "#q", "text": "hi"},
        "browser_scroll": {"direction": "down"},
        "browser_back": {},
        "browser_press": {"key": "Enter"},
    }
    for name, args in calls.items():
        handler = getattr(browser_tool, name)
        result = json.loads(asyncio.run(handler(args, ctx=ctx, task_id="t")))
        assert result["error"].startswith(f"{name}: browser tools need:"), name
        assert "BROWSER_CDP_URL" in result["error"]
        assert "episode context" in json.loads(asyncio.run(handler(args)))["error"]
    assert "browser" not in ctx.state  # nothing was started
    bad_scheme = asyncio.run(browser_tool.browser_navigate({"url": "file:///etc/passwd"}, ctx=ctx))
    assert "only opens http" in json.loads(bad_scheme)["error"]
    no_target = asyncio.run(browser_tool.browser_click({}, ctx=ctx))
    assert "ref from browser_snapshot" in json.loads(no_target)["error"]


def test_browser_session_thread_stops_on_close() -> None:
    def session_threads() -> int:
        return sum(t.name == "browser" for t in threading.enumerate())

    before = session_threads()
    state: dict[str, Any] = {}
    state["browser"] = {"t": browser_tool.BrowserSession("http://127.0.0.1:9", 1000)}
    assert session_threads() == before + 1
    browser_tool.close_browser_sessions(state)
    deadline = time.monotonic() + 5
    while session_threads() > before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert session_threads() == before
    assert state == {}
