"""web_search and web_extract against real loopback HTTP servers (aiohttp.web)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tools.html_text import html_to_text
from tools.registry import registry
from tools.settings import ToolContext, ToolSettings
from tools.web_tools import FetchError, validate_url, web_extract, web_search

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@contextlib.asynccontextmanager
async def serve(routes: Mapping[str, Handler]) -> AsyncIterator[str]:
    """An aiohttp server on 127.0.0.1:<free port> in the running loop; yields its base URL."""
    app = web.Application()
    for path, handler in routes.items():
        app.router.add_route("*", path, handler)
    # shutdown_timeout: a deliberately slow handler must not hold up the teardown.
    runner = web.AppRunner(app, shutdown_timeout=0.2)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def make_ctx(
    tmp_path: Path,
    options: dict[str, dict[str, Any]] | None = None,
    env: dict[str, str] | None = None,
    max_result_chars: int = 100_000,
) -> ToolContext:
    settings = ToolSettings(options=options or {}, env=env or {})
    scratch = tmp_path / "scratch"
    scratch.mkdir(exist_ok=True)
    return ToolContext(
        task_id="t1", scratch_dir=scratch, settings=settings, max_result_chars=max_result_chars
    )


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_search(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    return json.loads(asyncio.run(web_search(args, ctx=ctx, task_id=ctx.task_id)))


# -- web_search -------------------------------------------------------------------------


def test_searxng_query_arrives_and_results_are_mapped(tmp_path: Path) -> None:
    seen: list[dict[str, str]] = []

    async def search(request: web.Request) -> web.Response:
        seen.append(dict(request.query))
        items = [
            {"title": f"T{i}", "url": f"https://e.com/{i}", "content": f"snippet {i}"}
            for i in range(4)
        ]
        return web.json_response({"query": request.query["q"], "results": items})

    async def scenario() -> dict[str, Any]:
        async with serve({"/search": search}) as base:
            ctx = make_ctx(tmp_path, {"web": {"searxng_url": base + "/"}})
            return json.loads(await web_search({"query": "café & tea", "max_results": 2}, ctx=ctx))

    result = asyncio.run(scenario())
    assert seen == [{"q": "café & tea", "format": "json"}]
    assert result["backend"] == "searxng"
    assert result["results"] == [
        {"title": "T0", "url": "https://e.com/0", "snippet": "snippet 0"},
        {"title": "T1", "url": "https://e.com/1", "snippet": "snippet 1"},
    ]


def test_tavily_gets_key_header_and_body(tmp_path: Path) -> None:
    seen: list[tuple[str | None, Any]] = []

    async def search(request: web.Request) -> web.Response:
        seen.append((request.headers.get("Authorization"), await request.json()))
        return web.json_response(
            {"results": [{"title": "A", "url": "https://a.io", "content": "alpha", "score": 0.9}]}
        )

    async def scenario() -> dict[str, Any]:
        async with serve({"/search": search}) as base:
            ctx = make_ctx(
                tmp_path, {"web": {"tavily_url": base + "/search"}}, {"TAVILY_API_KEY": "tvly-k1"}
            )
            return json.loads(await web_search({"query": "q1", "max_results": 50}, ctx=ctx))

    result = asyncio.run(scenario())
    assert seen == [("Bearer tvly-k1", {"query": "q1", "max_results": 20})]
    assert result == {
        "results": [{"title": "A", "url": "https://a.io", "snippet": "alpha"}],
        "backend": "tavily",
    }


def test_brave_gets_subscription_token_and_markup_is_stripped(tmp_path: Path) -> None:
    seen: list[tuple[str | None, dict[str, str]]] = []

    async def search(request: web.Request) -> web.Response:
        seen.append((request.headers.get("X-Subscription-Token"), dict(request.query)))
        item = {"title": "B", "url": "https://b.io", "description": "the <strong>best</strong> one"}
        return web.json_response({"web": {"results": [item]}})

    async def scenario() -> dict[str, Any]:
        async with serve({"/res/v1/web/search": search}) as base:
            options = {"web": {"brave_url": base + "/res/v1/web/search"}}
            ctx = make_ctx(tmp_path, options, {"BRAVE_API_KEY": "brave-k2"})
            return json.loads(await web_search({"query": "q2"}, ctx=ctx))

    result = asyncio.run(scenario())
    assert seen == [("brave-k2", {"q": "q2", "count": "5"})]
    assert result["backend"] == "brave"
    assert result["results"] == [{"title": "B", "url": "https://b.io", "snippet": "the best one"}]
    assert "brave-k2" not in json.dumps(result)


def test_backend_option_forces_a_configured_backend(tmp_path: Path) -> None:
    async def tavily(request: web.Request) -> web.Response:
        return web.json_response({"results": []})

    async def scenario() -> dict[str, Any]:
        async with serve({"/search": tavily}) as base:
            options = {
                "web": {
                    "searxng_url": "http://127.0.0.1:9",
                    "tavily_url": base + "/search",
                    "backend": "tavily",
                }
            }
            ctx = make_ctx(tmp_path, options, {"TAVILY_API_KEY": "k"})
            return json.loads(await web_search({"query": "x"}, ctx=ctx))

    assert asyncio.run(scenario()) == {"results": [], "backend": "tavily"}


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (500, "upstream exploded badly", "searxng answered HTTP 500"),
        (200, "<html>not json at all</html>", "searxng returned a body that is not JSON"),
        (403, "Forbidden", "search.formats"),
    ],
)
def test_backend_errors_become_error_results(
    tmp_path: Path, status: int, body: str, expected: str
) -> None:
    async def search(request: web.Request) -> web.Response:
        return web.Response(status=status, text=body, content_type="text/html")

    async def scenario() -> dict[str, Any]:
        async with serve({"/search": search}) as base:
            ctx = make_ctx(tmp_path, {"web": {"searxng_url": base}})
            return json.loads(await web_search({"query": "x"}, ctx=ctx))

    result = asyncio.run(scenario())
    assert expected in result["error"]
    assert result["status"] == status
    assert body[:10] in result["body"]


def test_search_connection_refused_is_an_error(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path, {"web": {"searxng_url": f"http://127.0.0.1:{closed_port()}"}})
    result = run_search(ctx, {"query": "x"})
    assert result["error"].startswith("search request failed: ClientConnectorError")


def test_search_argument_errors(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path, {"web": {"searxng_url": "http://127.0.0.1:9"}})
    assert "non-empty" in run_search(ctx, {"query": "  "})["error"]
    assert "integer" in run_search(ctx, {"query": "x", "max_results": "many"})["error"]
    no_ctx = json.loads(asyncio.run(web_search({"query": "x"})))
    assert "episode context" in no_ctx["error"]


def test_web_search_hidden_until_a_backend_is_configured() -> None:
    reason = registry.check_availability("web_search", ToolSettings(env={})).reason
    for needle in ("web.searxng_url", "SEARXNG_URL", "TAVILY_API_KEY", "BRAVE_API_KEY"):
        assert needle in reason
    forced = ToolSettings(options={"web": {"backend": "brave"}}, env={})
    assert "BRAVE_API_KEY" in registry.check_availability("web_search", forced).reason
    bogus = ToolSettings(options={"web": {"backend": "bing"}}, env={})
    assert "searxng, tavily, brave" in registry.check_availability("web_search", bogus).reason
    configured = ToolSettings(env={"SEARXNG_URL": "http://127.0.0.1:9"})
    assert registry.check_availability("web_search", configured).available


# -- web_extract ------------------------------------------------------------------------

PAGE = """<!doctype html><html><head><title>Test  Page</title>
<style>body { color: red }</style><script>var secret = "do not show";</script></head>
<body><nav><a href="/">Home</a> | <a href="/about">About</a></nav>
<h1>Main heading</h1><p>First paragraph with a <a href="/x">useful link</a>.</p>
<p>Second   paragraph,
spread over lines.</p><noscript>enable js</noscript></body></html>"""


def extract(
    ctx: ToolContext, urls: list[str], routes: Mapping[str, Handler] | None = None
) -> list[dict[str, Any]]:
    """Serve ``routes`` and run web_extract on ``urls`` (``{base}`` is the server's URL)."""

    async def scenario() -> dict[str, Any]:
        async with serve(routes or {}) as base:
            args = {"urls": [u.format(base=base) for u in urls]}
            return json.loads(await web_extract(args, ctx=ctx, task_id=ctx.task_id))

    return list(asyncio.run(scenario())["results"])


def loopback_ctx(tmp_path: Path, max_result_chars: int = 100_000) -> ToolContext:
    return make_ctx(tmp_path, {"web": {"allow_private_networks": True}}, {}, max_result_chars)


def test_extract_html_drops_scripts_and_keeps_readable_text(tmp_path: Path) -> None:
    async def page(request: web.Request) -> web.Response:
        return web.Response(text=PAGE, content_type="text/html")

    [entry] = extract(loopback_ctx(tmp_path), ["{base}/page"], {"/page": page})
    assert entry["title"] == "Test Page"
    assert entry["content"] == (
        "# Main heading\n\nFirst paragraph with a useful link.\n\n"
        "Second paragraph, spread over lines."
    )
    for hidden in ("secret", "color", "Home", "enable js"):
        assert hidden not in entry["content"]


def test_extract_follows_redirects_and_stops_loops(tmp_path: Path) -> None:
    async def hop(request: web.Request) -> web.Response:
        raise web.HTTPFound("/final")

    async def final(request: web.Request) -> web.Response:
        return web.Response(text="<title>Done</title><p>arrived</p>", content_type="text/html")

    async def loop(request: web.Request) -> web.Response:
        raise web.HTTPFound("/loop")

    routes = {"/hop": hop, "/final": final, "/loop": loop}
    redirected, looping = extract(loopback_ctx(tmp_path), ["{base}/hop", "{base}/loop"], routes)
    assert redirected["title"] == "Done"
    assert redirected["content"] == "arrived"
    assert redirected["final_url"].endswith("/final")
    assert looping["error"] == "more than 5 redirects"


def test_extract_stops_reading_at_the_download_cap(tmp_path: Path) -> None:
    async def big(request: web.Request) -> web.Response:
        return web.Response(body=b"a" * (3 * 1024 * 1024), content_type="text/plain")

    ctx = loopback_ctx(tmp_path, max_result_chars=10_000_000)
    [entry] = extract(ctx, ["{base}/big"], {"/big": big})
    assert entry["download_truncated"] is True
    assert len(entry["content"]) == 2 * 1024 * 1024


def test_extract_fits_content_into_the_result_budget(tmp_path: Path) -> None:
    async def long(request: web.Request) -> web.Response:
        return web.Response(text="word " * 20_000, content_type="text/plain")

    [entry] = extract(loopback_ctx(tmp_path, max_result_chars=2_000), ["{base}/l"], {"/l": long})
    assert len(entry["content"]) <= 2_000
    assert entry["omitted_chars"] > 90_000
    assert "truncated" in entry["content"]


def test_extract_plain_text_binary_and_bad_encodings(tmp_path: Path) -> None:
    async def plain(request: web.Request) -> web.Response:
        return web.Response(text="just <b>text</b>\nline 2", content_type="text/plain")

    async def invalid_utf8(request: web.Request) -> web.Response:
        body = b"<p>ok \xff\xfe broken</p>"
        return web.Response(body=body, headers={"Content-Type": "text/html; charset=utf-8"})

    async def latin1(request: web.Request) -> web.Response:
        return web.Response(body="<p>café</p>".encode("latin-1"), content_type="text/html",
                            charset="iso-8859-1")  # fmt: skip

    async def binary(request: web.Request) -> web.Response:
        return web.Response(body=b"\x00\x01\x02" * 100, content_type="application/octet-stream")

    async def image(request: web.Request) -> web.Response:
        return web.Response(body=b"\x89PNG\r\n\x1a\n", content_type="image/png")

    routes = {"/plain": plain, "/bad": invalid_utf8, "/latin": latin1, "/bin": binary,
              "/img": image}  # fmt: skip
    urls = ["{base}/plain", "{base}/bad", "{base}/latin", "{base}/bin", "{base}/img"]
    plain_e, bad_e, latin_e, bin_e, img_e = extract(loopback_ctx(tmp_path), urls, routes)
    assert plain_e["content"] == "just <b>text</b>\nline 2"
    assert plain_e["title"] == ""
    assert bad_e["content"] == "ok \ufffd\ufffd broken"
    assert latin_e["content"] == "café"
    assert "application/octet-stream" in bin_e["error"]
    assert "image/png" in img_e["error"]


def test_extract_refuses_other_schemes_and_reports_dead_hosts(tmp_path: Path) -> None:
    async def page(request: web.Request) -> web.Response:
        return web.Response(text="<p>alive</p>", content_type="text/html")

    dead = f"http://127.0.0.1:{closed_port()}/"
    urls = ["file:///etc/passwd", dead, "{base}/ok", "ftp://example.com/x"]
    file_e, dead_e, ok_e, ftp_e = extract(loopback_ctx(tmp_path), urls, {"/ok": page})
    assert file_e == {
        "url": "file:///etc/passwd",
        "error": "only http and https URLs can be fetched, not 'file'",
    }
    assert dead_e["url"] == dead
    assert dead_e["error"].startswith("connection error: ClientConnectorError")
    assert ok_e["content"] == "alive"
    assert "not 'ftp'" in ftp_e["error"]


def test_extract_times_out_slow_pages(tmp_path: Path) -> None:
    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(5)
        return web.Response(text="late")

    options = {"web": {"allow_private_networks": True, "timeout_s": 0.3}}
    [entry] = extract(make_ctx(tmp_path, options), ["{base}/slow"], {"/slow": slow})
    assert entry["error"] == "timed out after 0.3 s"


def test_extract_refuses_private_addresses_unless_allowed(tmp_path: Path) -> None:
    async def page(request: web.Request) -> web.Response:
        return web.Response(text="<p>internal</p>", content_type="text/html")

    ctx = make_ctx(tmp_path)
    [by_ip] = extract(ctx, ["{base}/p"], {"/p": page})
    assert "127.0.0.1 is not a public address" in by_ip["error"]
    assert "allow_private_networks" in by_ip["error"]
    # A name is checked after resolution, so DNS cannot smuggle in a local address.
    [by_name] = extract_localhost(ctx, page)
    assert "localhost resolves only to non-public addresses" in by_name["error"]
    assert "content" not in by_name


def extract_localhost(ctx: ToolContext, handler: Handler) -> list[dict[str, Any]]:
    async def scenario() -> dict[str, Any]:
        async with serve({"/p": handler}) as base:
            url = base.replace("127.0.0.1", "localhost") + "/p"
            return json.loads(await web_extract({"url": url}, ctx=ctx))

    return list(asyncio.run(scenario())["results"])


def test_extract_argument_errors_and_availability(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path)
    too_many = json.loads(asyncio.run(web_extract({"urls": ["http://a.b"] * 6}, ctx=ctx)))
    assert "at most 5" in too_many["error"]
    assert "non-empty" in json.loads(asyncio.run(web_extract({"urls": []}, ctx=ctx)))["error"]
    assert "episode context" in json.loads(asyncio.run(web_extract({"url": "http://a.b"})))["error"]
    assert registry.check_availability("web_extract", ToolSettings(env={})).available
    off = ToolSettings(options={"web": {"extract_enabled": False}}, env={})
    assert "web.extract_enabled" in registry.check_availability("web_extract", off).reason


def test_html_to_text_structure() -> None:
    doc = html_to_text(
        "<html><head><title>T</title></head><body><ul><li>one<li>two</ul>"
        "<pre>  keep\n    indent</pre><table><tr><td>a<td>b</table>x&amp;y<br>z"
        "<svg><title>not the title</title></svg><template>hidden</template>"
    )
    assert doc.title == "T"
    assert doc.text == "- one\n- two\n\n  keep\n    indent\n\na b\n\nx&y\nz"


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254/latest/meta-data/",
        "http://[::1]:8080/",
        "http://[::ffff:127.0.0.1]/",
        "http://10.1.2.3/",
        "http://0.0.0.0/",
    ],
)
def test_internal_addresses_are_refused_before_connecting(url: str) -> None:
    with pytest.raises(FetchError, match="is not a public address"):
        validate_url(url, allow_private=False)
    assert validate_url(url, allow_private=True).scheme == "http"
