"""Household workloads: read a workload YAML (shared/workloads/family.yaml) into timed jobs.

The simulator and `fairlane bench family` read the same file.

Distributions: a fixed number, `{uniform: [lo, hi]}`, or `{lognormal: {median, p95}}`.
Arrivals: `{poisson: {per_min}}` or `{poisson_bursts: {bursts_per_min, burst_size, gap_s}}`.

What households have besides arrivals:
- `per_client`: a member's own distributions in a class (one sends long prompts, others short);
- `shared_prefix_tokens`: the leading part of a prompt that every request of the class shares
  (Home Assistant's system prompt); the rest of every prompt is unique;
- `audio_dir`: spoken commands from a folder of WAV files (relative to the workload file);
  their lengths replace `audio_s`;
- `in_flight` on documents and summaries, and `closed_loop` clients: a client that keeps N units
  of work going and sends the next when one ends, instead of all of it at once.
"""

from __future__ import annotations

import math
import random
import wave
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import voluptuous as vol
import yaml

from fairlane.documents.workers import SUMMARY_PIECE_WORDS, summary_pieces
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
_SIZES = {vol.Optional(k): _DIST for k in ("prompt_tokens", "output_tokens", "audio_s")}
_IN_FLIGHT = vol.All(int, vol.Range(min=1))
# A member's own arrivals, instead of a share of the class's: a Poisson rate of their own, or
# (chat) `in_flight`: a closed loop that keeps that many requests going, the next sent when
# one is answered (one member pasting long texts back to back, four at a time).
def _one_arrival_kind(own: dict[str, Any]) -> dict[str, Any]:
    if "arrivals" in own and "in_flight" in own:
        raise vol.Invalid("a member has its own arrivals or its own in_flight, not both")
    return own


_OWN_VOICE = {**_SIZES, vol.Optional("arrivals"): _ARRIVALS}
_OWN_CHAT = vol.All(
    {**_SIZES, vol.Optional("arrivals"): _ARRIVALS, vol.Optional("in_flight"): _IN_FLIGHT},
    _one_arrival_kind,
)
_SHARED = {vol.Optional("shared_prefix_tokens", default=0): vol.All(int, vol.Range(min=0))}
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
                vol.Optional("audio_dir"): str,
                vol.Required("llm_turn"): {**_LLM, **_SHARED},
                # The reply is spoken (by default): a sentence every `sentence_tokens` tokens,
                # each one speech-synthesis request of `ids_per_token` phoneme ids a token.
                vol.Optional("speak", default={}): {
                    vol.Optional("sentence_tokens", default=16): vol.All(int, vol.Range(min=1)),
                    vol.Optional("ids_per_token", default=8.0): vol.Coerce(float),
                },
                vol.Optional("slo"): _SLO,
                vol.Optional("per_client"): {str: _OWN_VOICE},
            },
            vol.Optional("chat"): {
                vol.Required("clients"): [str],
                vol.Required("arrivals"): _ARRIVALS,
                vol.Required("prompt_tokens"): _DIST,
                vol.Required("output_tokens"): _DIST,
                vol.Optional("slo"): _SLO,
                **_SHARED,
                vol.Optional("per_client"): {str: _OWN_CHAT},
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
                    vol.Optional("in_flight"): _IN_FLIGHT,
                },
                vol.Optional("summaries"): {
                    vol.Required("count"): int,
                    vol.Optional("client", default="summaries"): str,
                    vol.Optional("in_flight"): _IN_FLIGHT,
                    **_LLM,
                },
                vol.Optional("slo"): _SLO,
            },
        },
        vol.Optional("closed_loop", default=[]): [
            {
                vol.Required("client"): str,
                vol.Required("group"): vol.In(["chat", "automation", "summary"]),
                vol.Required("in_flight"): _IN_FLIGHT,
                **_LLM,
                **_SHARED,
            }
        ],
        vol.Optional("cpu_slo_scale", default=1.0): vol.Coerce(float),
    },
    extra=vol.PREVENT_EXTRA,  # a misspelt key is an error, not a workload that means less
)
_GROUP_PRIORITY = {
    "chat": Priority.CHAT,
    "automation": Priority.BACKGROUND,
    "summary": Priority.BACKGROUND,
}


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
    prefix_tokens: int = 0  # the first tokens of the prompt, shared with the class's others
    audio_file: str | None = None  # a spoken command's recording (bench family sends it)
    # A spoken reply: a sentence is complete every `sentence_tokens` tokens (and at the end),
    # and is then synthesised as one request of `ids_per_token` phoneme ids a token.
    sentence_tokens: int = 0
    ids_per_token: float = 0.0
    turn: int = -1  # a spoken turn's number, shared by its transcription, reply and sentences
    household: int = 0  # which home sent it, when several share one device (`households`)


@dataclass(frozen=True)
class Loop:
    """A closed loop: a client that keeps `in_flight` units going and starts the next when one
    ends (an indexer with N documents in flight, a member who types the next turn when the
    last is answered). A unit is one request, a document's chunks or a summary's pieces (with
    their `then`). Endless loops (`until`) start no unit after the workload's end."""

    name: str
    in_flight: int
    units: tuple[tuple[Job, ...], ...]
    until: float | None = None


@dataclass(frozen=True)
class Workload:
    name: str
    duration_s: float
    jobs: tuple[Job, ...]
    slo: dict[Priority, Slo] = field(default_factory=dict)
    cpu_slo_scale: float = 1.0
    loops: tuple[Loop, ...] = ()

    def cut(self, duration_s: float) -> Workload:
        """Only the arrivals before `duration_s` (endless loops end there too)."""
        loops = tuple(
            replace(loop, until=duration_s) if loop.until is not None else loop
            for loop in self.loops
        )
        jobs = tuple(j for j in self.jobs if j.at < duration_s)
        return replace(self, duration_s=duration_s, jobs=jobs, loops=loops)


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


def load(path: str | Path, summary_capacity: int | None = None) -> Workload:
    """Read and validate a workload file into jobs (deterministic for the file's seed);
    `summary_capacity`: the tokens the server lets one summary turn hold (its pieces follow
    from it, as the server's summariser cuts them; None: pieces of the remote lane's size)."""
    try:
        data = WORKLOAD_SCHEMA(yaml.safe_load(Path(path).read_text()))
    except vol.Invalid as err:
        raise ValueError(f"workload {path}: {err}") from err
    return build(data, Path(path).parent, summary_capacity)


def households(path: str | Path, count: int, summary_capacity: int | None = None) -> Workload:
    """`count` homes living the same kind of evening on one device: the workload drawn `count`
    times (seeds `seed`, `seed + 1`, …), each home's members and spoken turns its own, and each
    home's shared prompt prefix (its own Home Assistant's system prompt) its own."""
    if count < 1:
        raise ValueError("households: at least one")
    try:
        data = WORKLOAD_SCHEMA(yaml.safe_load(Path(path).read_text()))
    except vol.Invalid as err:
        raise ValueError(f"workload {path}: {err}") from err
    base = Path(path).parent
    homes = [
        build({**data, "seed": data["seed"] + home}, base, summary_capacity)
        for home in range(count)
    ]
    if count == 1:
        return homes[0]
    turns = 1 + max((j.turn for w in homes for j in w.jobs), default=0)

    def moved(job: Job, home: int) -> Job:
        return replace(
            job,
            client=f"{job.client}@{home}",
            household=home,
            turn=job.turn + home * turns if job.turn >= 0 else job.turn,
            then=moved(job.then, home) if job.then is not None else None,
        )

    jobs = sorted((moved(j, h) for h, w in enumerate(homes) for j in w.jobs), key=lambda j: j.at)
    loops = tuple(
        replace(
            loop,
            name=f"{loop.name}@{h}",
            units=tuple(tuple(moved(j, h) for j in unit) for unit in loop.units),
        )
        for h, w in enumerate(homes)
        for loop in w.loops
    )
    first = homes[0]
    return replace(first, name=f"{first.name} x{count}", jobs=tuple(jobs), loops=loops)


def _sizes(spec: dict[str, Any], client: str, part: str | None = None) -> dict[str, Any]:
    """The class's distributions (or its `part`'s), with the client's own where it has them."""
    own = (spec.get("per_client") or {}).get(client, {})
    return {**(spec[part] if part else spec), **own}


def _recordings(folder: Path) -> list[tuple[str, float]]:
    """The WAV files in `folder` (sorted) with their lengths in seconds."""
    found = []
    for path in sorted(folder.glob("*.wav")):
        with wave.open(str(path), "rb") as wav:
            found.append((str(path), wav.getnframes() / wav.getframerate()))
    if not found:
        raise ValueError(f"audio_dir {folder}: no .wav files")
    return found


def build(
    data: dict[str, Any], base: Path | None = None, summary_capacity: int | None = None
) -> Workload:
    sampler = Sampler(data["seed"])
    duration = data["duration_s"]
    classes = data["classes"]
    jobs: list[Job] = []
    loops: list[Loop] = []
    slo: dict[Priority, Slo] = {}

    if voice := classes.get("voice"):
        slo[Priority.VOICE] = _slo(voice.get("slo"))
        recordings = (
            _recordings((base or Path.cwd()) / voice["audio_dir"]) if "audio_dir" in voice else []
        )
        for index, (at, client) in enumerate(_arrivals(sampler, voice, duration)):
            sizes = _sizes(voice, client)
            turn = _sizes(voice, client, "llm_turn")
            reply = Job(
                at,
                "voice",
                Kind.LLM,
                Priority.VOICE,
                client,
                prompt_tokens=sampler.tokens(turn["prompt_tokens"]),
                output_tokens=sampler.tokens(turn["output_tokens"]),
                prefix_tokens=turn["shared_prefix_tokens"],
                sentence_tokens=voice["speak"]["sentence_tokens"],
                ids_per_token=voice["speak"]["ids_per_token"],
                turn=index,
            )
            audio_file, audio_s = (
                recordings[index % len(recordings)]
                if recordings
                else (None, sampler.draw(sizes["audio_s"]))
            )
            # `at` is the end of the utterance: STT's clock starts when the person stops talking.
            jobs.append(
                Job(
                    at,
                    "voice",
                    Kind.STT,
                    Priority.VOICE,
                    client,
                    audio_s=audio_s,
                    then=reply,
                    audio_file=audio_file,
                    turn=index,
                )
            )

    if chat := classes.get("chat"):
        slo[Priority.CHAT] = _slo(chat.get("slo"))
        for at, client in _arrivals(sampler, chat, duration):
            sizes = _sizes(chat, client)
            jobs.append(
                Job(
                    at,
                    "chat",
                    Kind.LLM,
                    Priority.CHAT,
                    client,
                    prompt_tokens=sampler.tokens(sizes["prompt_tokens"]),
                    output_tokens=sampler.tokens(sizes["output_tokens"]),
                    prefix_tokens=chat["shared_prefix_tokens"],
                )
            )

        for client, own in (chat.get("per_client") or {}).items():
            if "in_flight" in own:
                spec = {**_sizes(chat, client), "client": client, "group": "chat"}
                spec = {**spec, "in_flight": own["in_flight"]}
                loops.append(_closed_loop(f"{client}-chat", spec, sampler, duration))

    background = classes.get("background") or {}
    slo[Priority.BACKGROUND] = _slo(background.get("slo"))
    if docs := background.get("documents"):
        documents = []
        for _ in range(docs["count"]):
            tokens = sampler.tokens(docs["tokens_per_doc"])
            size = docs["chunk_tokens"]
            documents.append(
                tuple(
                    Job(
                        0.0,
                        "document",
                        Kind.EMBED,
                        Priority.BACKGROUND,
                        docs["client"],
                        prompt_tokens=min(size, tokens - start),
                    )
                    for start in range(0, tokens, size)
                )
            )
        if "in_flight" in docs:
            loops.append(Loop("documents", docs["in_flight"], tuple(documents)))
        else:
            jobs += [job for document in documents for job in document]
    if summaries := background.get("summaries"):
        units = [
            tuple(
                summary_jobs(
                    summaries["client"],
                    sampler.tokens(summaries["prompt_tokens"]),
                    sampler.tokens(summaries["output_tokens"]),
                    summary_capacity,
                )
            )
            for _ in range(summaries["count"])
        ]
        if "in_flight" in summaries:
            loops.append(Loop("summaries", summaries["in_flight"], tuple(units)))
        else:
            jobs += [job for unit in units for job in unit]
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

    for index, spec in enumerate(data.get("closed_loop", [])):
        loops.append(_closed_loop(f"{spec['client']}-{index}", spec, sampler, duration))

    jobs.sort(key=lambda j: j.at)
    return Workload(
        data["name"], duration, tuple(jobs), slo, data["cpu_slo_scale"], tuple(loops)
    )


def _arrivals(
    sampler: Sampler, spec: dict[str, Any], duration: float
) -> Iterator[tuple[float, str]]:
    """A class's arrivals and who sends each: the class's own arrivals, each drawn among its
    members who have none of their own, then each member's own rate. (A member with
    `in_flight` is a closed loop, built apart.) Drawn lazily, so that a workload without
    members' own arrivals draws exactly what it always drew."""
    own = spec.get("per_client") or {}
    shared = [c for c in spec["clients"] if not {"arrivals", "in_flight"} & set(own.get(c, {}))]
    if shared:
        for at in sampler.arrivals(spec["arrivals"], duration):
            yield at, sampler.rng.choice(shared)
    for client in spec["clients"]:
        if "arrivals" in own.get(client, {}):
            for at in sampler.arrivals(own[client]["arrivals"], duration):
                yield at, client


def _closed_loop(name: str, spec: dict[str, Any], sampler: Sampler, duration: float) -> Loop:
    """An endless client, drawn ahead: more units than it could send before the end (a unit
    takes at least one step of about a millisecond; at most 10,000 are drawn)."""
    units = []
    for _ in range(min(10_000, max(100, int(duration * 20)))):
        job = Job(
            0.0,
            spec["group"],
            Kind.LLM,
            _GROUP_PRIORITY[spec["group"]],
            spec["client"],
            prompt_tokens=sampler.tokens(spec["prompt_tokens"]),
            output_tokens=sampler.tokens(spec["output_tokens"]),
            prefix_tokens=spec["shared_prefix_tokens"],
        )
        units.append((job,))
    return Loop(name, spec["in_flight"], tuple(units), until=duration)


def summary_jobs(
    client: str, prompt_tokens: int, output_tokens: int, capacity: int | None = None
) -> list[Job]:
    """A summary as the server runs it: one turn if it fits a turn of `capacity` tokens, else
    the text in pieces (their turns batch together), then one turn over the pieces'
    summaries, which starts when the last piece is done."""
    whole = Job(0.0, "summary", Kind.LLM, Priority.BACKGROUND, client, prompt_tokens, output_tokens)
    count = summary_pieces(prompt_tokens, output_tokens, capacity)
    if count == 1:
        return [whole]
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
