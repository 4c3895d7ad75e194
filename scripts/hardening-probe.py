"""Review 39cbe61's reproducers against a real server, each beside another client's chat.

Starts the server in this process (default model, CPU). For each case it sends the
reproducer and, at the same time, a neighbour's short chat turns one after another until the
reproducer is answered (at least NEIGHBOUR_TURNS); beside each case, the same turns with nothing
else running. Rounds alternate quiet, case, quiet, case (A B A B), ROUNDS times. It prints what
each reproducer got (status, code, seconds) and the neighbour's turn time (median, max) quiet
and beside it, with the ratio, and /health's slowest answer while it ran.

Usage: .venv/bin/python scripts/hardening-probe.py [--rounds N] [--json FILE]
Time nothing else while it runs: it is a measurement (about 5 minutes).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.server.conftest import TOKEN, server_config

from fairlane.server import BackgroundServer

NEIGHBOUR_TURNS = 3
NEIGHBOUR = {"messages": [{"role": "user", "content": "Name a fruit."}], "max_tokens": 12,
             "temperature": 0}


def schema_body(schema: dict[str, Any], content: str = "Say hello.") -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": content}], "max_tokens": 80,
            "temperature": 0,
            "response_format": {"type": "json_schema", "json_schema": {"schema": schema}}}


def tool_body(parameters: dict[str, Any]) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": "Take a note."}], "max_tokens": 80,
            "temperature": 0, "tool_choice": "required",
            "tools": [{"type": "function",
                       "function": {"name": "note", "parameters": parameters}}]}


OPTIONAL_950 = {"type": "object", "properties": {f"p{i}": {"type": "integer"}
                                                 for i in range(950)}}
CASES: dict[str, list[dict[str, Any]]] = {
    "1 nested pattern {0,10}^3": [schema_body({"type": "object", "required": ["s"], "properties": {
        "s": {"type": "string", "pattern": "^((a{0,10}){0,10}){0,10}a{60}$"}}})],
    "1 tool parameter {0,30}^2": [tool_body({"type": "object", "properties": {
        "s": {"type": "string", "pattern": "^(a{0,30}){0,30}a{60}$"}}})],
    "1 64 ambiguous patterns (runtime budget)": [schema_body({"anyOf": [
        {"type": "string", "pattern": f"^(a{{0,10}}){{0,10}}a{{{60 + i}}}$"}
        for i in range(64)]})],
    "2 950 optional properties x8": [schema_body(OPTIONAL_950)] * 8,
    "3 boolean sub-schema": [schema_body({"type": "object", "properties": {"a": True}})],
    "3 allOf [[1]]": [schema_body({"allOf": [[1]]})],
    "4 emoji enum": [schema_body({"type": "object", "required": ["vote"], "properties": {
        "vote": {"enum": ["\U0001F44D", "\U0001F44E"]}}}, "Do you like tea? Vote.")],
}


def post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any], float]:
    request = urllib.request.Request(
        f"{url}/v1/chat/completions", json.dumps(body).encode(),
        {"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"})
    start = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=900) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as err:
        status, raw = err.code, err.read()
    return status, json.loads(raw), time.perf_counter() - start


def health_worst(url: str, stop: threading.Event) -> float:
    worst = 0.0
    while not stop.is_set():
        start = time.perf_counter()
        urllib.request.urlopen(f"{url}/health", timeout=900).read()
        worst = max(worst, time.perf_counter() - start)
        stop.wait(0.1)
    return worst


def neighbour(url: str, until: Callable[[], bool]) -> list[float]:
    times = []
    while len(times) < NEIGHBOUR_TURNS or not until():
        status, _, took = post(url, NEIGHBOUR)
        assert status == 200
        times.append(took)
    return times


def run_case(url: str, bodies: list[dict[str, Any]] | None) -> dict[str, Any]:
    stop = threading.Event()
    with ThreadPoolExecutor(len(bodies or []) + 2) as pool:
        health = pool.submit(health_worst, url, stop)
        sent = [pool.submit(post, url, body) for body in bodies or []]
        turns = neighbour(url, lambda: all(f.done() for f in sent))
        answers = [f.result() for f in sent]
        stop.set()
        worst_health = health.result()
    return {
        "neighbour_s": turns,
        "health_worst_s": worst_health,
        "answers": [
            {"status": status, "code": (reply.get("error") or {}).get("code"),
             "message": (reply.get("error") or {}).get("message", "")[:120],
             "content": reply["choices"][0]["message"].get("content") if status == 200 else None,
             "seconds": took}
            for status, reply, took in answers
        ],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json")
    args = parser.parse_args()
    results: dict[str, Any] = {}
    cfg = server_config()
    with BackgroundServer(cfg) as server:
        post(server.url, NEIGHBOUR)  # warm-up: the same for every case
        for name, bodies in CASES.items():
            rounds = []
            for _ in range(args.rounds):  # A B A B
                rounds.append({"quiet": run_case(server.url, None),
                               "case": run_case(server.url, bodies)})
            results[name] = rounds
            quiet = [t for r in rounds for t in r["quiet"]["neighbour_s"]]
            beside = [t for r in rounds for t in r["case"]["neighbour_s"]]
            answers = [a for r in rounds for a in r["case"]["answers"]]
            statuses = sorted({f"{a['status']} {a['code'] or ''}".strip() for a in answers})
            print(
                f"| {name} | {', '.join(statuses)} | "
                f"{statistics.median(a['seconds'] for a in answers):.2f} s | "
                f"{statistics.median(quiet):.2f} / {max(quiet):.2f} s | "
                f"{statistics.median(beside):.2f} / {max(beside):.2f} s | "
                f"{statistics.median(beside) / statistics.median(quiet):.2f}x | "
                f"{max(r['case']['health_worst_s'] for r in rounds) * 1000:.0f} ms |",
                flush=True,
            )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
