"""What an LLM decode costs right after an embedding step, against what the cost model predicts.

Starts `fairlane serve` (a fresh data directory, Wyoming off) on port 18778 and runs, for
`--seconds` (90): a chat stream every second (60 words in, 80 tokens out), a background summary
back to back (1,000 words in) and an embedding client (16 texts of 150 words a request). It
reads `/v1/stats` every 0.3 s, keeps every step, and prints, for the LLM steps that only decode,
the cost model's error grouped by the step before (and, after an embedding step, by how long
that step ran), then the learned multipliers. Nothing else may run: it is a timing.

Usage: .venv/bin/python scripts/decode-after-other.py [--seconds 90] [-- extra serve args]
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from typing import Any

PORT = 18778
WORDS = ["the", "invoice", "from", "the", "plumber", "says", "the", "boiler", "was", "serviced",
         "and", "the", "kitchen", "tap", "replaced"]


def _request(path: str, body: Any = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        f"http://127.0.0.1:{PORT}{path}", data=data, headers={"Content-Type": "application/json"}
    )
    return urllib.request.urlopen(request, timeout=600)


def _text(words: int) -> str:
    return " ".join(random.choice(WORDS) for _ in range(words))


def _chat(stop: threading.Event, klass: str, words: int, pause_s: float) -> None:
    while not stop.is_set():
        body = {"model": "x", "stream": True, "max_tokens": 80, "fairlane_class": klass,
                "messages": [{"role": "user", "content": f"{random.random()} {_text(words)}"}]}
        with _request("/v1/chat/completions", body) as reply:
            for _ in reply:
                if stop.is_set():
                    break
        stop.wait(pause_s)


def _embed(stop: threading.Event) -> None:
    while not stop.is_set():
        body = {"model": "x", "input": [_text(150) for _ in range(16)],
                "fairlane_class": "background"}
        _request("/v1/embeddings", body).read()


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=90.0)
    args, serve_args = parser.parse_known_args()
    data_dir = tempfile.mkdtemp(prefix="fairlane-decode-")
    server = subprocess.Popen(
        [sys.executable, "-m", "fairlane", "serve", "--port", str(PORT),
         "--set", f"server.data_dir={data_dir}", "--set", "wyoming.enabled=false",
         *[a for a in serve_args if a != "--"]],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    stop = threading.Event()
    try:
        for _ in range(300):
            try:
                _request("/health").read()
                break
            except OSError:
                time.sleep(1)
        load = [threading.Thread(target=_chat, args=(stop, "chat", 60, 1.0), daemon=True),
                threading.Thread(target=_chat, args=(stop, "background", 1000, 0.0), daemon=True),
                threading.Thread(target=_embed, args=(stop,), daemon=True)]
        for thread in load:
            thread.start()
        steps: dict[float, dict[str, Any]] = {}
        end = time.monotonic() + args.seconds
        while time.monotonic() < end:
            for step in json.load(_request("/v1/stats"))["steps"]:
                steps[step["start"]] = step
            time.sleep(0.3)
        fit = json.load(_request("/v1/stats"))["cost_fit"]["llm"]
    finally:
        stop.set()
        server.terminate()
        server.wait()
    ordered = [steps[start] for start in sorted(steps)]
    groups: dict[str, list[tuple[float, float, float]]] = {}
    for before, step in itertools.pairwise(ordered):
        if step["kind"] != "llm" or step["prefill_tokens"] or not step["predicted_ms"]:
            continue
        measured = (step["end"] - step["start"]) * 1000
        before_ms = (before["end"] - before["start"]) * 1000
        key = before["kind"] + (" (prompt)" if before["prefill_tokens"] else "")
        groups.setdefault(key, []).append((before_ms, measured, step["predicted_ms"]))
    print("decode-only LLM steps: |predicted - measured| / measured, by the step before")
    for key, rows in groups.items():
        errors = [abs(p - m) / m for _, m, p in rows]
        print(f"  after {key:14s} n={len(rows):4d}  error p50 {_quantile(errors, 0.5):.0%} "
              f"p95 {_quantile(errors, 0.95):.0%}")
        if key != "embed":
            continue
        rows.sort()
        for part in range(4):
            quarter = rows[part * len(rows) // 4:(part + 1) * len(rows) // 4]
            if quarter:
                print(f"    embedding step {quarter[0][0]:3.0f}-{quarter[-1][0]:3.0f} ms: decode "
                      f"measured p50 {_quantile([r[1] for r in quarter], 0.5):5.1f} ms, "
                      f"predicted p50 {_quantile([r[2] for r in quarter], 0.5):5.1f} ms")
    print("learned multipliers:", fit)
    return 0


if __name__ == "__main__":
    sys.exit(main())
