"""`fairlane tune`: the useful configuration for a household, found rather than guessed.

"The useful configuration is the highest throughput that still meets the TTFT and streaming
targets in the interactive path." The tuner:

1. **calibrates** the cost model on this machine (`--calibrate`): times the real engines (a
   `fairlane bench engine` sweep of the LLM with KV occupancy, embedding batches, speech
   batches) and fits a cost profile the way `fairlane profile fit` fits the shipped ones,
   written as a profile YAML with its fit error in its header;
2. **searches** the policy settings in the simulator on the household's workload (coordinate
   descent from the defaults over slice, batch tokens, sequences, background share, arrival
   wait, embedding batch and speech batch): among the settings whose every interactive row
   meets its SLO for at least `--attainment` of its requests, the one with the most background
   work done; when none does, the one with the best attainment (and it says so);
3. **verifies** the best few on the real server (`--verify N`) with `bench family`'s mixed
   phase, and prints predicted beside measured;
4. **writes** the chosen settings as a configuration file `fairlane serve --config` reads.
"""

from __future__ import annotations

import json
import shlex
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from fairlane.policy import Priority

# The settings searched, each with its candidate values (the server's default among them).
SEARCH_SPACE: dict[str, tuple[float, ...]] = {
    "slice_ms": (25, 50, 100, 200),
    "arrival_wait_fraction": (0.1, 0.25, 0.4),
    "max_batch_tokens": (512, 1024, 2048),
    "max_num_seqs": (4, 8),
    "background_min_share": (0.05, 0.1, 0.2, 0.3),
    "embed_max_batch": (16, 32, 64),
    "stt_max_batch": (1, 4, 8),
}
INTEGER_SETTINGS = {"max_batch_tokens", "max_num_seqs", "embed_max_batch", "stt_max_batch"}


def typed(settings: dict[str, float]) -> dict[str, int | float]:
    """The settings as the policy configuration takes them (counts as integers)."""
    return {k: int(v) if k in INTEGER_SETTINGS else float(v) for k, v in settings.items()}


# --- calibration ----------------------------------------------------------------------------------


def _line(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares intercept and slope of y on x (intercept clamped at zero)."""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / spread if spread else 0.0
    return max(0.0, mean_y - slope * mean_x), max(0.0, slope)


# The sweep `--calibrate` runs: the shapes the shipped CPU profile was fitted from
# (profiles/data/README.md), so a calibrated profile has every term of the cost model.
SWEEP: dict[str, Any] = {
    "prefill_sizes": (16, 64, 256, 512),
    "decode_sizes": (1, 2, 4, 8),
    "context_sizes": (512, 2048),
    "occupancy": ((1, 512), (2, 1024), (4, 1024)),
    # A long prompt's later chunks (a summary's text in one turn): what separates the cost of
    # a prompt token from its attention to the cells before it.
    "prefill_after": ((256, 1024), (256, 2048)),
}


def calibrate(
    threads: int, fixtures: Path, out: Path, base: str = "cpu-2core", name: str = "this-machine"
) -> str:
    """Time the real engines on this machine and fit a cost profile: the LLM's terms from a
    `fairlane bench engine` sweep (kept beside the profile as `<out>.engine.json`, the data
    `fairlane profile fit` can refit from), the embedder's and Whisper's from steps of several
    sizes, synthesis from `base`. Returns the profile's YAML, its fit error in the header."""
    from fairlane.bench.llm import engine_costs
    from fairlane.policy.cost import EmbedCost, HostCost, SttCost
    from fairlane.profiles import load
    from fairlane.profiles.fit import fit_profile

    sweep = out.with_suffix(".engine.json")
    sweep.parent.mkdir(parents=True, exist_ok=True)
    sweep.write_text(json.dumps(engine_costs(threads, **SWEEP), indent=1))
    embed_base, embed_token = _embed_costs(threads)
    start, _ = load(base)
    stt_base, stt_utterance = _stt_costs(threads, fixtures, start.stt.audio_s_ms)
    round_trip = _round_trip_ms(threads)
    text, _ = fit_profile(
        [sweep],
        base,
        name,
        f"calibrated with {threads} threads on {time.strftime('%Y-%m-%d')}",
        command="fairlane " + shlex.join(sys.argv[1:]),
        measured={
            "embed": EmbedCost(round(embed_base, 2), round(embed_token, 4)),
            "stt": SttCost(round(stt_base, 1), round(stt_utterance, 1), start.stt.audio_s_ms),
            "host": HostCost(round(round_trip, 1)),
        },
    )
    return text


def _embed_costs(threads: int) -> tuple[float, float]:
    """Embedding steps of the shapes the server runs, after one untimed: a document's chunks
    (`documents.text.CHUNK_TOKENS`) in batches of 1 to 16, and short texts: (base ms, ms per
    padded token). A chunk's token costs more than a short text's (attention over the chunk),
    so the line is fitted where the household's documents put it."""
    from fairlane.documents.text import CHUNK_TOKENS
    from fairlane.engines import models
    from fairlane.engines.embed import EmbedConfig, EmbeddingEngine
    from fairlane.policy import EmbedPlan

    engine = EmbeddingEngine(
        EmbedConfig(models.resolve_embedder(models.DEFAULT_EMBED), threads=threads)
    )
    text = " ".join(["the kitchen light is on"] * 60)
    shapes = [(1, 32), (16, 32), *((n, CHUNK_TOKENS) for n in (1, 2, 4, 8, 16))]
    points = []
    for batch, tokens in [(4, CHUNK_TOKENS), *shapes]:
        ids = engine.tokenize([text] * batch)
        times = []
        for repeat in range(5):
            names = [f"e{repeat}-{i}" for i in range(batch)]
            for rid, token_ids in zip(names, ids, strict=True):
                engine.add(rid, token_ids[:tokens])
            result, _ = engine.execute(
                EmbedPlan(tuple(names), Priority.BACKGROUND, batch * tokens, 0.0)
            )
            times.append(result.elapsed_s * 1000)
        points.append((float(batch * tokens), statistics.median(times)))
    return _line(points[1:])  # the first shape warmed the engine up


def _round_trip_ms(threads: int, rounds: int = 20) -> float:
    """A client's round trip on this machine, which no step's cost holds (the simulator's
    `host.round_trip_ms`): a real server's embeddings request, a document's chunks as an
    indexer sends them, timed by its client, less the device time the server's stats count
    for it; the median over `rounds`."""
    from fairlane.bench.family_targets import FairlaneTarget
    from fairlane.bench.llm import MANUAL

    words = (MANUAL * 20).split()
    chunks = [" ".join(words[i : i + 150]) for i in range(0, 750, 150)]  # ~200 tokens each
    target = FairlaneTarget("fairlane", threads)
    try:
        target.embed(chunks, "calibrate")  # the first request pays one-time set-up
        gaps = []
        for round_ in range(rounds):
            busy = target.stats()["device"]["busy_s_total"]
            start = time.perf_counter()
            target.embed([f"{round_}: {chunk}" for chunk in chunks], "calibrate")
            wall = time.perf_counter() - start
            gaps.append(wall - (target.stats()["device"]["busy_s_total"] - busy))
    finally:
        target.close()
    return float(statistics.median(gaps)) * 1000


def _stt_costs(threads: int, fixtures: Path, audio_s_ms: float) -> tuple[float, float]:
    """Speech steps of 1, 2 and 4 utterances: (base ms, ms per utterance), the profile's
    `audio_s_ms` for each second of audio set apart."""
    from fairlane.engines import models
    from fairlane.engines.stt import SttConfig, Utterance, WhisperEngine, decode_audio
    from fairlane.policy import SttPlan

    engine = WhisperEngine(
        SttConfig(Path(models.resolve_stt(models.DEFAULT_STT)), threads=threads)
    )
    audio = [decode_audio(p.read_bytes()) for p in sorted(fixtures.glob("*.wav"))[:4]]
    if not audio:
        raise ValueError(f"no recordings in {fixtures} to time speech steps")
    points = []
    for batch in (1, 1, 2, 4):  # the first, untimed, warms the engine up
        times = []
        for repeat in range(3):
            utterances = [Utterance(audio[i % len(audio)], "en") for i in range(batch)]
            names = [f"s{repeat}-{i}" for i in range(batch)]
            for rid, utterance in zip(names, utterances, strict=True):
                engine.add(rid, utterance)
            seconds = sum(u.duration_s for u in utterances)
            result, _ = engine.execute(SttPlan(tuple(names), Priority.VOICE, seconds, 0.0))
            times.append(result.elapsed_s * 1000 - audio_s_ms * seconds)
        points.append((float(batch), statistics.median(times)))
    return _speech_line(points[1:])


def _speech_line(points: list[tuple[float, float]]) -> tuple[float, float]:
    """A speech step's base and per-utterance cost from steps of 1, 2 and 4 utterances.

    Where batching pays, the least-squares line. Where it does not (every batch costs at
    least its utterances one by one, as Whisper on a 2-core CPU), a line through the points
    prices the usual step, one utterance, 10-25% high; then an utterance costs what one alone
    did, and nothing is shared."""
    one = statistics.fmean(y for x, y in points if x == 1)
    if all(y >= x * one for x, y in points):
        return 0.0, one
    return _line(points)


# --- the search -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Trial:
    settings: dict[str, float]
    attainment: dict[str, float]  # interactive row -> fraction of requests within the SLO
    background_llm_tokens_per_s: float
    embedded_tokens_per_s: float

    @property
    def worst(self) -> float:
        return min(self.attainment.values(), default=1.0)

    def feasible(self, attainment: float) -> bool:
        return self.worst >= attainment

    def score(self, attainment: float) -> tuple[bool, float]:
        """Feasible settings by background work; the others by their worst attainment."""
        if self.feasible(attainment):
            return True, self.background_llm_tokens_per_s
        return False, self.worst


def evaluate(scenario: Any, settings: dict[str, float], seed: int = 0) -> Trial:
    """One setting in the simulator: the real policy on the profile's costs."""
    from fairlane.sim import Scenario, simulate
    from fairlane.sim.report import background_done, summarize

    config = replace(scenario.config, **typed(settings))
    trial = Scenario(scenario.workload, scenario.profile, config)
    result = simulate(trial, "fairlane", seed=seed)
    report = summarize(result, scenario.workload.slo)
    attainment = {
        name: row["slo_met"]
        for name, row in report["classes"].items()
        if not name.startswith("background") and row["slo_met"] is not None
    }
    llm, embedded = background_done(result.records, scenario.workload.duration_s)
    return Trial(dict(settings), attainment, round(llm, 1), round(embedded))


def search(
    scenario: Any,
    attainment: float,
    passes: int = 2,
    space: dict[str, tuple[float, ...]] | None = None,
    progress: Any = print,
) -> list[Trial]:
    """Coordinate descent from the scenario's settings: each setting in turn takes the value
    that scores best with the others held; `passes` times over. Every trial is returned, the
    best first."""
    space = space or SEARCH_SPACE
    current = {name: float(getattr(scenario.config, name)) for name in space}
    seen: dict[tuple[tuple[str, float], ...], Trial] = {}

    def run(settings: dict[str, float]) -> Trial:
        key = tuple(sorted(settings.items()))
        if key not in seen:
            seen[key] = evaluate(scenario, settings)
            trial = seen[key]
            progress(
                f"  {_describe(settings)}: worst SLO met {trial.worst:.0%}, "
                f"background {trial.background_llm_tokens_per_s} LLM tok/s, "
                f"{trial.embedded_tokens_per_s} embedded tok/s"
            )
        return seen[key]

    best = run(current)
    for _ in range(passes):
        changed = False
        for name, values in space.items():
            for value in values:
                candidate = {**current, name: float(value)}
                trial = run(candidate)
                if trial.score(attainment) > best.score(attainment):
                    best, current, changed = trial, candidate, True
        if not changed:
            break
    return sorted(seen.values(), key=lambda t: t.score(attainment), reverse=True)


# A recommendation must beat the server's own settings by this much background work in the
# simulator: a smaller gain is within what one simulated evening can tell (5% step noise, a
# backlog whose summaries end where they end), and a change the simulator cannot tell apart
# from the defaults is not worth a household's configuration file.
MARGIN = 0.05


def recommend(
    trials: list[Trial], defaults: Trial, attainment: float, margin: float = MARGIN
) -> tuple[Trial, str]:
    """The settings to write, and why: the best trial (`search`'s first), unless the server's
    defaults meet the SLOs too and the best does not beat their background work by `margin`."""
    best = trials[0]
    if best is defaults or not defaults.feasible(attainment):
        return best, "the best found"
    gain = best.background_llm_tokens_per_s / max(defaults.background_llm_tokens_per_s, 1e-9) - 1
    if gain < margin:
        return defaults, (
            f"the defaults kept: the best found ({_describe(best.settings)}) does {gain:+.1%} "
            f"background LLM work, within the {margin:.0%} the simulator can tell"
        )
    return best, f"the best found: {gain:+.1%} background LLM work over the defaults"


def _describe(settings: dict[str, float]) -> str:
    return ", ".join(f"{k}={v:g}" for k, v in sorted(typed(settings).items()))


def config_file(settings: dict[str, float], note: str) -> str:
    """The chosen settings as a `fairlane serve --config` file."""
    return f"# {note}\n" + yaml.safe_dump({"policy": typed(settings)}, sort_keys=True)


def verify(
    workload: Any, trials: list[Trial], threads: int, fixtures: Path
) -> list[dict[str, Any]]:
    """The best settings on the real server (bench family's mixed phase): measured beside
    predicted."""
    from fairlane.bench.family import warm_up
    from fairlane.bench.family_load import Prompts, recordings
    from fairlane.bench.family_play import Played, Player
    from fairlane.bench.family_report import summarize
    from fairlane.bench.family_targets import FairlaneTarget

    audio = recordings(workload, fixtures)
    prompts = Prompts(seed=0)
    rows = []
    for trial in trials:
        target = FairlaneTarget("fairlane", threads, {"policy": typed(trial.settings)})
        try:
            warm_up(target, workload, prompts, audio)
            played = Played("fairlane", "mixed", 1, workload.duration_s)
            Player(target, workload, prompts, audio, played, 60.0).play("mixed")
        finally:
            target.close()
        report = summarize(played, workload.slo)
        measured = {
            name: row["slo_met"]
            for name, row in report["classes"].items()
            if not name.startswith("background")
        }
        rows.append(
            {
                "settings": trial.settings,
                "predicted": {
                    "attainment": trial.attainment,
                    "background_llm_tokens_per_s": trial.background_llm_tokens_per_s,
                    "embedded_tokens_per_s": trial.embedded_tokens_per_s,
                },
                "measured": {
                    "attainment": measured,
                    "background_llm_tokens_per_s": report["background_llm_tokens_per_s"],
                    "embedded_tokens_per_s": report["embedded_tokens_per_s"],
                },
            }
        )
    return rows


def format_verification(rows: list[dict[str, Any]]) -> str:
    lines = [
        f"{'settings':<60}{'':>10}{'worst SLO met':>14}{'bg LLM tok/s':>14}{'embed tok/s':>13}"
    ]
    for row in rows:
        for which in ("predicted", "measured"):
            figures = row[which]
            worst = min(figures["attainment"].values(), default=1.0)
            lines.append(
                f"{_describe(row['settings']) if which == 'predicted' else '':<60}"
                f"{which:>10}{worst:>14.0%}{figures['background_llm_tokens_per_s']:>14}"
                f"{figures['embedded_tokens_per_s']:>13}"
            )
    return "\n".join(lines)
