"""The remote lane against engines that are not Fairlane (issue 46): llama.cpp's own OpenAI
server (`python -m llama_cpp.server`, llama-cpp-python's `[server]` extra) on the embedded
model, one or two of them, each its own process; and, for the one thing no engine here can
show (the priority field vLLM and SGLang read), a stand-in that records what it was sent.

Every wait is on state (the lane's figures, a thread's end), never on a sleep."""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fairlane import config
from fairlane.bench.servers import ServerProcess, free_port
from fairlane.engines import models
from fairlane.server import BackgroundServer
from tests.remote.standin import RecordingEngine
from tests.server.conftest import TOKEN, wait_for
from tests.server.test_chat_api import http
from tests.server.test_workers import COUNT, chat, started

pytestmark = pytest.mark.model

LIGHT = {"llm": {"n_ctx": 2048, "n_seq_max": 4, "threads": 1, "max_tokens": 64},
         "wyoming": {"enabled": False}, "stt": {"enabled": False}, "tts": {"enabled": False},
         "embed": {"enabled": False}}
TOOL = {"type": "function", "function": {
    "name": "HassTurnOn", "description": "Turns on a device or entity",
    "parameters": {"type": "object", "properties": {"name": {"type": "string"}},
                   "required": ["name"]}}}


def llama_cpp_server(port: int | None = None) -> ServerProcess:
    """llama-cpp-python's OpenAI server on the embedded model, one thread. It serves one
    request at a time (its own lock), as a household's second box running it would."""
    port = port or free_port()
    argv = [sys.executable, "-m", "llama_cpp.server",
            "--model", str(models.resolve_llm(models.DEFAULT_LLM)),
            "--host", "127.0.0.1", "--port", str(port), "--n_threads", "1",
            "--n_threads_batch", "1", "--n_ctx", "2048",
            "--chat_format", "chatml-function-calling"]
    return ServerProcess(argv, port, env={**os.environ, "OMP_NUM_THREADS": "1"},
                         ready_path="/v1/models")


def local_config(tmp: Path, remotes: list[dict[str, Any]], **sections: Any) -> config.Config:
    return config.parse({"server": {"port": 0, "token": TOKEN, "data_dir": str(tmp)},
                         **LIGHT, "remotes": remotes, **sections})


def remote(name: str, url: str, **lane: Any) -> dict[str, Any]:
    return {"name": name, "url": f"{url}/v1", "classes": ["chat", "background"], **lane}


def stats(server: BackgroundServer, name: str) -> dict[str, Any]:
    return http(server, "GET", "/v1/stats")[1]["remotes"][name]


def direct(url: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
    request = urllib.request.Request(f"{url}/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return dict(json.loads(response.read()))


@pytest.fixture(scope="module")
def engine() -> Iterator[ServerProcess]:
    with llama_cpp_server() as server:
        yield server


@pytest.fixture(scope="module")
def lane(engine: ServerProcess, tmp_path_factory) -> Iterator[BackgroundServer]:
    cfg = local_config(tmp_path_factory.mktemp("local"),
                       [remote("box", engine.url, engine="llama-server", max_in_flight=2)])
    with BackgroundServer(cfg) as server:
        yield server


def test_whole_and_streamed_replies_come_from_llama_cpp_server(lane: BackgroundServer) -> None:
    status, reply = http(lane, "POST", "/v1/chat/completions",
                         chat("background", "docs", "Say hello in one word.", 8))
    assert status == 200, reply
    assert reply["choices"][0]["message"]["content"].strip()
    assert reply["choices"][0]["finish_reason"] in ("stop", "length")
    assert reply["id"].startswith("chatcmpl-")  # this server's id, not the remote's
    thread, out = started(lane.url, chat("chat", "teen", "Say hello in one word.", 8))
    thread.join(120)
    assert out.done and out.error is None and out.text.strip(), out
    figures = stats(lane, "box")
    assert figures["served"] >= 2 and figures["engine"] == "llama-server"
    assert figures["ttft_ms_p50"] is not None and figures["state"] == "closed"


def test_a_tool_call_comes_back_as_the_engine_made_it(lane: BackgroundServer) -> None:
    body = {**chat("chat", "teen", "Turn on the kitchen light.", 48), "tools": [TOOL],
            "tool_choice": {"type": "function", "function": {"name": "HassTurnOn"}}}
    status, reply = http(lane, "POST", "/v1/chat/completions", body)
    assert status == 200, reply
    [call] = reply["choices"][0]["message"]["tool_calls"]
    assert call["function"]["name"] == "HassTurnOn"
    assert "name" in json.loads(call["function"]["arguments"])


def test_a_client_that_leaves_stops_the_remotes_work(
        lane: BackgroundServer, engine: ServerProcess) -> None:
    """The client goes away mid-stream: the lane closes its connection to the remote, and
    llama.cpp's server stops generating (it serves one request at a time, so a reply it kept
    writing, 2,000 tokens of counting, would hold the next request for a minute and more)."""
    body = json.dumps({**chat("background", "docs", COUNT, 2000), "stream": True}).encode()
    with socket.create_connection(("127.0.0.1", lane.port), timeout=120) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Type: application/json\r\n"
                     + f"Authorization: Bearer {TOKEN}\r\nContent-Length: {len(body)}\r\n\r\n"
                       .encode() + body)
        seen = b""
        while b'"content"' not in seen:  # the remote's first tokens came through
            seen += sock.recv(4096)
    wait_for(lambda: stats(lane, "box")["in_flight"] == 0, timeout_s=30)
    reply = direct(engine.url, {"messages": [{"role": "user", "content": "Say yes."}],
                                "max_tokens": 4}, timeout=30)
    assert reply["choices"][0]["message"]["content"] is not None


def test_the_window_follows_the_remotes_time_to_first_token(
        engine: ServerProcess, tmp_path) -> None:
    """A first token later than `window_ttft_ms` halves the window (the remote is queueing,
    not serving): here every first token is later than 1 ms."""
    cfg = local_config(tmp_path, [remote("box", engine.url, max_in_flight=4, window_ttft_ms=1)])
    with BackgroundServer(cfg) as server:
        assert stats(server, "box")["window"] == 4
        status, _ = http(server, "POST", "/v1/chat/completions", chat("background", "d", "Hi.", 4))
        assert status == 200
        assert stats(server, "box")["window"] == 2


def test_a_remote_that_dies_mid_stream_opens_the_breaker_and_local_work_goes_on(
        tmp_path) -> None:
    dying = llama_cpp_server()
    cfg = local_config(tmp_path, [remote("box", dying.url, max_in_flight=1, failures_to_open=1,
                                         open_s=60, timeout_s=20)])
    try:
        with BackgroundServer(cfg) as server:
            thread, out = started(server.url, chat("background", "docs", COUNT, 400))
            wait_for(lambda: out.first_at is not None, timeout_s=120)
            os.kill(dying.process.pid, signal.SIGKILL)
            dying.process.wait()
            thread.join(60)
            assert not thread.is_alive(), "the client was left hanging"
            assert out.error is not None and out.error["code"] == "remote_failed", out
            health = http(server, "GET", "/health")[1]
            assert health["status"] == "degraded" and health["remotes"]["box"]["state"] == "open"
            status, reply = http(server, "POST", "/v1/chat/completions",
                                 chat("background", "d", "Hi.", 4))
            assert status == 503 and reply["error"]["code"] == "remote_unavailable"
            status, voice = http(server, "POST", "/v1/chat/completions",
                                 chat("voice", "kitchen", "Say hello.", 4))
            assert status == 200 and voice["choices"][0]["message"]["content"]
    finally:
        dying.close()


def test_two_remotes_share_the_queue_and_one_killed_moves_its_share_to_the_other(
        tmp_path) -> None:
    """Two boxes, one request at a time each: the queue goes to whichever has room. One is
    killed while requests wait: they go to the other (none fails for want of a remote), and
    only a reply already streaming from the dead one breaks off, with an error."""
    first, second = llama_cpp_server(), llama_cpp_server()
    lanes = [remote("box-a", first.url, max_in_flight=1, failures_to_open=1, open_s=120,
                    timeout_s=20),
             remote("box-b", second.url, max_in_flight=1, failures_to_open=1, open_s=120,
                    timeout_s=20)]
    try:
        with BackgroundServer(local_config(tmp_path, lanes)) as server:
            clients = [started(server.url, chat("background", f"m{i}", "Say a short word.", 12))
                       for i in range(6)]
            wait_for(lambda: stats(server, "box-a")["served"] >= 1
                     and stats(server, "box-b")["served"] >= 1, timeout_s=240)
            wait_for(lambda: stats(server, "box-a")["in_flight"] == 1
                     or all(not t.is_alive() for t, _ in clients), timeout_s=120)
            waiting_then = sum(stats(server, "box-b")["waiting"].values())
            os.kill(first.process.pid, signal.SIGKILL)
            first.process.wait()
            for thread, _ in clients:
                thread.join(240)
                assert not thread.is_alive(), "a client was left hanging"
            outs = [out for _, out in clients]
            failed = [o for o in outs if o.error is not None]
            # At most the one at box-a when it died fails, and only if its reply had begun.
            assert len(failed) <= 1 and all(o.first_at is not None for o in failed), outs
            assert all(o.done and o.text.strip() for o in outs if o.error is None)
            assert stats(server, "box-b")["served"] >= 3 + (waiting_then > 0)
            health = http(server, "GET", "/health")[1]
            assert health["remotes"]["box-a"]["state"] == "open"
            assert health["remotes"]["box-b"]["state"] == "closed"
            # The lane still serves: box-b takes everything now.
            status, _ = http(server, "POST", "/v1/chat/completions",
                             chat("background", "d", "Hi.", 4))
            assert status == 200
    finally:
        first.close()
        second.close()


@pytest.mark.parametrize(("engine_name", "expected"),
                         [("vllm", {"voice": 0, "chat": 1, "background": 2}),
                          ("sglang", {"voice": 2, "chat": 1, "background": 0}),
                          ("openai", {"voice": None, "chat": None, "background": None})])
def test_each_class_is_sent_as_the_engines_own_priority(
        engine_name: str, expected: dict[str, int | None], tmp_path) -> None:
    """vLLM serves lower `priority` values first, SGLang higher ones (its default): a lane
    that declares its engine sends each request's class in the engine's own terms, so the
    remote's batch orders voice > chat > background too; other engines get no field."""
    with RecordingEngine() as standin:
        cfg = local_config(tmp_path, [{"name": "gpu", "url": standin.url, "engine": engine_name,
                                       "classes": ["voice", "chat", "background"]}])
        with BackgroundServer(cfg) as server:
            for label in ("voice", "chat", "background"):
                # The client's own `priority` (vLLM's scale here) is this server's to read.
                body = {**chat(label, "m", "Hi.", 4), "priority": 7}
                status, reply = http(server, "POST", "/v1/chat/completions", body)
                assert status == 200 and reply["choices"][0]["message"]["content"] == "Done."
    got = {h["X-Fairlane-Class"]: b.get("priority")
           for h, b in zip(standin.headers, standin.bodies, strict=True)}
    assert got == expected
    assert all("fairlane_class" not in b for b in standin.bodies)


def test_the_lane_reports_each_remote_and_its_shared_queue(tmp_path) -> None:
    with RecordingEngine() as a, RecordingEngine() as b:
        cfg = local_config(tmp_path, [remote("a", a.url.removesuffix("/v1")),
                                      remote("b", b.url.removesuffix("/v1"))])
        with BackgroundServer(cfg) as server:
            for i in range(4):
                status, _ = http(server, "POST", "/v1/chat/completions",
                                 chat("background", f"m{i}", "Hi.", 4))
                assert status == 200
            figures = http(server, "GET", "/v1/stats")[1]["remotes"]
            assert set(figures) == {"a", "b"}
            assert figures["a"]["served"] + figures["b"]["served"] == 4
            assert figures["a"]["waiting"] == figures["b"]["waiting"]  # one queue


def test_a_remote_that_fails_before_its_first_token_hands_the_request_to_another(
        tmp_path) -> None:
    """Failover: the lane's first remote is down (nothing listens on its port); the request it
    failed before any output goes to the other remote, and the client gets its answer, not an
    error. The failure still counts against the dead remote's breaker."""
    with RecordingEngine() as alive:
        cfg = local_config(tmp_path, [remote("dead", f"http://127.0.0.1:{free_port()}"),
                                      remote("alive", alive.url.removesuffix("/v1"))])
        with BackgroundServer(cfg) as server:
            status, reply = http(server, "POST", "/v1/chat/completions",
                                 chat("background", "m", "Hi.", 4))
            assert status == 200, reply
            assert reply["choices"][0]["message"]["content"] == "Done."
            figures = http(server, "GET", "/v1/stats")[1]["remotes"]
            assert figures["dead"]["failed"] == 1 and figures["dead"]["served"] == 0
            assert figures["alive"]["served"] == 1 and len(alive.bodies) == 1


def test_a_summary_whose_remote_is_down_is_made_on_another(tmp_path) -> None:
    """A summary job (the server's own background work) on a lane whose first remote is down
    is made on the other one at once, not left pending for the worker's back-off."""
    with RecordingEngine() as alive:
        cfg = local_config(tmp_path, [remote("dead", f"http://127.0.0.1:{free_port()}"),
                                      remote("alive", alive.url.removesuffix("/v1"))],
                           embed={"enabled": True, "threads": 1})  # the document store's
        with BackgroundServer(cfg) as server:
            status, job = http(server, "POST", "/v1/summaries", {
                "text": "The car insurance renews in June; the premium rises to 640 euros.",
                "max_words": 20})
            assert status == 202, job
            done = wait_for(lambda: (s := http(server, "GET", f"/v1/summaries/{job['id']}")[1])[
                "status"] != "pending" and s, timeout_s=120)
            assert done["status"] == "done" and done["result"] == "Done.", done
            figures = http(server, "GET", "/v1/stats")[1]["remotes"]
            # Once: the summary went on to the other remote at once (before, the worker's
            # retries went back to the dead one until its breaker opened, three failures).
            assert figures["dead"]["failed"] == 1 and figures["alive"]["served"] == 1
