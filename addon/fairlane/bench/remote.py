"""`fairlane bench remote`: the household's LLM on a second box running llama.cpp's
llama-server, with Fairlane in front of it against clients that talk to it directly.

llama-server batches its `--parallel` slots continuously and serves them first come, first
served: a spoken command that arrives while background summaries hold every slot waits in its
queue. With Fairlane in front (a remote lane for every class, `engine: llama-server`), the
summaries wait in Fairlane's queue instead, take at most all but one place of the lane's
window, and a spoken command or a chat turn goes next.

The load, for `duration` seconds a round, the same in both: a background flood (`flood`
clients, each sending the next summary-sized request when its last is answered), chat turns
every few seconds, and spoken commands' LLM turns (Home Assistant's system prompt shared, the
rest unique). Every prompt is unique apart from that prefix. Each round starts a fresh
llama-server (`--parallel`, all threads) and, for Fairlane, a fresh `fairlane serve` whose own
engines are idle (speech, voice and embeddings off; its LLM only counts prompt tokens). Rounds
interleave the targets (A B A B); every round is printed, and the ratios of the medians.
"""

from __future__ import annotations

import random
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fairlane.bench.family_load import Prompts
from fairlane.bench.llm import llama_server
from fairlane.bench.servers import ServerProcess, StreamTiming, free_port, stream_chat
from fairlane.policy import Kind, Priority
from fairlane.runtime.metrics import percentile
from fairlane.sim.workload import Job

TARGETS = ("llama-server", "fairlane")


@dataclass
class Load:
    """What one round sends: sizes in tokens, gaps in seconds."""

    flood: int = 4
    background_prompt: int = 600
    background_output: int = 120
    chat_every_s: float = 6.0
    chat_prompt: int = 400
    chat_output: int = 40
    voice_every_s: float = 9.0
    voice_prompt: int = 700
    voice_prefix: int = 600
    voice_output: int = 20


@dataclass
class Round:
    target: str
    round: int
    timings: dict[str, list[StreamTiming]] = field(default_factory=dict)
    background_tokens: int = 0

    def row(self, duration_s: float) -> dict[str, Any]:
        out: dict[str, Any] = {"target": self.target, "round": self.round}
        for group in ("voice", "chat"):
            done = [t for t in self.timings.get(group, []) if t.ttft is not None]
            ttfts = [t.ttft for t in done if t.ttft is not None]
            out[group] = {
                "requests": len(self.timings.get(group, [])),
                "answered": len(done),
                "ttft_p50_ms": _ms(percentile(ttfts, 50)),
                "ttft_p95_ms": _ms(percentile(ttfts, 95)),
            }
        out["background_tokens_per_s"] = round(self.background_tokens / duration_s, 1)
        return out


def fairlane_in_front(llm_url: str, parallel: int) -> ServerProcess:
    """`fairlane serve` with every class's LLM work on a remote lane to `llm_url`."""
    port = free_port()
    off = {"enabled": False}
    cfg = {
        "server": {"port": port, "data_dir": tempfile.mkdtemp(prefix="fairlane-bench-")},
        "stt": off, "tts": off, "embed": off, "wyoming": off,
        "llm": {"threads": 1, "n_ctx": 2048},
        "remotes": [{"name": "llm-box", "url": f"{llm_url}/v1", "engine": "llama-server",
                     "classes": ["voice", "chat", "background"], "max_in_flight": parallel}],
    }
    path = Path(tempfile.mkdtemp()) / "fairlane.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return ServerProcess([sys.executable, "-m", "fairlane", "serve", "--config", str(path)], port)


def remote(
    targets: list[str], rounds: int, threads: int, duration_s: float, parallel: int,
    load: Load | None = None, progress: Any = print,
) -> dict[str, Any]:
    load = load or Load()
    prompts = Prompts(seed=0)
    rows: list[dict[str, Any]] = []
    for index in range(1, rounds + 1):
        for target in targets:
            if target not in TARGETS:
                raise ValueError(f"unknown target {target!r}: {', '.join(TARGETS)}")
            llm = llama_server(parallel, threads)
            front = fairlane_in_front(llm.url, parallel) if target == "fairlane" else None
            try:
                url = (front or llm).url
                _warm(url, prompts, load)
                played = _play(url, target, index, duration_s, prompts, load)
                rows.append(played.row(duration_s))
                progress(format_rows(rows[-1:]).splitlines()[-1])
            finally:
                if front is not None:
                    front.close()
                llm.close()
    return {"rows": rows, "ratios": ratios(rows), "load": vars(load), "parallel": parallel,
            "duration_s": duration_s}


def _job(group: str, priority: Priority, prompt: int, output: int, prefix: int = 0) -> Job:
    return Job(0.0, group, Kind.LLM, priority, group, prompt, output, prefix_tokens=prefix)


def _send(url: str, prompts: Prompts, job: Job) -> StreamTiming:
    extra = {"fairlane_class": job.priority.label, "user": job.client}
    return stream_chat(url, prompts.messages(job), job.output_tokens, extra)


def _warm(url: str, prompts: Prompts, load: Load) -> None:
    """The same for both: a short turn, and one with the voice prefix (kept in the cache)."""
    _send(url, prompts, _job("chat", Priority.CHAT, 64, 4))
    _send(url, prompts, _job("voice", Priority.VOICE, load.voice_prompt, 4, load.voice_prefix))


def _play(
    url: str, target: str, index: int, duration_s: float, prompts: Prompts, load: Load
) -> Round:
    played = Round(target, index, {"voice": [], "chat": []})
    lock = threading.Lock()
    end = time.monotonic() + duration_s

    def flood() -> None:
        while time.monotonic() < end:
            job = _job("background", Priority.BACKGROUND, load.background_prompt,
                       load.background_output)
            timing = _send(url, prompts, job)
            with lock:  # tokens received within the round
                played.background_tokens += sum(1 for t in timing.token_times if t <= end)

    def turns(group: str, every_s: float, job: Job, seed: int) -> None:
        rng = random.Random(seed)
        senders: list[threading.Thread] = []
        at = time.monotonic() + rng.uniform(0, every_s)
        while at < end:
            time.sleep(max(0.0, at - time.monotonic()))

            def one() -> None:
                timing = _send(url, prompts, job)
                with lock:
                    played.timings[group].append(timing)

            sender = threading.Thread(target=one, daemon=True)
            sender.start()
            senders.append(sender)
            at += rng.expovariate(1.0 / every_s)
        for sender in senders:
            sender.join(300)

    threads = [threading.Thread(target=flood, daemon=True) for _ in range(load.flood)]
    threads.append(threading.Thread(target=turns, args=(
        "chat", load.chat_every_s,
        _job("chat", Priority.CHAT, load.chat_prompt, load.chat_output), 1), daemon=True))
    threads.append(threading.Thread(target=turns, args=(
        "voice", load.voice_every_s,
        _job("voice", Priority.VOICE, load.voice_prompt, load.voice_output, load.voice_prefix),
        2), daemon=True))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(duration_s + 300)
    return played


def ratios(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Fairlane in front over llama-server alone, medians over the rounds."""

    def median(target: str, pick: Any) -> float | None:
        values = [v for r in rows if r["target"] == target and (v := pick(r)) is not None]
        return percentile(values, 50)

    out: dict[str, Any] = {}
    for name, pick in (
        ("voice_ttft_p95", lambda r: r["voice"]["ttft_p95_ms"]),
        ("chat_ttft_p95", lambda r: r["chat"]["ttft_p95_ms"]),
        ("background_tokens_per_s", lambda r: r["background_tokens_per_s"]),
    ):
        alone, front = median("llama-server", pick), median("fairlane", pick)
        out[name] = None if not alone or front is None else round(front / alone, 2)
    return out


def format_rows(rows: list[dict[str, Any]]) -> str:
    def f(value: float | None) -> str:
        return "-" if value is None else f"{value:.0f}"

    lines = [f"{'target':<14}{'round':>6}{'voice n':>9}{'TTFT p50':>10}{'p95':>8}"
             f"{'chat n':>8}{'TTFT p50':>10}{'p95':>8}{'bg tok/s':>10}"]
    for row in rows:
        voice, chat = row["voice"], row["chat"]
        lines.append(
            f"{row['target']:<14}{row['round']:>6}{voice['answered']:>5}/{voice['requests']:<3}"
            f"{f(voice['ttft_p50_ms']):>10}{f(voice['ttft_p95_ms']):>8}"
            f"{chat['answered']:>4}/{chat['requests']:<3}{f(chat['ttft_p50_ms']):>10}"
            f"{f(chat['ttft_p95_ms']):>8}{row['background_tokens_per_s']:>10.1f}"
        )
    return "\n".join(lines)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 1)
