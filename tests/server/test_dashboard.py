"""The live dashboard in headless Chromium against a real server with traffic."""

from __future__ import annotations

import asyncio
import math
import shutil
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from playwright.sync_api import Page, sync_playwright

from fairlane.config import ServerConfig
from fairlane.server import BackgroundServer, auth_middleware
from tests.server.conftest import TOKEN, server_config
from tests.server.test_chat_api import http

REPORTS = Path(__file__).resolve().parents[2] / "reports"
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync",
]
NOTES = [
    "The boiler is serviced every October; the pressure should read between 1 and 1.5 bar.",
    "Bins: green recycling on Tuesday evenings, black every other Friday.",
]


@pytest.fixture(scope="module")
def busy_server() -> Iterator[BackgroundServer]:
    """A server that has served voice and chat turns and indexed two documents."""
    cfg = server_config()
    with BackgroundServer(cfg) as server:
        for lane in ("voice", "chat", "chat"):
            body = {"messages": [{"role": "user", "content": "Name a colour."}],
                    "max_tokens": 8, "fairlane_class": lane}
            assert http(server, "POST", "/v1/chat/completions", body)[0] == 200
        for note in NOTES:
            assert http(server, "POST", "/v1/documents", {"text": note})[0] == 202
        deadline = time.monotonic() + 120
        while (indexing := http(server, "GET", "/v1/stats")[1]["background"]["indexing"])[
                "chunks_done"] != indexing["chunks_total"]:
            assert time.monotonic() < deadline, f"not indexed: {indexing}"
            time.sleep(0.1)
        yield server


@pytest.fixture(scope="module")
def chromium() -> Iterator[object]:
    executable = shutil.which("chromium") or shutil.which("chromium-browser")
    assert executable, "Chromium is needed: `make test` installs Debian's chromium"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_FLAGS)
        yield browser
        browser.close()


def _open(chromium, url: str) -> Page:
    page = chromium.new_page(viewport={"width": 1280, "height": 860})
    page.goto(url)
    page.wait_for_function("Number(document.body.dataset.polls || 0) >= 2")
    return page


def _ms(value: float | None) -> str:
    """As the page shows it: JavaScript's Math.round rounds halves up (Python's to even)."""
    return "–" if value is None else f"{math.floor(value + 0.5)} ms"


def test_the_dashboard_shows_what_the_stats_say(busy_server, chromium, tmp_path) -> None:
    page = _open(chromium, f"{busy_server.url}/dashboard#token={TOKEN}")
    page.wait_for_selector("[data-field='chat.ttft_p95']")
    stats = http(busy_server, "GET", "/v1/stats")[1]  # no traffic now: the same figures
    for lane in ("voice", "chat", "background"):
        figures = stats["classes"][lane]
        for metric in ("ttft", "itl"):
            for q in ("p50", "p95"):
                shown = page.inner_text(f"[data-field='{lane}.{metric}_{q}']")
                assert shown.startswith(_ms(figures[f"{metric}_ms"][q])), (lane, metric, q)
        assert page.inner_text(f"[data-field='{lane}.waiting']") == str(figures["waiting"])
        assert page.inner_text(f"[data-field='{lane}.running']") == str(figures["running"])
    assert stats["classes"]["voice"]["ttft_ms"]["p95"] is not None  # the voice turn is there
    indexing = stats["background"]["indexing"]
    progress = page.locator("#progress")
    assert progress.get_attribute("data-done") == str(indexing["chunks_done"])
    assert progress.get_attribute("data-total") == str(indexing["chunks_total"]) != "0"
    assert "100%" in progress.inner_text()
    # The cost model's error, per device loop and step kind, as /v1/stats has it.
    errors = stats["prediction_error"]
    assert errors and all(errors.values())
    for device, kinds in errors.items():
        for step, figures in kinds.items():
            shown = page.inner_text(f"[data-field='{device}.{step}.median']")
            assert abs(int(shown.rstrip("%")) - figures["median"] * 100) <= 1, (device, step)
    # The timeline drew the device's steps: some pixels of the chat lane's colour.
    drawn = page.evaluate(
        """() => {
        const c = document.getElementById('timeline');
        const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        let n = 0; for (let i = 0; i < d.length; i += 4) if (d[i + 3] > 0) n++;
        return n; }"""
    )
    assert drawn > 0

    REPORTS.mkdir(exist_ok=True)
    for path in (tmp_path / "dashboard.png", REPORTS / "dashboard.png"):
        page.screenshot(path=str(path), full_page=True)
    assert (REPORTS / "dashboard.png").stat().st_size > 10_000
    page.close()


def test_the_dashboard_updates_without_a_reload(busy_server, chromium) -> None:
    page = _open(chromium, f"{busy_server.url}/#token={TOKEN}")  # "/" is the ingress panel
    before = page.evaluate("window.fairlaneStats.classes.chat.requests")
    body = {"messages": [{"role": "user", "content": "Say yes."}], "max_tokens": 4}
    assert http(busy_server, "POST", "/v1/chat/completions", body)[0] == 200
    page.wait_for_function(f"window.fairlaneStats.classes.chat.requests > {before}")
    page.close()


def test_without_the_token_the_page_says_how_to_give_it(busy_server, chromium) -> None:
    page = chromium.new_page()
    page.goto(f"{busy_server.url}/dashboard")
    page.evaluate("localStorage.clear()")
    page.reload()
    page.wait_for_function("document.getElementById('error').textContent.includes('token')")
    assert "not reachable" in page.inner_text("#status")
    page.close()


def test_stats_readers_may_read_stats_but_nothing_else() -> None:
    async def ok(request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def run(readers: tuple[str, ...]) -> tuple[int, int, int]:
        server = ServerConfig(token="secret", stats_readers=readers)
        app = web.Application(middlewares=[auth_middleware(server)])
        app.router.add_get("/v1/stats", ok)
        app.router.add_post("/v1/chat/completions", ok)
        app.router.add_get("/dashboard", ok)
        async with TestClient(TestServer(app, host="127.0.0.1")) as client:
            stats = (await client.get("/v1/stats")).status
            chat = (await client.post("/v1/chat/completions")).status
            page = (await client.get("/dashboard")).status
        return stats, chat, page

    # In a thread of its own: Playwright's sync API keeps an event loop in this one.
    with ThreadPoolExecutor(1) as pool:
        as_ingress = pool.submit(asyncio.run, run(("127.0.0.1",))).result()
        as_stranger = pool.submit(asyncio.run, run(())).result()
    assert as_ingress == (200, 401, 200)  # as Supervisor's ingress proxy
    assert as_stranger == (401, 401, 200)
