"""`fairlane bench family`: a household's evening replayed against live servers.

The workload YAML the simulator reads (`fairlane.sim.workload`) is played in real time by real
clients: spoken commands (a recording through speech-to-text, then the LLM turn that answers
it), typed chat, automations, summaries and documents to index, each request with its class and
household member. Every prompt is unique (a nonce) unless the workload declares a shared prefix
(Home Assistant's system prompt), and an LLM request's reply is as long as the workload drew.

Targets, each started fresh for every round and measured the same way:
- `fairlane`: `fairlane serve`, the default policy;
- `fcfs`: `fairlane serve --policy fcfs` (one FIFO, whole prompts);
- `fairlane+remote`: two `fairlane serve` processes splitting the threads, the second one
  the first's remote lane for background LLM work (rule 10);
- `separate`: the stack households run today, as separate processes sharing the machine:
  llama.cpp's `llama-server --parallel N` for chat, `wyoming-faster-whisper` for speech (the
  same Whisper model), and an embedding server (a stand-in: sentence-transformers' ONNX int8
  backend behind a small HTTP server, `bench/embedding_server.py`). They know nothing of
  classes; a spoken command's turn is one more request to llama-server.

Each round plays three phases on one server start: the interactive work alone, the
background work alone, and both together (the evening); with `--per-member`, then each
member's own requests alone (`alone:MEMBER`), for the fairness case (`fairlane.sim.clients`).
Rounds alternate the targets (A B C A B C) and every round is printed; the ratios are the
goals of DESIGN.md.

The parts: `family_load` (prompts and recordings), `family_targets` (the servers),
`family_play` (one phase in real time) and `family_report` (tables, ratios, plot).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fairlane.bench.family_load import Prompts, recordings
from fairlane.bench.family_play import ALONE, Played, Player
from fairlane.bench.family_report import (
    format_rows,
    ratios,
    summarize,
)
from fairlane.bench.family_targets import (
    Target,
    start_target,
)
from fairlane.policy import Kind, Priority
from fairlane.sim.clients import fairness as fairness_of
from fairlane.sim.clients import format_fairness, rows
from fairlane.sim.workload import Job, Workload


def family(
    workload: Workload,
    targets: list[str],
    phases: list[str],
    rounds: int,
    threads: int,
    audio_dir: Path | None,
    give_up_s: float = 60.0,
    progress: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Play the workload's phases against every target, rounds interleaved (A B A B)."""
    audio = recordings(workload, audio_dir)
    prompts = Prompts(seed=0)
    reports: list[dict[str, Any]] = []
    fairness: list[dict[str, Any]] = []
    for round_index in range(1, rounds + 1):
        for name in targets:
            target = start_target(name, threads)
            records: dict[str, Played] = {}
            try:
                warm_up(target, workload, prompts, audio)
                for phase in phases:
                    played = Played(name, phase, round_index, workload.duration_s)
                    Player(target, workload, prompts, audio, played, give_up_s).play(phase)
                    records[phase] = played
                    if not phase.startswith(ALONE):
                        reports.append(summarize(played, workload.slo))
                        progress(format_rows(reports[-1:]).splitlines()[-1])
                    _settle()
            finally:
                target.close()
            if together := _members(records, workload.duration_s):
                fairness.append({"target": name, "round": round_index, **together})
                progress(format_fairness(f"{name} round {round_index}", together))
    result = {"reports": reports, "ratios": ratios(reports)}
    if fairness:
        result["members"] = fairness
    return result


def _members(played: dict[str, Played], duration_s: float) -> dict[str, Any] | None:
    """The fairness case: each member in the mixed phase (or the interactive one) against
    their `alone:` phase."""
    alone = {p.removeprefix(ALONE): r for p, r in played.items() if p.startswith(ALONE)}
    beside = played.get("mixed") or played.get("interactive")
    if not alone or beside is None:
        return None
    by_itself = {}
    for member, solo in alone.items():
        found = rows(solo.records, duration_s)
        if member in found:
            by_itself[member] = found[member]
    return fairness_of(rows(beside.records, duration_s), by_itself)


# Seconds between phases: cancelled work leaves the device before the next phase.
SETTLE_S = 3.0
WARM_UP_TOKENS = 4  # each warm-up chat's reply


def warm_up_chats(workload: Workload) -> list[Job]:
    """The warm-up's chat requests: a short one, and one for each shared prefix (Home
    Assistant's system prompt is always warm in a running home)."""
    shared = {
        (j.group, j.prefix_tokens): j
        for j in (*workload.jobs, *(j.then for j in workload.jobs if j.then))
        if j is not None and j.prefix_tokens
    }
    for loop in workload.loops:
        for unit_job in loop.units[0]:
            if unit_job.prefix_tokens:
                shared[(unit_job.group, unit_job.prefix_tokens)] = unit_job
    return [Job(0.0, "warm-up", Kind.LLM, Priority.CHAT, "warm-up", 64, 4), *shared.values()]


def warm_up(
    target: Target, workload: Workload, prompts: Prompts, audio: dict[int, bytes]
) -> None:
    """The same warm-up for every target: one of each kind of request, and one request for
    each shared prefix."""
    for job in warm_up_chats(workload):
        target.chat(prompts.messages(job), WARM_UP_TOKENS, job, threading.Event())
    if audio:
        target.transcribe(next(iter(audio.values())), "warm-up")
    target.embed(["warm-up text"], "warm-up")


def _settle(seconds: float = SETTLE_S) -> None:
    """A pause between phases: cancelled work leaves the device before the next phase."""
    time.sleep(seconds)
