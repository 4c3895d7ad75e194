"""`fairlane bench host`: the device loop's own time per step while N streams decode.

A decode iteration of an 8B model on a GPU takes a few milliseconds; whatever the loop does
around it in Python (planning, filling llama.cpp's batch, sampling, applying the outputs,
handing tokens to the HTTP streams) is time the GPU waits. This bench runs the real server
(HTTP streaming included) with N closed-loop streaming clients and reads what every step
recorded (`/v1/stats` `host_overhead`): the host's milliseconds per step beside the device
call's. With a model so small that its device work is tiny (`scripts/random-gguf.py --shape
tiny`), what is left is the host's work; on a CPU the clients share the cores with the server,
which the figures include.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
import urllib.request
from typing import Any

from fairlane.bench.llm import _unique
from fairlane.bench.servers import StreamTiming, fairlane_server, stream_chat
from fairlane.runtime.overhead import batch_label

PROMPT = [{"role": "user", "content": "Count slowly from one to one hundred, in words."}]
GOALS_MS = {8: 0.5, 32: 1.0}  # issue 29: host time per iteration


def _closed_loop(url: str, stop: threading.Event, done: list[StreamTiming], tokens: int) -> None:
    while not stop.is_set():
        done.append(stream_chat(url, _unique(PROMPT), tokens, stop=stop))


def _stats(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{url}/v1/stats", timeout=30) as response:
        return dict(json.loads(response.read()))


def one_run(
    streams: int, seconds: float, threads: int, model: str | None, tokens: int, gpu_layers: int = 0
) -> dict[str, Any]:
    """One server, `streams` clients for `seconds`: the host figures at that batch size."""
    llm: dict[str, Any] = {"n_ctx": max(8192, streams * (tokens + 128)), "gpu_layers": gpu_layers}
    if model:
        llm["model"] = model
    off = {"enabled": False}
    extra = {"llm": llm, "stt": off, "tts": off, "embed": off}
    with fairlane_server("fairlane", threads, streams, extra) as server:
        warm = [threading.Thread(target=stream_chat, args=(server.url, _unique(PROMPT), 4))
                for _ in range(streams)]
        for thread in warm:
            thread.start()
        for thread in warm:
            thread.join()
        stop = threading.Event()
        done: list[StreamTiming] = []
        clients = [
            threading.Thread(target=_closed_loop, args=(server.url, stop, done, tokens))
            for _ in range(streams)
        ]
        began = time.monotonic()
        for thread in clients:
            thread.start()
        time.sleep(seconds)
        stop.set()
        for thread in clients:
            thread.join()
        elapsed = time.monotonic() - began
        stats = _stats(server.url)
    groups: dict[str, Any] = next(iter(stats["host_overhead"].values()), {})
    at_size = groups.get(f"llm:{batch_label(streams)}", {})
    tokens_out = sum(len(t.token_times) for t in done)
    return {
        "streams": streams,
        "iterations": at_size.get("steps", 0),
        "host_ms_p50": at_size.get("host_ms_p50"),
        "host_ms_p95": at_size.get("host_ms_p95"),
        "device_ms_p50": at_size.get("device_ms_p50"),
        "host_share": at_size.get("host_share"),
        "client_tok_s": round(tokens_out / elapsed, 1),
        "groups": groups,
    }


def host_overhead(
    streams: list[int],
    seconds: float,
    threads: int,
    model: str | None,
    rounds: int = 2,
    tokens: int = 64,
    gpu_layers: int = 0,
) -> list[dict[str, Any]]:
    """Every stream count once a round (rounds repeated, not the best kept); prints a table."""
    rows = []
    for round_index in range(1, rounds + 1):
        for count in streams:
            row = {
                "round": round_index,
                **one_run(count, seconds, threads, model, tokens, gpu_layers),
            }
            rows.append(row)
            print(
                f"  round {round_index}, {count} streams: host {row['host_ms_p50']} ms p50 a step "
                f"over {row['iterations']} steps",
                flush=True,
            )
    print(
        f"\nhost time per LLM step at N decoding streams ({threads} engine threads, "
        f"model {model or 'default'}, {seconds:.0f} s a run, {rounds} rounds)"
    )
    print(
        f"{'streams':>8}{'round':>6}{'steps':>7}{'host p50':>10}{'host p95':>10}"
        f"{'device p50':>12}{'host share':>12}{'tok/s':>8}"
    )
    for row in rows:
        print(
            f"{row['streams']:>8}{row['round']:>6}{row['iterations']:>7}"
            f"{_f(row['host_ms_p50']):>10}{_f(row['host_ms_p95']):>10}"
            f"{_f(row['device_ms_p50']):>12}{_f(row['host_share']):>12}{row['client_tok_s']:>8}"
        )
    for count in streams:
        medians = [r["host_ms_p50"] for r in rows if r["streams"] == count and r["host_ms_p50"]]
        if not medians:
            continue
        goal = GOALS_MS.get(count)
        verdict = ""
        if goal is not None:
            verdict = f"; goal ≤ {goal} ms: {'met' if max(medians) <= goal else 'MISSED'}"
        print(
            f"{count:>8} streams: host p50 {min(medians):.3f}–{max(medians):.3f} ms "
            f"(median {statistics.median(medians):.3f}){verdict}"
        )
    return rows


def _f(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}" if value < 10 else f"{value:.1f}"
