"""Household workloads: read a workload YAML (shared/workloads/family.yaml) into timed jobs.

Distributions: a fixed number, `{uniform: [lo, hi]}`, or `{lognormal: {median, p95}}`.
Arrivals: `{poisson: {per_min}}` or `{poisson_bursts: {bursts_per_min, burst_size, gap_s}}`.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import voluptuous as vol
import yaml

from fairlane.documents import SUMMARY_PIECE_TOKENS, SUMMARY_PIECE_WORDS
from fairlane.policy import Kind, Priority, Slo

Z95 = 1.6448536269514722  # the standard normal's 95th percentile

_DIST = vol.Any(
    vol.Coerce(float),
    {vol.Required("uniform"): vol.ExactSequence([vol.Coerce(float), vol.Coerce(float)])},
    {
        vol.Required("lognormal"): {
            vol.Required("median"): vol.Coerce(float),
            vol.Required("p95"): vol.Coerce(float),
        }
    },
)
_ARRIVALS = vol.Any(
    {vol.Required("poisson"): {vol.Required("per_min"): vol.Coerce(float)}},
    {
        vol.Required("poisson_bursts"): {
            vol.Required("bursts_per_min"): vol.Coerce(float),
            vol.Required("burst_size"): _DIST,
            vol.Required("gap_s"): _DIST,
        }
    },
)
_SLO = vol.Any(None, {vol.Optional(k): vol.Coerce(float) for k in ("stt_ms", "ttft_ms", "itl_ms")})
_LLM: dict[Any, Any] = {vol.Required("prompt_tokens"): _DIST, vol.Required("output_tokens"): _DIST}
WORKLOAD_SCHEMA = vol.Schema(
    {
        vol.Required("name"): str,
        vol.Required("duration_s"): vol.Coerce(float),
        vol.Optional("seed", default=0): int,
        vol.Required("clients"): [
            {vol.Required("id"): str, vol.Optional("satellite"): vol.Any(None, str)}
        ],
        vol.Required("classes"): {
            vol.Optional("voice"): {
                vol.Required("clients"): [str],
                vol.Required("arrivals"): _ARRIVALS,
                vol.Required("audio_s"): _DIST,
                vol.Required("llm_turn"): _LLM,
                vol.Optional("slo"): _SLO,
            },
            vol.Optional("chat"): {
                vol.Required("clients"): [str],
                vol.Required("arrivals"): _ARRIVALS,
                vol.Required("prompt_tokens"): _DIST,
                vol.Required("output_tokens"): _DIST,
                vol.Optional("slo"): _SLO,
            },
            vol.Optional("background"): {
                vol.Optional("automations"): {
                    vol.Required("clients"): [str],
                    vol.Required("arrivals"): _ARRIVALS,
                    **_LLM,
                },
                vol.Optional("documents"): {
                    vol.Required("count"): int,
                    vol.Required("tokens_per_doc"): _DIST,
                    vol.Required("chunk_tokens"): int,
                    vol.Optional("client", default="documents"): str,
                },
                vol.Optional("summaries"): {
                    vol.Required("count"): int,
                    vol.Optional("client", default="summaries"): str,
                    **_LLM,
                },
                vol.Optional("slo"): _SLO,
            },
        },
        vol.Optional("cpu_slo_scale", default=1.0): vol.Coerce(float),
    },
    extra=vol.ALLOW_EXTRA,
)


@dataclass(frozen=True)
class Job:
    """One piece of work arriving at `at`; `then` starts when it finishes (voice: the LLM turn)."""

    at: float
    group: str  # voice, chat, automation, document, summary
    kind: Kind
    priority: Priority
    client: str
    prompt_tokens: int = 0
    output_tokens: int = 0  # what the (simulated) model will generate before its EOS
    audio_s: float = 0.0
    then: Job | None = None


@dataclass(frozen=True)
class Workload:
    name: str
    duration_s: float
    jobs: tuple[Job, ...]
    slo: dict[Priority, Slo] = field(default_factory=dict)
    cpu_slo_scale: float = 1.0


class Sampler:
    """Draws from the workload's distribution shapes with one seeded generator."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def draw(self, spec: Any) -> float:
        if isinstance(spec, int | float):
            return float(spec)
        if "uniform" in spec:
            lo, hi = spec["uniform"]
            return self.rng.uniform(lo, hi)
        median, p95 = spec["lognormal"]["median"], spec["lognormal"]["p95"]
        sigma = max(math.log(p95 / median) / Z95, 1e-9)
        return self.rng.lognormvariate(math.log(median), sigma)

    def tokens(self, spec: Any) -> int:
        return max(1, round(self.draw(spec)))

    def arrivals(self, spec: dict[str, Any], duration_s: float) -> list[float]:
        """Arrival times in [0, duration_s)."""
        times: list[float] = []
        if "poisson" in spec:
            rate = spec["poisson"]["per_min"] / 60.0
            t = self.rng.expovariate(rate)
            while t < duration_s:
                times.append(t)
                t += self.rng.expovariate(rate)
            return times
        bursts = spec["poisson_bursts"]
        rate = bursts["bursts_per_min"] / 60.0
        t = self.rng.expovariate(rate)
        while t < duration_s:
            at = t
            for _ in range(max(1, round(self.draw(bursts["burst_size"])))):
                if at < duration_s:
                    times.append(at)
                at += self.draw(bursts["gap_s"])
            t += self.rng.expovariate(rate)
        return sorted(times)


def load(path: str | Path) -> Workload:
    """Read and validate a workload file into jobs (deterministic for the file's seed)."""
    try:
        data = WORKLOAD_SCHEMA(yaml.safe_load(Path(path).read_text()))
    except vol.Invalid as err:
        raise ValueError(f"workload {path}: {err}") from err
    return build(data)


def build(data: dict[str, Any]) -> Workload:
    sampler = Sampler(data["seed"])
    duration = data["duration_s"]
    classes = data["classes"]
    jobs: list[Job] = []
    slo: dict[Priority, Slo] = {}

    if voice := classes.get("voice"):
        slo[Priority.VOICE] = _slo(voice.get("slo"))
        for at in sampler.arrivals(voice["arrivals"], duration):
            client = sampler.rng.choice(voice["clients"])
            turn = voice["llm_turn"]
            reply = Job(
                at,
                "voice",
                Kind.LLM,
                Priority.VOICE,
                client,
                prompt_tokens=sampler.tokens(turn["prompt_tokens"]),
                output_tokens=sampler.tokens(turn["output_tokens"]),
            )
            # `at` is the end of the utterance: STT's clock starts when the person stops talking.
            jobs.append(
                Job(
                    at,
                    "voice",
                    Kind.STT,
                    Priority.VOICE,
                    client,
                    audio_s=sampler.draw(voice["audio_s"]),
                    then=reply,
                )
            )

    if chat := classes.get("chat"):
        slo[Priority.CHAT] = _slo(chat.get("slo"))
        for at in sampler.arrivals(chat["arrivals"], duration):
            jobs.append(
                Job(
                    at,
                    "chat",
                    Kind.LLM,
                    Priority.CHAT,
                    sampler.rng.choice(chat["clients"]),
                    prompt_tokens=sampler.tokens(chat["prompt_tokens"]),
                    output_tokens=sampler.tokens(chat["output_tokens"]),
                )
            )

    background = classes.get("background") or {}
    slo[Priority.BACKGROUND] = _slo(background.get("slo"))
    if docs := background.get("documents"):
        for _ in range(docs["count"]):
            tokens = sampler.tokens(docs["tokens_per_doc"])
            size = docs["chunk_tokens"]
            for start in range(0, tokens, size):
                jobs.append(
                    Job(
                        0.0,
                        "document",
                        Kind.EMBED,
                        Priority.BACKGROUND,
                        docs["client"],
                        prompt_tokens=min(size, tokens - start),
                    )
                )
    if summaries := background.get("summaries"):
        for _ in range(summaries["count"]):
            jobs += summary_jobs(
                summaries["client"],
                sampler.tokens(summaries["prompt_tokens"]),
                sampler.tokens(summaries["output_tokens"]),
            )
    if autos := background.get("automations"):
        for at in sampler.arrivals(autos["arrivals"], duration):
            jobs.append(
                Job(
                    at,
                    "automation",
                    Kind.LLM,
                    Priority.BACKGROUND,
                    sampler.rng.choice(autos["clients"]),
                    prompt_tokens=sampler.tokens(autos["prompt_tokens"]),
                    output_tokens=sampler.tokens(autos["output_tokens"]),
                )
            )

    jobs.sort(key=lambda j: j.at)
    return Workload(data["name"], duration, tuple(jobs), slo, data["cpu_slo_scale"])


def summary_jobs(client: str, prompt_tokens: int, output_tokens: int) -> list[Job]:
    """A summary as the server runs it: a long text in pieces (their turns batch together),
    then one turn over the pieces' summaries, which starts when the last piece is done."""
    whole = Job(0.0, "summary", Kind.LLM, Priority.BACKGROUND, client, prompt_tokens, output_tokens)
    if prompt_tokens <= SUMMARY_PIECE_TOKENS:
        return [whole]
    count = max(2, math.ceil(prompt_tokens / SUMMARY_PIECE_TOKENS))
    piece_output = 2 * SUMMARY_PIECE_WORDS  # the server's reply cap for a piece
    reduce = replace(whole, prompt_tokens=count * piece_output)
    size = math.ceil(prompt_tokens / count)
    pieces = [
        Job(0.0, "summary", Kind.LLM, Priority.BACKGROUND, client, size, piece_output)
        for _ in range(count)
    ]
    pieces[-1] = replace(pieces[-1], then=reduce)
    return pieces


def _slo(raw: dict[str, float] | None) -> Slo:
    raw = raw or {}
    return Slo(ttft_ms=raw.get("ttft_ms"), itl_ms=raw.get("itl_ms"), stt_ms=raw.get("stt_ms"))
