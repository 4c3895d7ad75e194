"""Rule 10: separate workers. One device loop per device (or named worker), and a lane on
another machine: here a second Fairlane server, started as its own process, serves the remote
lane while this one keeps voice local.

Orders are read from what the servers recorded (step records, first-token times at the
client), and every wait is on state, never on a sleep."""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from fairlane import config
from fairlane.bench.servers import ServerProcess, free_port
from fairlane.policy import Kind, Priority
from fairlane.server import BackgroundServer
from tests.server.conftest import MODEL_WAIT_S, TOKEN, wait_for
from tests.server.test_chat_api import http

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "speech"
REMOTE_TOKEN = "remote-secret"
COUNT = "Count from 1 to 1000, separated by commas."  # a reply that runs to max_tokens
QUIET = {"stt": {"enabled": False}, "tts": {"enabled": False}, "embed": {"enabled": False},
         "wyoming": {"enabled": False}}


def _remote_server(port: int | None = None, embed: bool = False) -> ServerProcess:
    """A second Fairlane on one core: the remote engine (on `port` when it comes back; with
    the embedder for `embed` lanes)."""
    port = port or free_port()
    cfg = {**QUIET, "embed": {"enabled": embed, "threads": 1},
           "server": {"port": port, "token": REMOTE_TOKEN,
                               "data_dir": tempfile.mkdtemp(prefix="fairlane-remote-")},
           "llm": {"threads": 1, "n_seq_max": 4, "n_ctx": 4096}}
    path = Path(tempfile.mkdtemp()) / "remote.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return ServerProcess([sys.executable, "-m", "fairlane", "serve", "--config", str(path)], port)


def _local_config(remote_url: str, tmp: Path, **lane: Any) -> config.Config:
    lane.setdefault("kinds", ["llm"])
    return config.parse({
        "server": {"port": 0, "token": TOKEN, "data_dir": str(tmp)},
        "wyoming": {"enabled": False}, "stt": {"enabled": False}, "tts": {"enabled": False},
        "llm": {"n_ctx": 4096, "n_seq_max": 4, "threads": 1, "max_tokens": 64},
        "remotes": [{"name": "big-box", "url": f"{remote_url}/v1", "token": REMOTE_TOKEN,
                     "classes": ["chat", "background"], **lane}],
    })


@pytest.fixture(scope="module")
def remote() -> Iterator[ServerProcess]:
    with _remote_server(embed=True) as server:
        yield server


@pytest.fixture(scope="module")
def local(remote: ServerProcess, tmp_path_factory) -> Iterator[BackgroundServer]:
    """This server: chat and background LLM work and background embeddings (the document
    index) go to the remote, one request at a time."""
    cfg = _local_config(remote.url, tmp_path_factory.mktemp("local"), max_in_flight=1,
                        kinds=["llm", "embed"])
    with BackgroundServer(cfg) as server:
        yield server


@dataclass
class Streamed:
    """One streamed completion as its client saw it."""

    sent: float = 0.0
    first_at: float | None = None
    text: str = ""
    status: int | None = None
    error: dict[str, Any] | None = None
    done: bool = False
    events: list[dict[str, Any]] = field(default_factory=list)


def stream(url: str, body: dict[str, Any], out: Streamed, timeout: float = MODEL_WAIT_S) -> None:
    request = urllib.request.Request(
        f"{url}/v1/chat/completions", data=json.dumps({**body, "stream": True}).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"})
    out.sent = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            out.status = response.status
            for raw in response:
                line = raw.decode().strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    out.done = True
                    break
                event = json.loads(data)
                out.events.append(event)
                if "error" in event:
                    out.error = event["error"]
                    break
                for choice in event.get("choices") or []:
                    piece = (choice.get("delta") or {}).get("content") or ""
                    if piece and out.first_at is None:
                        out.first_at = time.monotonic()
                    out.text += piece
    except urllib.error.HTTPError as err:
        out.status = err.code
        out.error = json.loads(err.read())["error"]


def started(url: str, body: dict[str, Any]) -> tuple[threading.Thread, Streamed]:
    out = Streamed()
    thread = threading.Thread(target=stream, args=(url, body, out), daemon=True)
    thread.start()
    return thread, out


def chat(lane: str, client: str, content: str, max_tokens: int = 24) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "fairlane_class": lane, "user": client, "temperature": 0}


def lane_stats(server: BackgroundServer) -> dict[str, Any]:
    return http(server, "GET", "/v1/stats")[1]["remotes"]["big-box"]


# --- the remote lane ----------------------------------------------------------------------------


def test_background_goes_to_the_remote_and_voice_is_never_queued_behind_it(
        local: BackgroundServer, remote: ServerProcess) -> None:
    served_before = lane_stats(local)["served"]
    threads = [started(local.url, chat("background", f"member-{i}",
                                       f"{i}: describe a kitchen in detail.", 48))
               for i in range(3)]
    wait_for(lambda: lane_stats(local)["in_flight"] == 1)
    arrival = time.monotonic()
    status, voice = http(local, "POST", "/v1/chat/completions", chat(
        "voice", "kitchen-satellite", "Say hello.", 8))
    assert status == 200 and voice["choices"][0]["message"]["content"]
    for thread, _ in threads:
        thread.join(timeout=300)
    assert all(out.done and out.text for _, out in threads), [o.error for _, o in threads]
    records = local.services.device.records
    # The local device ran the voice turn and never a background step: nothing local waited
    # behind the background work, which the remote served.
    assert any(Priority.VOICE in r.classes and r.start >= arrival for r in records)
    assert not any(Priority.BACKGROUND in r.classes for r in records)
    assert lane_stats(local)["served"] == served_before + 3
    with urllib.request.urlopen(urllib.request.Request(
            f"{remote.url}/v1/stats", headers={"Authorization": f"Bearer {REMOTE_TOKEN}"})) as r:
        remote_stats = json.loads(r.read())
    # The remote was told the class (another Fairlane reads X-Fairlane-Class).
    assert remote_stats["classes"]["background"]["requests"] >= 3
    local_stats = http(local, "GET", "/v1/stats")[1]["classes"]
    assert local_stats["background"]["ttft_ms"]["p50"] is not None  # measured here too


def test_the_lane_orders_by_class_then_by_fairness_within_its_window(
        local: BackgroundServer) -> None:
    """Window 1: the remote holds one request at a time, so first tokens come in the order the
    lane sent them. Alice's burst is queued first, then Bob's one request, then a chat turn:
    the chat turn goes first (class order), and Bob's before Alice's last (VTC)."""
    first = started(local.url, chat("background", "alice", "a1: list ten fruits.", 64))
    wait_for(lambda: lane_stats(local)["in_flight"] == 1)
    queued = []
    for name, lane, client in (("a2", "background", "alice"), ("a3", "background", "alice"),
                               ("b1", "background", "bob"), ("c1", "chat", "carol")):
        before = lane_stats(local)["waiting"][lane]
        queued.append((name, *started(local.url, chat(lane, client, f"{name}: say yes.", 4))))
        wait_for(lambda lane=lane, before=before: lane_stats(local)["waiting"][lane] > before)
    first[0].join(timeout=300)
    for _, thread, _ in queued:
        thread.join(timeout=300)
    assert all(out.done for _, _, out in queued)
    order = [name for name, _, out in sorted(queued, key=lambda q: q[2].first_at)]
    # First come, first served would give a2, a3, b1, c1. Whether Bob's also passes a2 depends
    # on whether a1 was still streaming (charging Alice) after Bob arrived: both are VTC.
    assert order[0] == "c1" and order.index("b1") < order.index("a3"), order


def remote_running(remote: ServerProcess) -> int:
    with urllib.request.urlopen(urllib.request.Request(
            f"{remote.url}/v1/stats", headers={"Authorization": f"Bearer {REMOTE_TOKEN}"})) as r:
        return int(json.loads(r.read())["classes"]["background"]["running"])


def test_cancel_stops_a_remote_stream_at_once_and_takes_a_waiting_one_off_the_queue(
        local: BackgroundServer, remote: ServerProcess) -> None:
    running = started(local.url, chat("background", "a", COUNT, 400))
    wait_for(lambda: running[1].first_at is not None)
    waiting = started(local.url, chat("background", "b", "say yes.", 4))
    wait_for(lambda: lane_stats(local)["waiting"]["background"] == 1)
    # The waiting one first (cancelling the running one would send it to the remote). Its
    # id is this server's and in no event yet: it is the one the lane holds.
    ids = [next(iter(local.services.remotes[0].waiters)),
           next(e["id"] for e in running[1].events if e.get("id"))]
    for completion_id in ids:
        status, reply = http(local, "POST", f"/v1/chat/completions/{completion_id}/cancel")
        assert status == 200 and reply["cancelled"], reply
    for thread, _ in (running, waiting):
        thread.join(timeout=30)
    # Both replies end cleanly: the story stopped long before its 400 tokens, the waiting
    # request is an empty reply. The remote saw the connection close and stopped too.
    assert running[1].done and running[1].events[-1]["choices"][0]["finish_reason"] == "stop"
    assert len(running[1].text) < 400 * 3
    assert waiting[1].done and waiting[1].text == ""
    wait_for(lambda: lane_stats(local)["in_flight"] == 0)
    wait_for(lambda: remote_running(remote) == 0, timeout_s=30)
    assert http(local, "POST", f"/v1/chat/completions/{ids[1]}/cancel")[0] == 404


def test_a_full_lane_queue_is_refused_at_once(remote: ServerProcess, tmp_path) -> None:
    cfg = config.parse({
        "server": {"port": 0, "token": TOKEN, "data_dir": str(tmp_path)},
        "wyoming": {"enabled": False}, "stt": {"enabled": False}, "tts": {"enabled": False},
        "embed": {"enabled": False}, "llm": {"n_ctx": 2048, "threads": 1},
        "policy": {"queue_limit": {"background": 1}},
        "remotes": [{"name": "big-box", "url": f"{remote.url}/v1", "token": REMOTE_TOKEN,
                     "max_in_flight": 1}],
    })
    with BackgroundServer(cfg) as server:
        running = started(server.url, chat("background", "a", "count to twenty.", 48))
        wait_for(lambda: lane_stats(server)["in_flight"] == 1)
        waiting = started(server.url, chat("background", "a", "say yes.", 4))
        wait_for(lambda: lane_stats(server)["waiting"]["background"] == 1)
        status, reply = http(server, "POST", "/v1/chat/completions",
                             chat("background", "b", "say no.", 4))
        assert status == 429 and "queue for big-box is full" in reply["error"]["message"]
        for thread, _ in (running, waiting):
            thread.join(timeout=300)
        assert running[1].done and waiting[1].done


def test_a_summary_job_runs_on_the_remote(local: BackgroundServer) -> None:
    served = lane_stats(local)["served"]
    status, job = http(local, "POST", "/v1/summaries", {
        "text": "The car insurance renews in June; the premium rises to 640 euros.",
        "max_words": 20})
    assert status == 202
    done = wait_for(lambda: (s := http(local, "GET", f"/v1/summaries/{job['id']}")[1])[
        "status"] != "pending" and s, timeout_s=300)
    assert done["status"] == "done" and done["result"]
    assert lane_stats(local)["served"] == served + 1
    assert not any(Priority.BACKGROUND in r.classes and r.kind is Kind.LLM
                   for r in local.services.device.records)


def test_documents_are_embedded_on_the_remote_and_searched_here(
        local: BackgroundServer) -> None:
    served = lane_stats(local)["served"]
    texts = {"bins": "Bin collection: the green bin goes out on Monday night.",
             "vet": "Vet appointment for the cat on Tuesday at 10."}
    ids = {}
    for key, text in texts.items():
        status, body = http(local, "POST", "/v1/documents", {"text": text, "title": key})
        assert status == 202, body
        ids[key] = body["id"]
    for document_id in ids.values():
        wait_for(lambda d=document_id: http(local, "GET", f"/v1/documents/{d}")[1][
            "status"] == "indexed")
    # The search is embedded here (class chat), the index there: the same model, checked
    # once on a probe text before the lane's first vectors were used.
    status, found = http(local, "POST", "/v1/documents/search",
                         {"query": "When do the bins go out?", "top_k": 1})
    assert status == 200 and found["data"][0]["document_id"] == ids["bins"]
    assert local.services.remotes[0].engines[0].same_vectors
    assert lane_stats(local)["served"] > served
    records = local.services.device.records
    assert not any(r.kind is Kind.EMBED and Priority.BACKGROUND in r.classes for r in records)
    assert any(r.kind is Kind.EMBED and Priority.CHAT in r.classes for r in records)
    # OpenAI's embeddings endpoint at class background goes there too, as one request.
    status, body = http(local, "POST", "/v1/embeddings", {"input": ["a", "b", "c"]})
    assert status == 200 and len(body["data"]) == 3 and len(body["data"][0]["embedding"]) == 384


def test_a_remote_killed_mid_stream_fails_every_waiting_client_and_local_lanes_go_on(
        tmp_path) -> None:
    remote = _remote_server()
    port = remote.port
    cfg = _local_config(remote.url, tmp_path, max_in_flight=1, failures_to_open=2, open_s=3,
                        timeout_s=20)
    try:
        with BackgroundServer(cfg) as local:
            clients = [started(local.url, chat("background", f"m{i}", COUNT,
                                               200)) for i in range(3)]
            wait_for(lambda: clients[0][1].first_at is not None or
                     clients[1][1].first_at is not None or clients[2][1].first_at is not None)
            wait_for(lambda: sum(lane_stats(local)["waiting"].values()) == 2)
            os.kill(remote.process.pid, signal.SIGKILL)
            killed_at = time.monotonic()
            remote.process.wait()
            for thread, _ in clients:
                thread.join(timeout=60)
                assert not thread.is_alive(), "a client was left hanging"
            outs = [out for _, out in clients]
            # The one mid-stream gets an error event; the waiting ones an HTTP error, all at
            # once (the breaker opened: nobody waits for a remote that is down).
            assert sum(o.first_at is not None and o.error is not None and not o.done
                       for o in outs) == 1
            assert all(o.error is not None and not o.done for o in outs), outs
            assert all(o.error["code"] in ("remote_failed", "remote_unavailable") for o in outs)
            assert time.monotonic() - killed_at < 20  # well within chat's 30 s waiting limit
            health = http(local, "GET", "/health")[1]
            assert health["status"] == "degraded"
            assert health["remotes"]["big-box"]["state"] == "open"
            status, reply = http(local, "POST", "/v1/chat/completions",
                                 chat("background", "x", "hi", 4))
            assert status == 503 and reply["error"]["code"] == "remote_unavailable"
            # The local lane goes on serving.
            status, voice = http(local, "POST", "/v1/chat/completions",
                                 chat("voice", "kitchen", "Say hello.", 4))
            assert status == 200 and voice["choices"][0]["message"]["content"]
            # The remote comes back on its port: after open_s one probe closes the breaker.
            remote = _remote_server(port)
            wait_for(lambda: http(local, "GET", "/health")[1]["remotes"]["big-box"][
                "state"] == "half-open", timeout_s=30)
            status, reply = http(local, "POST", "/v1/chat/completions",
                                 chat("background", "x", "Say yes.", 4))
            assert status == 200, reply
            assert http(local, "GET", "/health")[1]["status"] == "ok"
    finally:
        remote.close()


def test_a_remote_that_never_answers_times_out_with_a_clear_error(tmp_path) -> None:
    """A remote that accepts the connection and then says nothing (a hung engine)."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    url = f"http://127.0.0.1:{silent.getsockname()[1]}"
    cfg = _local_config(url, tmp_path, timeout_s=2)
    try:
        with BackgroundServer(cfg) as local:
            started_at = time.monotonic()
            status, reply = http(local, "POST", "/v1/chat/completions",
                                 chat("chat", "x", "hello", 4))
            assert status == 504 and reply["error"]["code"] == "remote_timeout"
            assert "sent nothing for 2 s" in reply["error"]["message"]
            assert time.monotonic() - started_at < 30
            assert http(local, "GET", "/health")[1]["remotes"]["big-box"]["failures"] == 1
    finally:
        silent.close()


def test_a_4xx_from_the_remote_is_the_clients_and_does_not_trip_the_breaker(
        local: BackgroundServer) -> None:
    """A prompt longer than the remote's context: the remote's 400, passed on."""
    status, reply = http(local, "POST", "/v1/chat/completions", chat(
        "background", "x", "word " * 5000, 4))
    assert status == 400, reply
    assert "big-box" in reply["error"]["message"] and reply["error"]["code"] == "remote_rejected"
    assert lane_stats(local)["failures"] == 0


# --- one device loop per device ----------------------------------------------------------------


def test_speech_on_its_own_worker_overlaps_the_llm_loop(tmp_path) -> None:
    cfg = config.parse({
        "server": {"port": 0, "token": TOKEN, "data_dir": str(tmp_path)},
        "wyoming": {"enabled": False}, "tts": {"enabled": False}, "embed": {"enabled": False},
        "llm": {"n_ctx": 4096, "threads": 1},
        "stt": {"threads": 1, "worker": "speech"},
    })
    with BackgroundServer(cfg) as server:
        assert set(server.services.device.loops) == {"cpu", "speech"}
        long_prompt = "Summarise the household notes:\n" + "The boiler was serviced. " * 150
        busy = started(server.url, {**chat("background", "docs", long_prompt, 4)})
        wait_for(lambda: any(r.priority is Priority.BACKGROUND
                             for r in server.services.device.policy.running.values()))
        audio = (FIXTURES / "command-05.wav").read_bytes()
        from tests.server.test_speech import post_audio

        status, reply = post_audio(server, {"model": "whisper-base"}, audio)
        busy[0].join(timeout=300)
        assert status == 200 and "door" in reply["text"].lower()
        records = server.services.device.records
        [stt] = [r for r in records if r.kind is Kind.STT]
        llm = [r for r in records if r.kind is Kind.LLM]
        assert stt.device == "speech" and {r.device for r in llm} == {"cpu"}
        # An LLM step ran while the transcription ran: the loops overlap.
        assert any(r.start < stt.end and stt.start < r.end for r in llm)
        devices = http(server, "GET", "/v1/stats")[1]["devices"]
        assert devices["speech"]["kinds"] == ["stt"] and devices["speech"]["busy"] > 0
        assert devices["cpu"]["kinds"] == ["llm"] and devices["cpu"]["busy"] > 0
