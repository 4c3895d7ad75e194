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
background work alone, and both together (the evening). Rounds alternate the targets
(A B C A B C) and every round is printed; the ratios are the goals of DESIGN.md.
"""

from __future__ import annotations

import asyncio
import json
import random
import shutil
import threading
import time
import urllib.request
import uuid
import wave
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from fairlane.bench.servers import (
    ServerProcess,
    StreamTiming,
    fairlane_server,
    free_port,
    post_transcription,
    stream_chat,
)
from fairlane.engines import models
from fairlane.policy import Kind, Priority, Slo
from fairlane.runtime.metrics import RequestRecord, percentile
from fairlane.sim.workload import Job, Workload

PHASES = ("interactive", "background", "mixed")
TARGETS = ("fairlane", "fcfs", "separate", "fairlane+remote")
BASELINES = Path(".bench")
_HOUSEHOLD = (
    "kitchen light lamp door window heating boiler garden evening morning family dinner "
    "school music timer weather garage hallway bedroom water washing dishes shopping list "
    "calendar reminder holiday trip bread milk coffee energy battery solar meter sensor "
    "motion camera alarm doorbell blinds curtain fan oven fridge freezer dryer robot vacuum "
    "plant tomato sprinkler lawn bike car charger parcel letter bill insurance doctor dentist"
)
WORDS = tuple(_HOUSEHOLD.split(" "))
COUNT = " Then count from 1 to 1000, separated by commas."


# --- prompts of a given size --------------------------------------------------------------------


class Prompts:
    """Texts of an exact token count for the default model (its tokenizer, no weights)."""

    def __init__(self, seed: int = 0) -> None:
        from llama_cpp import Llama

        self._llama = Llama(
            str(models.resolve_llm(models.DEFAULT_LLM)), vocab_only=True, verbose=False
        )
        self._rng = random.Random(seed)
        self._prefixes: dict[tuple[str, int], str] = {}

    def tokens(self, text: str) -> int:
        return len(self._llama.tokenize(text.encode(), add_bos=False, special=False))

    def filler(self, count: int, rng: random.Random) -> str:
        """About `count` tokens of household words (each word one token or two)."""
        if count <= 0:
            return ""
        words = [rng.choice(WORDS) for _ in range(count)]
        text = " ".join(words)
        while self.tokens(text) > count and len(words) > 1:
            words = words[: max(1, len(words) * count // self.tokens(text) - 1)]
            text = " ".join(words)
        return text

    def prefix(self, group: str, count: int) -> str:
        """The system prompt every request of `group` shares (Home Assistant's, for voice)."""
        key = (group, count)
        if key not in self._prefixes:
            head = "You are the voice assistant of a household. Devices: "
            body = self.filler(count - self.tokens(head), random.Random(group))
            self._prefixes[key] = head + body
        return self._prefixes[key]

    def messages(self, job: Job, said: str = "") -> list[dict[str, str]]:
        """The job's turn: its shared prefix, then a nonce and unique words, then the ask."""
        rng = random.Random(self._rng.random())
        nonce = f"[{uuid.uuid4().hex[:12]}] "
        unique = job.prompt_tokens - job.prefix_tokens - self.tokens(nonce + said + COUNT)
        user = nonce + (said + ". " if said else "") + self.filler(unique, rng) + COUNT
        turn = [{"role": "user", "content": user}]
        if job.prefix_tokens:
            return [{"role": "system", "content": self.prefix(job.group, job.prefix_tokens)}, *turn]
        return turn

    def chunks(self, jobs: tuple[Job, ...]) -> list[str]:
        """A document's chunks, one text per embedding job, each its drawn size."""
        rng = random.Random(self._rng.random())
        nonce = uuid.uuid4().hex[:12]
        return [f"{nonce} {self.filler(job.prompt_tokens - 8, rng)}" for job in jobs]


# --- targets --------------------------------------------------------------------------------------


class Target(Protocol):
    name: str

    def transcribe(self, audio: bytes, client: str) -> str: ...

    def chat(
        self, messages: list[dict[str, str]], max_tokens: int, job: Job, stop: threading.Event
    ) -> StreamTiming: ...

    def embed(self, texts: list[str], client: str) -> None: ...

    def close(self) -> None: ...


def _post_json(url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> Any:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.loads(response.read())


class FairlaneTarget:
    """`fairlane serve` with a policy; every request says its class and member."""

    def __init__(self, policy: str, threads: int, extra: dict[str, Any] | None = None) -> None:
        self.name = policy
        self.server = fairlane_server(policy, threads, 8, extra)

    def transcribe(self, audio: bytes, client: str) -> str:
        fields = {"language": "en", "user": client, "fairlane_class": "voice"}
        return str(post_transcription(self.server.url, audio, fields)["text"])

    def chat(
        self, messages: list[dict[str, str]], max_tokens: int, job: Job, stop: threading.Event
    ) -> StreamTiming:
        extra = {"fairlane_class": job.priority.label, "user": job.client}
        return stream_chat(self.server.url, messages, max_tokens, extra, stop=stop)

    def embed(self, texts: list[str], client: str) -> None:
        body = {"input": texts, "fairlane_class": "background", "user": client}
        _post_json(f"{self.server.url}/v1/embeddings", body)

    def close(self) -> None:
        self.server.close()


class RemoteLaneTarget(FairlaneTarget):
    """`fairlane+remote`: rule 10 on one machine. Two `fairlane serve` processes share the
    threads: the household's server (voice, chat, embeddings, on its half) binds `background`
    to a remote lane, and the second server (the other half, LLM only) is that remote. On a
    real second machine the remote adds its own device; here it only separates the lanes."""

    def __init__(self, threads: int) -> None:
        half = max(1, threads // 2)
        off = {"enabled": False}
        self.remote = fairlane_server(
            "fairlane", half, 8, {"stt": off, "tts": off, "embed": off, "wyoming": off}
        )
        try:
            lane = [{"name": "remote", "url": f"{self.remote.url}/v1"}]
            super().__init__("fairlane", max(1, threads - half), {"remotes": lane})
        except Exception:
            self.remote.close()
            raise
        self.name = "fairlane+remote"

    def close(self) -> None:
        super().close()
        self.remote.close()


class SeparateStack:
    """llama-server, wyoming-faster-whisper and an embedding server, as separate processes,
    each on its defaults for this machine (every one uses all the cores)."""

    name = "separate"

    def __init__(self, threads: int, parallel: int = 8) -> None:
        from fairlane.bench.llm import llama_server

        self._servers: list[ServerProcess] = []
        try:
            self.llm = llama_server(parallel, threads, unified=True)
            self._servers.append(self.llm)
            self.whisper_port = free_port()
            self._servers.append(self._whisper(threads))
            self.embedder = self._embedding_server(threads)
            self._servers.append(self.embedder)
        except Exception:
            self.close()
            raise

    def _whisper(self, threads: int) -> ServerProcess:
        python = BASELINES / "wyoming-faster-whisper/bin/python"
        if not python.is_file():
            raise ValueError(f"no {python}: run scripts/install-baselines.sh first")
        argv = [
            str(python),
            "-m",
            "wyoming_faster_whisper",
            "--uri",
            f"tcp://127.0.0.1:{self.whisper_port}",
            "--model",
            models.resolve_stt(models.DEFAULT_STT),
            "--data-dir",
            str(BASELINES / "whisper-data"),
            "--language",
            "en",
            "--cpu-threads",
            str(threads),
        ]
        return ServerProcess(argv, self.whisper_port, ready=_wyoming_ready)

    def _embedding_server(self, threads: int) -> ServerProcess:
        python = BASELINES / "embedding-server/bin/python"
        if not python.is_file():
            raise ValueError(f"no {python}: run scripts/install-baselines.sh first")
        model = embedding_model_copy()
        port = free_port()
        script = Path(__file__).with_name("embedding_server.py")
        argv = [str(python), str(script), str(model), str(port), str(threads)]
        return ServerProcess(argv, port, timeout_s=600)

    def transcribe(self, audio: bytes, client: str) -> str:
        return asyncio.run(_wyoming_transcribe(self.whisper_port, audio))

    def chat(
        self, messages: list[dict[str, str]], max_tokens: int, job: Job, stop: threading.Event
    ) -> StreamTiming:
        return stream_chat(self.llm.url, messages, max_tokens, stop=stop)

    def embed(self, texts: list[str], client: str) -> None:
        _post_json(f"{self.embedder.url}/v1/embeddings", {"input": texts})

    def close(self) -> None:
        for server in self._servers:
            server.close()


def embedding_model_copy() -> Path:
    """A writable copy of the packaged embedding model: the baseline writes its int8 ONNX
    export beside it."""
    model = BASELINES / "embed-model"
    if not (model / "config.json").exists():
        shutil.copytree(models.resolve_embedder(models.DEFAULT_EMBED), model)
    return model


def _wyoming_ready(port: int) -> bool:
    """A Wyoming server is ready when it answers `describe` with its `info`."""
    from wyoming.client import AsyncTcpClient
    from wyoming.info import Describe

    async def ask() -> bool:
        async with AsyncTcpClient("127.0.0.1", port) as client:
            await client.write_event(Describe().event())
            event = await asyncio.wait_for(client.read_event(), timeout=5)
            return event is not None and event.type == "info"

    try:
        return asyncio.run(ask())
    except (TimeoutError, OSError):
        return False


async def _wyoming_transcribe(port: int, audio: bytes) -> str:
    """Send a recording as a satellite's pipeline does (transcribe, audio, stop)."""
    import io

    from wyoming.asr import Transcribe, Transcript
    from wyoming.audio import AudioChunk, AudioStart, AudioStop
    from wyoming.client import AsyncTcpClient

    with wave.open(io.BytesIO(audio), "rb") as wav:
        rate, width, channels = wav.getframerate(), wav.getsampwidth(), wav.getnchannels()
        pcm = wav.readframes(wav.getnframes())
    async with AsyncTcpClient("127.0.0.1", port) as client:
        await client.write_event(Transcribe(language="en").event())
        await client.write_event(AudioStart(rate, width, channels).event())
        step = rate * width * channels // 10  # 100 ms chunks
        for offset in range(0, len(pcm), step):
            chunk = AudioChunk(rate, width, channels, pcm[offset : offset + step])
            await client.write_event(chunk.event())
        await client.write_event(AudioStop().event())
        while True:
            event = await client.read_event()
            if event is None:
                raise OSError("the speech server closed the connection")
            if Transcript.is_type(event.type):
                return str(Transcript.from_event(event).text)


def start_target(name: str, threads: int) -> Target:
    if name == "separate":
        return SeparateStack(threads)
    if name == "fairlane+remote":
        return RemoteLaneTarget(threads)
    return FairlaneTarget(name, threads)


# --- playing a workload ---------------------------------------------------------------------------


@dataclass
class Played:
    """What one phase of one target recorded."""

    target: str
    phase: str
    round: int
    duration_s: float
    records: list[RequestRecord] = field(default_factory=list)
    turns: list[tuple[RequestRecord, RequestRecord]] = field(default_factory=list)  # voice
    # Background work done within the phase: LLM tokens (the prompts of answers that began, and
    # the tokens received) and embedded tokens (documents finished), apart: they differ a
    # hundredfold in cost.
    background_llm_tokens: int = 0
    embedded_tokens: int = 0
    errors: list[str] = field(default_factory=list)
    timed_out: int = 0  # interactive requests still unanswered `give_up_s` after the phase


class Player:
    """Plays one phase of a workload against a target in real time."""

    def __init__(
        self,
        target: Target,
        workload: Workload,
        prompts: Prompts,
        audio: dict[int, bytes],
        played: Played,
        give_up_s: float,
    ) -> None:
        self.target = target
        self.workload = workload
        self.prompts = prompts
        self.audio = audio
        self.played = played
        self.give_up_s = give_up_s
        self.stop_background = threading.Event()
        self.abandon = threading.Event()
        self._lock = threading.Lock()
        self._t0 = 0.0

    def now(self) -> float:
        return time.monotonic() - self._t0

    def play(self, phase: str) -> None:
        self._t0 = time.monotonic()
        duration = self.workload.duration_s
        jobs = [j for j in self.workload.jobs if _in_phase(j.priority, phase)]
        loops = [lp for lp in self.workload.loops if _in_phase(lp.units[0][0].priority, phase)]
        threads: list[threading.Thread] = []
        for loop in loops:
            units = iter(loop.units)
            lock = threading.Lock()

            def next_unit(
                units: Iterator[tuple[Job, ...]] = units, lock: threading.Lock = lock
            ) -> tuple[Job, ...] | None:
                with lock:
                    return next(units, None)

            for _ in range(loop.in_flight):
                threads.append(self._spawn(self._loop, next_unit, loop.until))
        interactive: list[threading.Thread] = []
        for job in jobs:
            wait = job.at - self.now()
            if wait > 0:
                time.sleep(wait)
            worker = self._spawn(self._job, job)
            (interactive if job.priority.interactive else threads).append(worker)
        time.sleep(max(0.0, duration - self.now()))
        self.stop_background.set()  # unfinished background work does not count
        deadline = time.monotonic() + self.give_up_s
        for worker in interactive:
            worker.join(max(0.0, deadline - time.monotonic()))
        self.played.timed_out = sum(worker.is_alive() for worker in interactive)
        self.abandon.set()
        for worker in threads + interactive:
            worker.join(30)

    def _spawn(self, target: Callable[..., object], *args: Any) -> threading.Thread:
        thread = threading.Thread(target=self._guard, args=(target, *args), daemon=True)
        thread.start()
        return thread

    def _guard(self, target: Callable[..., object], *args: Any) -> None:
        try:
            target(*args)
        except Exception as err:  # a failed request is counted, never fatal to the phase
            with self._lock:
                self.played.errors.append(f"{type(err).__name__}: {err}")

    def _loop(self, next_unit: Callable[[], tuple[Job, ...] | None], until: float | None) -> None:
        end = self.workload.duration_s if until is None else min(until, self.workload.duration_s)
        while not self.stop_background.is_set() and self.now() < end:
            unit = next_unit()
            if unit is None:
                return
            if unit[0].kind is Kind.EMBED:
                self._document(unit)
                continue
            # A summary's pieces go together; the last one's `then` (the summary of the
            # pieces) follows it.
            pieces = [self._spawn(self._job, job) for job in unit]
            for piece in pieces:
                piece.join()

    def _stop_for(self, job: Job) -> threading.Event:
        return self.abandon if job.priority.interactive else self.stop_background

    def _record(self, job: Job, kind: Kind | None = None) -> RequestRecord:
        record = RequestRecord(
            kind or job.kind, job.priority, job.client, job.group, self.now(), job.prompt_tokens
        )
        with self._lock:
            self.played.records.append(record)
        return record

    def _job(self, job: Job, said: str = "") -> RequestRecord | None:
        if self._stop_for(job).is_set():
            return None
        if job.kind is Kind.STT:
            self._voice(job)
            return None
        messages = self.prompts.messages(job, said)
        record = self._record(job)
        timing = self.target.chat(messages, job.output_tokens, job, self._stop_for(job))
        record.token_times = [t - self._t0 for t in timing.token_times]
        if not job.priority.interactive:
            # Work done within the phase: the prompt of an answer that began, and every token
            # received (a summary cut at the end still counts what it got through; a prompt
            # cut mid-prefill counts nothing, as the client cannot see it).
            received = [t for t in record.token_times if t <= self.workload.duration_s]
            if received:
                with self._lock:
                    self.played.background_llm_tokens += job.prompt_tokens + len(received)
        if timing.error is None and not self._stop_for(job).is_set():
            record.finished_at = self.now()
            if job.then is not None:
                self._job(job.then)
        elif timing.error:
            record.refused = timing.error
        return record

    def _voice(self, job: Job) -> None:
        """A spoken command: its recording through speech-to-text, then the LLM turn."""
        record = self._record(job, Kind.STT)
        text = self.target.transcribe(self.audio[id(job)], job.client)
        record.finished_at = self.now()
        if job.then is not None:
            reply = self._job(job.then, said=text)
            if reply is not None:
                with self._lock:
                    self.played.turns.append((record, reply))

    def _document(self, unit: tuple[Job, ...]) -> None:
        """A document's chunks in one embeddings request, as an indexer sends them."""
        record = self._record(unit[0])
        record.prompt_tokens = sum(job.prompt_tokens for job in unit)
        self.target.embed(self.prompts.chunks(unit), unit[0].client)
        if not self.stop_background.is_set():
            record.finished_at = self.now()
            with self._lock:
                self.played.embedded_tokens += record.prompt_tokens


def _in_phase(priority: Priority, phase: str) -> bool:
    return phase == "mixed" or (phase == "interactive") == priority.interactive


# --- the report -----------------------------------------------------------------------------------


def _ms(values: list[float], q: float) -> float | None:
    value = percentile(values, q)
    return None if value is None else round(value * 1000)


def summarize(played: Played, slo: dict[Priority, Slo]) -> dict[str, Any]:
    """Per-class latency as the client saw it, SLO attainment, goodput and background work."""
    rows: dict[str, Any] = {}
    interactive = [r for r in played.records if r.priority.interactive]
    for name in ("voice/stt", "voice/llm", "chat/llm", "background/llm", "background/embed"):
        records = [r for r in played.records if f"{r.priority.label}/{r.kind.value}" == name]
        if not records:
            continue
        done = [r for r in records if r.finished_at is not None]
        target = slo.get(records[0].priority, Slo())
        rows[name] = {
            "requests": len(records),
            "finished": len(done),
            "ttft_ms": {f"p{q}": _ms([t for r in done if (t := r.ttft)], q) for q in (50, 95, 99)},
            "itl_ms": {f"p{q}": _ms([g for r in done for g in r.itl], q) for q in (50, 95, 99)},
            "e2e_ms": {f"p{q}": _ms([t for r in done if (t := r.e2e)], q) for q in (50, 95, 99)},
            "slo_met": round(sum(r.met(target) for r in records) / len(records), 3),
        }
    turns = [reply.token_times[0] - stt.arrival for stt, reply in played.turns if reply.token_times]
    voice_slo = slo.get(Priority.VOICE, Slo())
    met = [r.met(slo.get(r.priority, Slo())) for r in interactive]
    return {
        "target": played.target,
        "phase": played.phase,
        "round": played.round,
        "classes": rows,
        # End of speech to the answer's first token: what the person who spoke waits for.
        "voice_turn_ms": {f"p{q}": _ms(turns, q) for q in (50, 95, 99)},
        "voice_turn_target_ms": (voice_slo.stt_ms or 0) + (voice_slo.ttft_ms or 0),
        "interactive_slo_met": round(sum(met) / len(met), 3) if met else None,
        "goodput_per_min": round(60 * sum(met) / played.duration_s, 2),
        "background_llm_tokens_per_s": round(played.background_llm_tokens / played.duration_s, 1),
        "embedded_tokens_per_s": round(played.embedded_tokens / played.duration_s),
        "errors": len(played.errors),
        "first_errors": played.errors[:3],
        "timed_out": played.timed_out,
    }


def _f(value: float | None, spec: str = ".0f") -> str:
    return "-" if value is None else format(value, spec)


def format_rows(reports: list[dict[str, Any]]) -> str:
    header = (
        f"{'target':<16}{'phase':<12}{'rnd':>4}{'row':>17}{'n':>4}{'TTFT p50':>9}{'p95':>7}"
        f"{'p99':>7}{'ITL p50':>8}{'p95':>6}{'p99':>6}{'SLO':>6}"
    )
    lines = [header, "-" * len(header)]
    for report in reports:
        for name, row in report["classes"].items():
            ttft, itl = row["ttft_ms"], row["itl_ms"]
            lines.append(
                f"{report['target']:<16}{report['phase']:<12}{report['round']:>4}{name:>17}"
                f"{row['requests']:>4}{_f(ttft['p50']):>9}{_f(ttft['p95']):>7}{_f(ttft['p99']):>7}"
                f"{_f(itl['p50']):>8}{_f(itl['p95']):>6}{_f(itl['p99']):>6}"
                f"{row['slo_met']:>6.0%}"
            )
        if report["phase"] != "interactive":
            lines.append(
                f"{report['target']:<16}{report['phase']:<12}{report['round']:>4}"
                f"{'background':>17}: {report['background_llm_tokens_per_s']} LLM tokens/s, "
                f"{report['embedded_tokens_per_s']} embedded tokens/s done"
            )
        if report["errors"]:
            lines.append(f"{'':<32}errors: {report['errors']} {report['first_errors']}")
    return "\n".join(lines)


def ratios(reports: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per target and round: the goals' ratios (loaded ÷ alone)."""
    out = []
    by_key = {(r["target"], r["round"], r["phase"]): r for r in reports}
    for target, round_index in sorted({(r["target"], r["round"]) for r in reports}):
        mixed = by_key.get((target, round_index, "mixed"))
        alone = by_key.get((target, round_index, "interactive"))
        background = by_key.get((target, round_index, "background"))
        if mixed is None:
            continue
        row: dict[str, Any] = {
            "target": target,
            "round": round_index,
            "interactive_slo_met": mixed["interactive_slo_met"],
            "background_llm_tokens_per_s": mixed["background_llm_tokens_per_s"],
            "embedded_tokens_per_s": mixed["embedded_tokens_per_s"],
        }
        if alone:
            chat = (mixed["classes"].get("chat/llm"), alone["classes"].get("chat/llm"))
            if all(c and c["ttft_ms"]["p95"] for c in chat):
                row["chat_ttft_p95_ratio"] = round(
                    chat[0]["ttft_ms"]["p95"] / chat[1]["ttft_ms"]["p95"], 2
                )
            turn = (mixed["voice_turn_ms"]["p95"], alone["voice_turn_ms"]["p95"])
            if all(turn):
                row["voice_first_token_p95_ratio"] = round(turn[0] / turn[1], 2)
        for key, name in (
            ("background_llm_tokens_per_s", "background_llm_ratio"),
            ("embedded_tokens_per_s", "embedded_ratio"),
        ):
            if background and background[key]:
                row[name] = round(mixed[key] / background[key], 2)
        out.append(row)
    return out


def format_ratios(rows: list[dict[str, Any]]) -> str:
    header = (
        f"{'target':<16}{'rnd':>4}{'chat TTFT p95 loaded/alone':>28}"
        f"{'voice turn p95 loaded/alone':>29}{'bg LLM mixed/alone':>20}"
        f"{'embed mixed/alone':>19}{'interactive SLO':>17}{'bg LLM tok/s':>14}{'embed tok/s':>13}"
    )
    lines = [header, "-" * len(header)]
    for row in rows:
        lines.append(
            f"{row['target']:<16}{row['round']:>4}"
            f"{_f(row.get('chat_ttft_p95_ratio'), '.2f'):>28}"
            f"{_f(row.get('voice_first_token_p95_ratio'), '.2f'):>29}"
            f"{_f(row.get('background_llm_ratio'), '.2f'):>20}"
            f"{_f(row.get('embedded_ratio'), '.2f'):>19}"
            f"{_f(row['interactive_slo_met'], '.0%'):>17}"
            f"{row['background_llm_tokens_per_s']:>14}{row['embedded_tokens_per_s']:>13}"
        )
    return "\n".join(lines)


# --- the command --------------------------------------------------------------------------------


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
    for round_index in range(1, rounds + 1):
        for name in targets:
            target = start_target(name, threads)
            try:
                warm_up(target, workload, prompts, audio)
                for phase in phases:
                    played = Played(name, phase, round_index, workload.duration_s)
                    Player(target, workload, prompts, audio, played, give_up_s).play(phase)
                    reports.append(summarize(played, workload.slo))
                    progress(format_rows(reports[-1:]).splitlines()[-1])
                    _settle()
            finally:
                target.close()
    return {"reports": reports, "ratios": ratios(reports)}


def recordings(workload: Workload, audio_dir: Path | None) -> dict[int, bytes]:
    """Each spoken command's recording (by the job's identity): the workload's own, or else
    the folder's files in turn."""
    files = sorted(audio_dir.glob("*.wav")) if audio_dir else []
    recordings: dict[int, bytes] = {}
    spoken = [job for job in workload.jobs if job.kind is Kind.STT]
    for index, job in enumerate(spoken):
        if job.audio_file is None and not files:
            raise ValueError("the workload's spoken commands need recordings: --audio-dir")
        path = Path(job.audio_file) if job.audio_file else files[index % len(files)]
        recordings[id(job)] = path.read_bytes()
    return recordings


def warm_up(
    target: Target, workload: Workload, prompts: Prompts, audio: dict[int, bytes]
) -> None:
    """The same warm-up for every target: one of each kind of request, and one request for
    each shared prefix (Home Assistant's system prompt is always warm in a running home)."""
    job = Job(0.0, "warm-up", Kind.LLM, Priority.CHAT, "warm-up", 64, 4)
    target.chat(prompts.messages(job), 4, job, threading.Event())
    shared = {
        (j.group, j.prefix_tokens): j
        for j in (*workload.jobs, *(j.then for j in workload.jobs if j.then))
        if j is not None and j.prefix_tokens
    }
    for loop in workload.loops:
        for unit_job in loop.units[0]:
            if unit_job.prefix_tokens:
                shared[(unit_job.group, unit_job.prefix_tokens)] = unit_job
    for sample in shared.values():
        target.chat(prompts.messages(sample), 4, sample, threading.Event())
    if audio:
        target.transcribe(next(iter(audio.values())), "warm-up")
    target.embed(["warm-up text"], "warm-up")


def _settle(seconds: float = 3.0) -> None:
    """A pause between phases: cancelled work leaves the device before the next phase."""
    time.sleep(seconds)


def plot(result: dict[str, Any], path: Path) -> None:
    """Per target and phase: interactive first-token p95 and background work done (every
    round a point, so the spread shows)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    reports = result["reports"]
    keys = sorted({(r["target"], r["phase"]) for r in reports}, key=lambda k: (k[0], k[1]))
    fig, (latency, work) = plt.subplots(1, 2, figsize=(13, 4.5))
    for x, (target, phase) in enumerate(keys):
        mine = [r for r in reports if (r["target"], r["phase"]) == (target, phase)]
        for report in mine:
            turn = report["voice_turn_ms"]["p95"]
            chat = (report["classes"].get("chat/llm") or {}).get("ttft_ms", {}).get("p95")
            if turn:
                latency.plot(x - 0.1, turn, "o", color="#d62728")
            if chat:
                latency.plot(x + 0.1, chat, "s", color="#1f77b4")
            if report["phase"] != "interactive":
                work.plot(x, report["background_llm_tokens_per_s"], "o", color="#7f7f7f")
    labels = [f"{t}\n{p}" for t, p in keys]
    for axis in (latency, work):
        axis.set_xticks(range(len(keys)), labels, fontsize=8)
        axis.grid(True, alpha=0.3)
    latency.set_yscale("log")
    latency.set_ylabel("p95 ms (● voice: end of speech → first token, ■ chat TTFT)")
    work.set_ylabel("background LLM tokens/s finished")
    latency.set_title(f"{result.get('workload', '')}: what people wait for")
    work.set_title("background work done")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
