"""`fairlane bench speculation`: what a guess sent ahead buys a spoken command, and what a
wrong guess costs.

A voice client that transcribes at the speaker's first pause has the words before the end of
speech is declared: with Whisper on a GPU (tens of ms) about `--lead` seconds before (0.35 s:
Home Assistant's 0.7 s of silence less the integration's 0.3 s pause). On a 2-core CPU Whisper
takes longer than that gap and there is no lead (docs/history/benchmarks.md); the lead here is
what a faster recogniser would give, sent by the clock. Three ways to send one spoken command,
taking turns command by command (plain, guessed, wrong, plain, …):

- `plain`: the turn sent at t;
- `guessed`: the same turn sent as a guess (`fairlane_speculative`) at t - lead, then at t,
  which claims it;
- `wrong`: a guess of other words at t - lead, then the turn at t, which discards it.

Each command is a household device command after a system prompt of devices and tools (held
in the prefix cache, as Home Assistant's is), each naming another device than the one before
it, so every turn finds the same share of its prompt in the cache; each user message ends with
the time, as the integration sends it, so no two prompts are the same. Reported from t: the first
streamed delta (text or a tool call) and the reply's end, p50 / p95, and the ratios to plain.
"""

from __future__ import annotations

import json
import statistics
import time
import urllib.request
from typing import Any

from fairlane.bench.servers import fairlane_server
from fairlane.runtime.metrics import percentile

DEVICES = ["kitchen light", "hall light", "bedroom lamp", "porch light", "fan", "coffee maker",
           "garden lights", "office lamp", "TV", "heater"]
SYSTEM = (
    "You are a voice assistant for Home Assistant. Answer questions about the world truthfully. "
    "Answer in plain text. Keep it simple and to the point.\n"
    "An overview of the areas and the devices in this smart home:\n"
    + "".join(f"- names: {d}\n  domain: switch\n  state: 'off'\n  areas: Home\n" for d in DEVICES)
)
TOOLS = [
    {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": {"name": {"type": "string"}},
                       "required": ["name"]}}}
    for name, description in (("HassTurnOn", "Turns on/opens a device or entity"),
                              ("HassTurnOff", "Turns off/closes a device or entity"))
]
CLIENT = "kitchen-satellite"
WAYS = ("plain", "guessed", "wrong")


def _body(words: str, moment: int) -> dict[str, Any]:
    clock = f"{10 + moment // 3600 % 10:02d}:{moment // 60 % 60:02d}:{moment % 60:02d}"
    content = f"{words}\n\n(Current time is {clock}. Today's date is 2026-12-06.)"
    return {
        "model": "default",
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": content}],
        "tools": TOOLS,
        "max_tokens": 48,
        "temperature": 0,
        "fairlane_class": "voice",
        "user": CLIENT,
        "stream": True,
    }


def _post(url: str, body: dict[str, Any]) -> tuple[float | None, float]:
    """Send a turn; the first streamed delta's and the end's times (monotonic)."""
    request = urllib.request.Request(
        f"{url}/v1/chat/completions", data=json.dumps(body).encode(), method="POST",
        headers={"Content-Type": "application/json"},
    )
    first = None
    with urllib.request.urlopen(request, timeout=600) as response:
        for raw in response:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            choices = json.loads(line[5:]).get("choices") or []
            delta = (choices[0].get("delta") or {}) if choices else {}
            if first is None and (delta.get("content") or delta.get("tool_calls")):
                first = time.monotonic()
    return first, time.monotonic()


def _guess(url: str, body: dict[str, Any]) -> None:
    request = urllib.request.Request(
        f"{url}/v1/chat/completions",
        data=json.dumps({**body, "stream": False, "fairlane_speculative": True}).encode(),
        method="POST", headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=600) as response:
        assert response.status == 202, response.status


def _turn(url: str, way: str, index: int, lead_s: float) -> dict[str, float]:
    """The `index`th turn: each names another device than the turn before it (the prefix cache
    then holds the same share of every turn's prompt), at its own time of day."""
    words = f"Turn on the {DEVICES[index % len(DEVICES)]}."
    body = _body(words, index)
    if way != "plain":
        other = f"Turn off the {DEVICES[(index + 5) % len(DEVICES)]}."
        guessed = time.monotonic()
        _guess(url, body if way == "guessed" else _body(other, index))
        # The lead, from the guess's send to the turn's (the guess's 202 comes within it).
        time.sleep(max(0.0, lead_s - (time.monotonic() - guessed)))
    sent = time.monotonic()
    first, end = _post(url, body)
    return {"first_s": (first or end) - sent, "end_s": end - sent}


def _stats(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{url}/v1/stats", timeout=60) as response:
        return dict(json.loads(response.read()))


def speculation(threads: int, rounds: int, lead_s: float) -> dict[str, Any]:
    """Every turn printed; p50 / p95 per way and the ratios to plain."""
    rows: dict[str, list[dict[str, float]]] = {way: [] for way in WAYS}
    with fairlane_server("fairlane", threads, 4) as server:
        for n, way in enumerate(WAYS):  # equal warm-up (the system prompt enters the cache)
            _turn(server.url, way, 40_000 + n, lead_s)
        for round_ in range(rounds):
            for n, way in enumerate(WAYS):
                row = _turn(server.url, way, round_ * len(WAYS) + n, lead_s)
                rows[way].append(row)
                print(f"round {round_} {way:8s} first {row['first_s']:.3f} s, "
                      f"end {row['end_s']:.3f} s", flush=True)
        counts = _stats(server.url)["speculation"]
    table: dict[str, Any] = {}
    for way, turns in rows.items():
        table[way] = {
            key: {"p50": percentile([t[key] for t in turns], 50),
                  "p95": percentile([t[key] for t in turns], 95),
                  "stdev": statistics.stdev([t[key] for t in turns]) if len(turns) > 1 else 0.0}
            for key in ("first_s", "end_s")
        }
    base = table["plain"]
    print(f"\nlead {lead_s:.2f} s, {rounds} turns each, threads {threads}; from the turn's send:")
    print("| way | first delta p50 / p95 (s) | end p50 / p95 (s) | end stdev (s) | "
          "end p50 / plain |")
    print("|---|---|---|---|---|")
    for way, row in table.items():
        ratio = row["end_s"]["p50"] / base["end_s"]["p50"]
        print(f"| {way} | {row['first_s']['p50']:.3f} / {row['first_s']['p95']:.3f} | "
              f"{row['end_s']['p50']:.3f} / {row['end_s']['p95']:.3f} | "
              f"{row['end_s']['stdev']:.3f} | {ratio:.2f} |")
    print(f"server's speculation counts: {counts}")
    return {"lead_s": lead_s, "rounds": rounds, "threads": threads, "ways": table,
            "speculation": counts, "turns": rows}
