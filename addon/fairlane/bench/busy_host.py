"""`fairlane bench busy-host`: what another busy process on the cores costs the person talking.

A Home Assistant host always runs something else (Home Assistant itself, a database, a camera
recorder). Each target is a Fairlane server on the default models; they take turns request by
request (in one order, then the other), quiet and busy alternating round by round (A B A B),
so a slow minute of the machine falls on every target alike. Busy means one neighbour process
spinning on a core for the length of the sample (`while True: pass`, killed after it; at most
10 minutes whatever happens), which is what one busy program does to a 2-core box.

Each sample is:
- **spoken command**: a household command's recording POSTed to /v1/audio/transcriptions as
  `voice`, then its transcript as a streamed `voice` chat turn; the figure is the time from
  sending the audio to the reply's first token (speech recognition + queue + prefill);
- **chat turn**: a typed question streamed as `chat`: time to the first token;
- **long chat turn**: a household note of about 500 tokens to sum up, as `chat`: time to
  the first token, which is mostly prefill (the kind of prompt that timed out in CI).
Every prompt starts with a nonce, so no prefix is cached across samples.

Targets (`--targets`, comma-separated): `spin10k` (what `fairlane serve` does: OpenMP barriers
spin 10,000 rounds, then sleep, and with `llm.give_way` on, as by default, llama.cpp gives a
thread up while a neighbour holds a core), `giveway` (the same, named), `fixed` (the same with
`llm.give_way: false`: two threads always), `spin300k` (libgomp's default, which every earlier
release ran with), `passive` (OMP_WAIT_POLICY=PASSIVE: sleep at once), `threads1` (llama.cpp on
one thread, default spin), and `shell` (a stand-in for the server before it set its own thread
environment: `fairlane serve` from a shell without OMP_NUM_THREADS, libgomp's default spin).
The goal (issue 26): busy at most 2x quiet, p50 and p95.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import yaml

from fairlane.bench.servers import ServerProcess, free_port, post_transcription, stream_chat
from fairlane.runtime import host
from fairlane.runtime.metrics import percentile

TARGETS: dict[str, tuple[dict[str, str], dict[str, Any]]] = {
    # name: (environment over the server's own, config sections)
    "spin10k": ({}, {}),
    "giveway": ({}, {"llm": {"give_way": True}}),
    "fixed": ({}, {"llm": {"give_way": False}}),
    "spin300k": ({"GOMP_SPINCOUNT": "300000"}, {}),
    "passive": ({"OMP_WAIT_POLICY": "PASSIVE"}, {}),
    "threads1": ({"GOMP_SPINCOUNT": "300000"}, {"llm": {"threads": 1}}),
    "shell": ({"GOMP_SPINCOUNT": "300000"}, {}),  # and fairlane.runtime.host skipped: see _server
}
# The server started without its own thread settings, as from a shell before they existed.
WITHOUT_HOST = (
    "import sys\nfrom fairlane import cli\nfrom fairlane.runtime import host\n"
    "host.configure = lambda environ=None: {}\n"
    "sys.exit(cli.main(sys.argv[1:]))\n"
)
# Busy until killed, for 10 minutes at most, and never beyond the bench (its parent).
NEIGHBOUR = (
    "import os, time\nparent, end = os.getppid(), time.time() + 600\n"
    "while time.time() < end and os.getppid() == parent:\n    pass\n"
)
QUESTIONS = (
    "What is a good name for a cat?",
    "Give me one tip for sleeping better.",
    "What should I cook with rice and eggs?",
    "How long should I boil an egg?",
)


def _server(name: str) -> ServerProcess:
    env_over, sections = TARGETS[name]
    port = free_port()
    cfg: dict[str, Any] = {
        "server": {"port": port, "data_dir": tempfile.mkdtemp(prefix="fairlane-busy-")},
        "wyoming": {"enabled": False},
        **sections,
    }
    path = Path(tempfile.mkdtemp()) / "fairlane.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    env.update(env_over)
    argv = [sys.executable, "-m", "fairlane", "serve", "--config", str(path)]
    if name == "shell":
        for variable in host.ONE_THREAD:
            env.pop(variable, None)
        argv = [sys.executable, "-c", WITHOUT_HOST, "serve", "--config", str(path)]
    return ServerProcess(argv, port, env=env)


def _first_token(url: str, text: str, klass: str) -> float:
    """Stream a turn of `text` (a nonce first) as `klass`; when its first token came."""
    timing = stream_chat(
        url, [{"role": "user", "content": f"[{uuid.uuid4().hex[:8]}] {text}"}], 8,
        {"fairlane_class": klass},
    )
    if timing.ttft is None:
        raise RuntimeError(f"no first token: {timing.error}")
    return timing.token_times[0]


def _spoken(url: str, audio: bytes) -> dict[str, float]:
    sent = time.monotonic()
    heard = post_transcription(url, audio, {"fairlane_class": "voice", "language": "en"})
    transcribed = time.monotonic() - sent
    return {"stt": transcribed, "first_token": _first_token(url, heard["text"], "voice") - sent}


NOTE = " ".join(
    f"Day {i}: the boiler was serviced, the filter changed and the pressure set to 1.5 bar; "
    f"the dishwasher ran the eco programme; the school trip is on Friday."
    for i in range(12)
)  # about 500 tokens


def _chat(url: str, question: str) -> float:
    sent = time.monotonic()
    return _first_token(url, question, "chat") - sent


def _spread(values: list[float]) -> dict[str, float]:
    return {
        "p50": statistics.median(values),
        "p95": percentile(values, 95) or 0.0,
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


def busy_host(fixtures: Path, targets: list[str], rounds: int) -> dict[str, Any]:
    unknown = [t for t in targets if t not in TARGETS]
    if unknown:
        raise ValueError(f"unknown targets {unknown}: choose from {sorted(TARGETS)}")
    audio = [p.read_bytes() for p in sorted(fixtures.glob("command-*.wav"))]
    servers = {name: _server(name) for name in targets}
    samples: dict[str, dict[str, dict[str, list[float]]]] = {
        name: {c: {"spoken": [], "stt": [], "chat": [], "long": []} for c in ("quiet", "busy")}
        for name in targets
    }
    try:
        for server in servers.values():  # equal warm-up: one of each, unmeasured
            _spoken(server.url, audio[0])
            _chat(server.url, QUESTIONS[0])
            _chat(server.url, f"Sum up these notes in one line. {NOTE}")
        for r in range(rounds):
            conditions = ("quiet", "busy") if r % 2 == 0 else ("busy", "quiet")
            for c, condition in enumerate(conditions):
                # The first target after a change of condition runs on a machine that just
                # changed: the second condition of each round takes the targets the other way
                # round, so each condition sees each order as often.
                order = list(servers.items())[:: -1 if c else 1]
                neighbour = (
                    subprocess.Popen([sys.executable, "-c", NEIGHBOUR])
                    if condition == "busy"
                    else None
                )
                try:
                    for name, server in order:
                        spoken = _spoken(server.url, audio[r % len(audio)])
                        chat = _chat(server.url, QUESTIONS[r % len(QUESTIONS)])
                        long = _chat(server.url, f"Sum up these notes in one line. {NOTE}")
                        cell = samples[name][condition]
                        cell["spoken"].append(spoken["first_token"])
                        cell["stt"].append(spoken["stt"])
                        cell["chat"].append(chat)
                        cell["long"].append(long)
                        print(
                            f"round {r + 1:2d} {condition:5s} {name:9s} spoken first token "
                            f"{spoken['first_token'] * 1000:6.0f} ms (stt "
                            f"{spoken['stt'] * 1000:4.0f})  chat TTFT {chat * 1000:6.0f} ms  "
                            f"long chat TTFT {long * 1000:6.0f} ms",
                            flush=True,
                        )
                finally:
                    if neighbour is not None:
                        neighbour.kill()
                        neighbour.wait()
    finally:
        for server in servers.values():
            server.close()
    result: dict[str, Any] = {}
    print(f"\n{'target':9s} {'what':14s} {'quiet p50/p95 ms':>18s} {'busy p50/p95 ms':>18s} "
          f"{'busy/quiet p50, p95':>20s}")
    for name in targets:
        result[name] = {}
        for what in ("spoken", "chat", "long", "stt"):
            quiet = _spread(samples[name]["quiet"][what])
            busy = _spread(samples[name]["busy"][what])
            ratio = (busy["p50"] / quiet["p50"], busy["p95"] / quiet["p95"])
            result[name][what] = {"quiet": quiet, "busy": busy, "ratio_p50": ratio[0],
                                  "ratio_p95": ratio[1]}
            label = {"spoken": "spoken command", "chat": "chat TTFT", "long": "long chat TTFT",
                     "stt": "  (its STT)"}[what]
            print(
                f"{name:9s} {label:14s} {quiet['p50'] * 1000:8.0f} /{quiet['p95'] * 1000:6.0f}"
                f"    {busy['p50'] * 1000:8.0f} /{busy['p95'] * 1000:6.0f}"
                f"    {ratio[0]:8.2f}x, {ratio[1]:5.2f}x"
            )
    return {"rounds": rounds, "targets": result}
