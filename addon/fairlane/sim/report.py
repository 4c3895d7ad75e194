"""Turn a simulation into the figures people feel: per-class latency, goodput, shares, fairness."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from fairlane.policy import Kind, Priority, Slo
from fairlane.runtime.metrics import RequestRecord, jain, percentile
from fairlane.sim.simulator import SimResult, Step

QUANTILES = (50, 95, 99)


def _ms(values: list[float]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for q in QUANTILES:
        value = percentile(values, q)
        out[f"p{q}"] = None if value is None else round(value * 1000, 1)
    return out


def row_name(record: RequestRecord) -> str:
    return f"{record.priority.label}/{record.kind.value}"


def background_done(records: list[RequestRecord], duration_s: float) -> tuple[float, float]:
    """Background work done within the workload's duration, per second, counted as `bench
    family` counts it on a real server: LLM tokens (the prompt of an answer that began, and
    every token out by then: a summary cut at the end counts what it got through) and the
    tokens of embedding requests finished."""
    llm = embedded = 0
    for record in records:
        if record.priority.interactive:
            continue
        if record.kind is Kind.EMBED:
            if record.finished_at is not None and record.finished_at <= duration_s:
                embedded += record.prompt_tokens
            continue
        received = sum(1 for t in record.token_times if t <= duration_s)
        if received:
            llm += record.prompt_tokens + received
    return llm / duration_s, embedded / duration_s


def summarize(
    result: SimResult, slo: dict[Priority, Slo], duration_s: float | None = None
) -> dict[str, Any]:
    """The report as plain data (also what `--json` writes); `duration_s` (the workload's) adds
    the background work finished within it."""
    busy = sum(s.end - s.start for s in result.steps)
    span = result.end_time or 1.0
    shares: dict[Priority, float] = defaultdict(float)
    for step in result.steps:
        for priority, seconds in step.seconds.items():
            shares[priority] += seconds

    rows: dict[str, list[RequestRecord]] = defaultdict(list)
    for record in result.records:
        rows[row_name(record)].append(record)

    classes: dict[str, Any] = {}
    for name in sorted(rows, key=lambda n: (Priority.parse(n.split("/")[0]), n)):
        records = rows[name]
        done = [r for r in records if r.finished_at is not None]
        priority = records[0].priority
        target = slo.get(priority, Slo())
        met = [r for r in done if r.met(target)]
        last = max((r.finished_at for r in done if r.finished_at is not None), default=0.0)
        outputs = sum(len(r.token_times) for r in done)
        classes[name] = {
            "requests": len(records),
            "finished": len(done),
            "refused": sum(1 for r in records if r.refused),
            "ttft_ms": _ms([t for r in done if (t := r.ttft) is not None]),
            "itl_ms": _ms([g for r in done for g in r.itl]),
            "e2e_ms": _ms([t for r in done if (t := r.e2e) is not None]),
            "slo_met": round(len(met) / len(records), 3) if records else None,
            "goodput_rps": round(len(met) / span, 4),
            "throughput": {
                "requests_per_s": round(len(done) / span, 4),
                "output_tokens_per_s": round(outputs / span, 2),
                "input_tokens_per_s": round(sum(r.prompt_tokens for r in done) / span, 1),
            },
            "last_finished_s": round(last, 2),
        }

    background = [r for r in result.records if r.priority is Priority.BACKGROUND]
    background_done = [r for r in background if r.finished_at is not None]
    # The backlog is the background work present at t=0 (documents to index, summaries):
    # how fast it drains is the background lane's throughput.
    backlog = [r for r in background_done if r.arrival == 0.0]
    work = sum(r.prompt_tokens + len(r.token_times) for r in backlog)
    drain = max((r.finished_at for r in backlog if r.finished_at is not None), default=0.0)
    return {
        "policy": result.policy,
        "simulated_s": round(result.end_time, 2),
        "drained": result.drained,
        "device_busy_fraction": round(busy / span, 3),
        "device_share": {p.label: round(shares[p] / busy, 3) if busy else 0.0 for p in Priority},
        "classes": classes,
        "background": {
            "done_fraction": round(len(background_done) / len(background), 3)
            if background
            else 1.0,
            "backlog_drain_s": round(drain, 2),
            # Tokens of backlog work (prompt, output and embedded) per second until it drained.
            "backlog_tokens_per_s": round(work / drain, 1) if drain else 0.0,
            **_within(result.records, duration_s),
        },
        "fairness": {"jain_slo_attainment": _fairness(result.records, slo)},
        **_spoken(result),
    }


FIRST_AUDIO_GOAL_S = 2.0  # a voice satellite gives up when the first audio takes longer


def _spoken(result: SimResult) -> dict[str, Any]:
    """Spoken turns: end of speech → the end of the first sentence's synthesis."""
    if not result.first_audio:
        return {}
    waits = [audio - speech for speech, audio in result.first_audio.values()]
    within = sum(1 for w in waits if w <= FIRST_AUDIO_GOAL_S)
    return {
        "spoken": {
            "turns": len(waits),
            "first_audio_ms": _ms(waits),
            "within_2s": round(within / len(waits), 3),
        }
    }


def _within(records: list[RequestRecord], duration_s: float | None) -> dict[str, float]:
    if not duration_s:
        return {}
    llm, embedded = background_done(records, duration_s)
    return {"llm_tokens_per_s": round(llm, 1), "embedded_tokens_per_s": round(embedded)}


def _fairness(records: list[RequestRecord], slo: dict[Priority, Slo]) -> float | None:
    """Jain's index over clients of the fraction of their interactive requests that met the SLO.

    1.0 means every household member is served equally well; 1/n means one is served and the
    rest are not.
    """
    per_client: dict[str, list[bool]] = defaultdict(list)
    for record in records:
        if record.priority.interactive:
            per_client[record.client].append(record.met(slo.get(record.priority, Slo())))
    attainment = [sum(v) / len(v) for v in per_client.values() if v]
    value = jain(attainment)
    return None if value is None else round(value, 3)


def format_table(reports: list[dict[str, Any]]) -> str:
    """Side-by-side text table of several policies' reports on the same workload."""
    lines = []
    header = (
        f"{'policy':<16}{'row':<17}{'n':>5}{'TTFT p50':>10}{'p95':>9}{'p99':>9}"
        f"{'ITL p50':>9}{'p95':>8}{'p99':>8}{'E2E p95':>10}{'SLO met':>9}{'tok/s':>9}"
    )
    lines.append(header)
    lines.append("-" * len(header))

    def f(value: float | None) -> str:
        return "-" if value is None else f"{value:.0f}"

    for report in reports:
        for name, row in report["classes"].items():
            out_rate = row["throughput"]["output_tokens_per_s"]
            met = row["slo_met"]
            lines.append(
                f"{report['policy']:<16}{name:<17}{row['requests']:>5}"
                f"{f(row['ttft_ms']['p50']):>10}{f(row['ttft_ms']['p95']):>9}"
                f"{f(row['ttft_ms']['p99']):>9}"
                f"{f(row['itl_ms']['p50']):>9}{f(row['itl_ms']['p95']):>8}"
                f"{f(row['itl_ms']['p99']):>8}{f(row['e2e_ms']['p95']):>10}"
                f"{'-' if met is None else f'{met:.0%}':>9}{out_rate:>9.1f}"
            )
    lines.append("")
    for report in reports:
        share = ", ".join(f"{k} {v:.0%}" for k, v in report["device_share"].items())
        bg = report["background"]
        within = (
            f"; within the workload {bg['llm_tokens_per_s']} background LLM tok/s, "
            f"{bg['embedded_tokens_per_s']} embedded tok/s"
            if "llm_tokens_per_s" in bg
            else ""
        )
        lines.append(
            f"{report['policy']}: device busy {report['device_busy_fraction']:.0%} ({share}); "
            f"background {bg['done_fraction']:.0%} done, backlog drained at "
            f"{bg['backlog_drain_s']:.1f} s ({bg['backlog_tokens_per_s']:.0f} tok/s){within}; "
            "Jain (SLO attainment across clients) "
            f"{report['fairness']['jain_slo_attainment']}"
        )
    for report in reports:
        if spoken := report.get("spoken"):
            audio = spoken["first_audio_ms"]
            lines.append(
                f"{report['policy']}: spoken turns {spoken['turns']}, end of speech → first "
                f"audio p50 {f(audio['p50'])} / p95 {f(audio['p95'])} / p99 {f(audio['p99'])} "
                f"ms, within {FIRST_AUDIO_GOAL_S:.0f} s {spoken['within_2s']:.0%}"
            )
    first = reports[0]
    for other in reports[1:]:
        if other["background"]["backlog_tokens_per_s"]:
            ratio = (
                first["background"]["backlog_tokens_per_s"]
                / other["background"]["backlog_tokens_per_s"]
            )
            lines.append(
                f"background backlog throughput {first['policy']} / {other['policy']}: "
                f"{ratio:.2f}"
            )
    return "\n".join(lines)


def plot(results: list[SimResult], path: Path, bin_s: float = 5.0) -> None:
    """Per-class TTFT CDFs and a device-occupancy timeline for each policy, as one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {Priority.VOICE: "#d62728", Priority.CHAT: "#1f77b4", Priority.BACKGROUND: "#7f7f7f"}
    fig, axes = plt.subplots(2, len(results), figsize=(6.5 * len(results), 8), squeeze=False)
    for col, result in enumerate(results):
        cdf = axes[0][col]
        rows: dict[str, list[float]] = defaultdict(list)
        for record in result.records:
            if record.priority.interactive and (t := record.ttft) is not None:
                rows[row_name(record)].append(t * 1000)
        for name, values in sorted(rows.items()):
            values.sort()
            ys = [(i + 1) / len(values) for i in range(len(values))]
            style = "--" if name.endswith(Kind.STT.value) else "-"
            cdf.step(
                values,
                ys,
                style,
                where="post",
                label=name,
                color=colors[Priority.parse(name.split("/")[0])],
            )
        cdf.set_xscale("log")
        cdf.set_xlabel("TTFT (ms; STT: end of audio → transcript)")
        cdf.set_ylabel("fraction of requests")
        cdf.set_title(f"{result.policy}: interactive TTFT CDF")
        cdf.grid(True, which="both", alpha=0.3)
        cdf.legend()

        timeline = axes[1][col]
        bins = max(1, int(result.end_time // bin_s) + 1)
        occupancy = {p: [0.0] * bins for p in Priority}
        for step in result.steps:
            _spread(step, occupancy, bin_s)
        xs = [i * bin_s for i in range(bins)]
        timeline.stackplot(
            xs,
            *(occupancy[p] for p in Priority),
            labels=[p.label for p in Priority],
            colors=[colors[p] for p in Priority],
            step="post",
        )
        timeline.set_ylim(0, 1.05)
        timeline.set_xlabel("time (s)")
        timeline.set_ylabel(f"device occupancy ({bin_s:.0f} s bins)")
        timeline.set_title(f"{result.policy}: what the device ran")
        timeline.legend(loc="upper right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _spread(step: Step, occupancy: dict[Priority, list[float]], bin_s: float) -> None:
    """Add a step's device time to the bins it overlaps, in proportion to the overlap."""
    duration = step.end - step.start
    bins = len(next(iter(occupancy.values())))
    first, last = int(step.start // bin_s), min(int(step.end // bin_s), bins - 1)
    for index in range(first, last + 1):
        overlap = min(step.end, (index + 1) * bin_s) - max(step.start, index * bin_s)
        if duration <= 0 or overlap <= 0:
            continue
        for priority, seconds in step.seconds.items():
            occupancy[priority][index] += seconds * overlap / duration / bin_s
