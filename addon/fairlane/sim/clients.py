"""Fairness within a class, per member: what each one got beside the others against what the
same member's requests get alone on the device (rule 6; VTC's "Fairness in Serving LLMs").

A member's *service* is the tokens of their requests served per second, counted as the
background's are (the prompt of an answer that began, and every token out by the end); their
*latency* is TTFT. Beside the others each gets a fraction of what they get alone; Jain's index
over those fractions within a class is 1.0 when every member keeps the same fraction, and
falls toward 1/n as one member takes what the others lose. The simulator and `bench family`
report it alike (`rows`, `fairness`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from fairlane.policy import Kind
from fairlane.runtime.metrics import RequestRecord, jain, percentile
from fairlane.sim.workload import Workload

if TYPE_CHECKING:
    from fairlane.sim import Scenario
    from fairlane.sim.simulator import SimResult


def alone(workload: Workload, client: str) -> Workload:
    """The workload with only `client`'s requests (their spoken turns and closed loops)."""
    jobs = tuple(j for j in workload.jobs if j.client == client)
    loops = tuple(
        loop for loop in workload.loops if loop.units and loop.units[0][0].client == client
    )
    return replace(workload, jobs=jobs, loops=loops)


def members(workload: Workload) -> list[str]:
    """The members with interactive LLM work (typed, or a spoken command's turn)."""
    jobs = [*workload.jobs, *(u[0] for loop in workload.loops for u in loop.units)]
    found = {
        job.client
        for parent in jobs
        for job in (parent, parent.then)
        if job is not None and job.kind is Kind.LLM and job.priority.interactive
    }
    return sorted(found)


def rows(records: list[RequestRecord], duration_s: float) -> dict[str, dict[str, Any]]:
    """Per member and class: LLM requests, tokens served per second, TTFT p50 and p95 (ms)."""
    served: dict[tuple[str, str], list[RequestRecord]] = {}
    for record in records:
        if record.kind is Kind.LLM and record.priority.interactive:
            served.setdefault((record.client, record.priority.label), []).append(record)
    out: dict[str, dict[str, Any]] = {}
    for (client, label), mine in sorted(served.items()):
        tokens = 0
        for record in mine:
            received = sum(1 for t in record.token_times if t <= duration_s)
            if received:
                tokens += record.prompt_tokens + received
        ttfts = [r.ttft for r in mine if r.ttft is not None]
        out[client] = {
            "class": label,
            "requests": len(mine),
            "answered": len(ttfts),
            "tokens_per_s": round(tokens / duration_s, 1),
            "ttft_p50_ms": _ms(percentile(ttfts, 50)),
            "ttft_p95_ms": _ms(percentile(ttfts, 95)),
        }
    return out


def per_member(
    scn: Scenario, policy: str, mixed: SimResult, noise: float, seed: int
) -> dict[str, Any]:
    """The simulator's fairness case: `mixed` (the whole workload under `policy`) beside each
    interactive member's own requests simulated alone."""
    from fairlane.sim import simulate

    duration = scn.workload.duration_s
    together = rows(mixed.records, duration)
    by_itself: dict[str, dict[str, Any]] = {}
    for client in together:
        solo = replace(scn, workload=alone(scn.workload, client))
        found = rows(simulate(solo, policy, noise=noise, seed=seed).records, duration)
        if client in found:
            by_itself[client] = found[client]
    return fairness(together, by_itself)


def fairness(
    together: dict[str, dict[str, Any]], by_itself: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    """Each member's service beside the others as a fraction of their service alone, and
    Jain's index of those fractions within each class."""
    members_out: dict[str, dict[str, Any]] = {}
    per_class: dict[str, list[float]] = {}
    for client, row in together.items():
        solo = by_itself.get(client)
        if not solo or not solo["tokens_per_s"]:
            continue
        kept = row["tokens_per_s"] / solo["tokens_per_s"]
        members_out[client] = {
            **row,
            "alone_tokens_per_s": solo["tokens_per_s"],
            "alone_ttft_p50_ms": solo["ttft_p50_ms"],
            "alone_ttft_p95_ms": solo["ttft_p95_ms"],
            "service_kept": round(kept, 3),
        }
        per_class.setdefault(row["class"], []).append(kept)
    index = {label: jain(values) for label, values in per_class.items()}
    return {
        "members": members_out,
        "jain_within_class": {k: None if v is None else round(v, 3) for k, v in index.items()},
    }


def format_fairness(name: str, report: dict[str, Any]) -> str:
    """A member per line: service and TTFT beside the others and alone."""
    lines = [
        f"{name}: each member beside the others against alone "
        "(tokens/s served; TTFT p50 / p95 in ms)",
        f"  {'member':<14}{'class':<7}{'n':>4}{'tok/s':>8}{'alone':>8}{'kept':>7}"
        f"{'TTFT p50':>10}{'p95':>8}{'alone p50':>11}{'p95':>8}",
    ]

    def f(value: float | None) -> str:
        return "-" if value is None else f"{value:.0f}"

    for client, row in report["members"].items():
        lines.append(
            f"  {client:<14}{row['class']:<7}{row['requests']:>4}{row['tokens_per_s']:>8.1f}"
            f"{row['alone_tokens_per_s']:>8.1f}{row['service_kept']:>7.2f}"
            f"{f(row['ttft_p50_ms']):>10}{f(row['ttft_p95_ms']):>8}"
            f"{f(row['alone_ttft_p50_ms']):>11}{f(row['alone_ttft_p95_ms']):>8}"
        )
    jains = ", ".join(f"{k} {v}" for k, v in report["jain_within_class"].items())
    lines.append(f"  Jain's index of the service kept, within each class: {jains}")
    return "\n".join(lines)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 1)
