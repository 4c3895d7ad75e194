"""The simulator played as `bench family` plays a server: the same phases of the same workload,
turned into the same report by the same code (`family_report.summarize`), so that a simulated
evening and a measured one can be set side by side row by row (`fit`).

A phase's workload is the requests `bench family` sends in it (`phase_workload`), played after
what the bench's server heard before it (its warm-up, the earlier phases: the policy's
forecasts of who is talking begin from them); the simulated device runs at a profile's costs,
with the host's client round trip of the profile (`host.round_trip_ms`) between an answer and
the client's next request. What the server reports of itself is read from the simulation the
way the server counts it: the LLM's busy share and its interactive part, each background
lane's share, the background LLM tokens computed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from fairlane.bench.family import SETTLE_S, WARM_UP_TOKENS, warm_up_chats
from fairlane.bench.family_play import Played, in_phase
from fairlane.bench.family_report import summarize
from fairlane.policy import CostModel, Kind, PolicyConfig, Priority
from fairlane.profiles import load as load_profile
from fairlane.runtime.prediction import durations
from fairlane.sim import Scenario, simulate
from fairlane.sim.report import background_done
from fairlane.sim.simulator import Heard, SimResult
from fairlane.sim.workload import Job, Workload

# How long a client waits for an interactive answer after the phase (`bench family`'s default).
GIVE_UP_S = 60.0


def phase_workload(workload: Workload, phase: str) -> Workload:
    """The requests `bench family` sends in `phase` (interactive, background or mixed). The
    bench transcribes a spoken command and sends its reply turn, but does not speak the reply:
    the replies' sentences are not synthesised here either."""
    jobs = tuple(_unspoken(j) for j in workload.jobs if in_phase(j, phase))
    loops = tuple(loop for loop in workload.loops if in_phase(loop.units[0][0], phase))
    return replace(workload, jobs=jobs, loops=loops)


def _unspoken(job: Job) -> Job:
    """The job and its chain, with no reply spoken."""
    then = _unspoken(job.then) if job.then is not None else None
    return replace(job, sentence_tokens=0, then=then)


def simulate_phase(
    workload: Workload,
    phase: str,
    profile: str,
    config: PolicyConfig,
    policy: str = "fairlane",
    seed: int = 0,
    noise: float = 0.05,
    history: Sequence[Heard] = (),
) -> SimResult:
    """One phase on the simulated device: `policy` planning with `profile`'s costs, the
    interactive work's tail given `GIVE_UP_S` after the phase as the bench gives it, its
    forecasts begun from what the server heard before the phase (`history`)."""
    scn = Scenario(phase_workload(workload, phase), profile, config)
    return simulate(
        scn, policy, noise, seed, max_time=workload.duration_s + GIVE_UP_S, history=history
    )


def warm_up_heard(workload: Workload, profile: str) -> list[Heard]:
    """The interactive requests of `bench family`'s warm-up (`family.warm_up`), one after the
    other at the profile's costs, the last answered as the first phase begins."""
    cost = CostModel(load_profile(profile)[0])
    steps = [
        (Kind.LLM, job.priority, cost.llm_s(job.prompt_tokens, 0, job.prompt_tokens,
                                            job.prompt_tokens)
         + WARM_UP_TOKENS * cost.llm_s(0, 1, job.prompt_tokens, job.prompt_tokens))
        for job in warm_up_chats(workload)
    ]
    spoken = [job for job in workload.jobs if job.kind is Kind.STT]
    if spoken:
        steps.append((Kind.STT, spoken[0].priority, cost.stt_s(1, spoken[0].audio_s)))
    heard, at = [], 0.0
    for kind, priority, seconds in reversed(steps):
        at -= seconds
        heard.append((at, kind, priority))
    return heard


def heard_after(result: SimResult, history: Sequence[Heard], duration_s: float) -> list[Heard]:
    """What the server has heard when the next phase begins: `history` and this phase's
    interactive requests, moved back by the phase, its interactive tail and the bench's
    pause between phases."""
    interactive = [r for r in result.records if r.priority.interactive]
    tail = max((r.finished_at or r.arrival for r in interactive), default=0.0)
    shift = max(duration_s, tail) + SETTLE_S
    arrivals = [*history, *((r.arrival, r.kind, r.priority) for r in interactive)]
    return [(at - shift, kind, priority) for at, kind, priority in arrivals]


def played(
    result: SimResult,
    target: str,
    phase: str,
    round_index: int,
    duration_s: float,
    slice_s: float,
) -> Played:
    """A simulated phase as `bench family` records a played one (`slice_s`: the policy's
    slice, which the background steps are reported beside)."""
    out = Played(target, phase, round_index, duration_s, records=list(result.records))
    out.turns = list(result.turns)
    llm, embedded = background_done(result.records, duration_s)
    out.background_llm_tokens = round(llm * duration_s)
    out.embedded_tokens = round(embedded * duration_s)
    summaries = [(tokens, at) for loop, tokens, at in result.units_done if loop == "summaries"]
    out.summaries_done = sum(1 for _, at in summaries if at <= duration_s)
    out.summarised_tokens = sum(tokens for tokens, at in summaries if at <= duration_s)
    # What the server says of itself over the phase (its stats before and after it).
    steps = [s for s in result.steps if s.end <= duration_s]
    busy = sum(s.end - s.start for s in steps)
    interactive = sum(s.end - s.start for s in steps if any(p.interactive for p in s.seconds))
    out.device_busy = round(busy / duration_s, 3)
    out.interactive_busy = round(interactive / duration_s, 3)
    # The background-only steps per lane: their share of the phase and their lengths, as the
    # server's stats give them (`background_busy_s_total`, `background_steps`).
    lengths: dict[str, list[float]] = {kind: [] for kind in ("llm", "stt", "tts", "embed")}
    for step in steps:
        if step.seconds and not any(p.interactive for p in step.seconds):
            lengths[step.kind.value].append(step.end - step.start)
    out.background_busy = {kind: round(sum(v) / duration_s, 3) for kind, v in lengths.items()}
    lengths = {kind: values for kind, values in lengths.items() if values}
    out.background_steps = {
        "sim": {kind: durations(values, slice_s) for kind, values in lengths.items()}
    }
    out.background_llm_computed = sum(s.tokens.get(Priority.BACKGROUND, 0) for s in steps)
    return out


def simulated(
    workload: Workload,
    phases: list[str],
    profile: str,
    config: PolicyConfig,
    rounds: int = 1,
    policy: str = "fairlane",
    noise: float = 0.05,
) -> list[dict[str, Any]]:
    """`bench family`'s reports for the simulator (target `simulator`), one round per seed."""
    reports = []
    for round_index in range(1, rounds + 1):
        # The bench plays its phases one after the other on one server, after its warm-up.
        history = warm_up_heard(workload, profile)
        for phase in phases:
            result = simulate_phase(
                workload, phase, profile, config, policy, round_index - 1, noise, history
            )
            record = played(
                result, "simulator", phase, round_index, workload.duration_s, config.slice_s
            )
            reports.append(summarize(record, workload.slo))
            history = heard_after(result, history, workload.duration_s)
    return reports


# The bounds the simulator must keep to the server: SLO attainment and device shares within
# 5 points, rates and latencies within 15%.
POINTS, RELATIVE = 0.05, 0.15


def _rows(report: dict[str, Any]) -> dict[str, float | None]:
    """One phase report's comparable figures, by row name."""
    out: dict[str, float | None] = {}
    for name, row in report["classes"].items():
        if name.startswith("background"):
            continue
        out[f"{name} SLO met"] = row["slo_met"]
        out[f"{name} TTFT p50 ms"] = row["ttft_ms"]["p50"]
    if report["phase"] != "interactive":
        out["background LLM computed tok/s"] = report["background_llm_computed_per_s"]
        out["embedded tok/s"] = report["embedded_tokens_per_s"]
        for lane in ("llm", "embed"):
            out[f"background {lane} device share"] = report["background_busy"].get(lane)
        # The background-only steps' median length (the server's one device loop; a diagnostic
        # of how the device time was cut, not a figure a household feels).
        loops = list(report.get("background_steps", {}).values())
        for lane in ("llm", "embed"):
            step = loops[0].get(lane, {}) if len(loops) == 1 else {}
            out[f"background {lane} step p50 ms"] = step.get("p50_ms")
    if report["phase"] != "background":
        out["interactive device share"] = report["interactive_busy"]
    return out


def fit(
    measured: list[dict[str, Any]], predicted: list[dict[str, Any]], target: str = "fairlane"
) -> list[dict[str, Any]]:
    """Per phase and row: the server's rounds (of `target`), their mean, the simulator's mean
    and whether it is within the bound (5 points for a share or an SLO attainment, 15% for a
    rate or a latency)."""
    out = []
    for phase in dict.fromkeys(r["phase"] for r in predicted):
        server = [_rows(r) for r in measured if r["target"] == target and r["phase"] == phase]
        sim = [_rows(r) for r in predicted if r["phase"] == phase]
        if not server or not sim:
            continue
        for name in sim[0]:
            rounds = [row.get(name) for row in server]
            values = [v for v in rounds if v is not None]
            guesses = [v for row in sim if (v := row.get(name)) is not None]
            if not values or not guesses:
                continue
            mean, guess = sum(values) / len(values), sum(guesses) / len(guesses)
            points = "SLO" in name or "share" in name
            gap = guess - mean if points else (guess - mean) / mean if mean else None
            within = gap is not None and abs(gap) <= (POINTS if points else RELATIVE)
            out.append({
                "phase": phase,
                "row": name,
                "server": rounds,
                "server_mean": round(mean, 3),
                "simulator": round(guess, 3),
                "gap": None if gap is None else round(gap, 3),
                "bound": "points" if points else "relative",
                "within": within,
            })
    return out


def format_fit(rows: list[dict[str, Any]]) -> str:
    """The simulator beside the server, a row per figure, and how many rows are within."""
    lines = [
        f"{'phase':<13}{'row':<34}{'server rounds':>22}{'simulator':>11}{'gap':>9}  within",
    ]

    def f(value: float | None) -> str:
        return "-" if value is None else f"{value:.3g}"

    for row in rows:
        gap = row["gap"]
        said = "-" if gap is None else (
            f"{100 * gap:+.0f} pt" if row["bound"] == "points" else f"{gap:+.0%}"
        )
        lines.append(
            f"{row['phase']:<13}{row['row']:<34}{', '.join(f(v) for v in row['server']):>22}"
            f"{f(row['simulator']):>11}{said:>9}  {'yes' if row['within'] else 'NO'}"
        )
    hits = sum(r["within"] for r in rows)
    lines.append(f"within 5 points / 15%: {hits} of {len(rows)} rows")
    return "\n".join(lines)

