"""The report of `fairlane bench family`: per target and phase, the classes' latencies beside
the background work done, the ratios between targets, and the plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fairlane.bench.family_play import Played
from fairlane.policy import Priority, Slo
from fairlane.runtime.metrics import percentile


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
        "background_llm_computed_per_s": (
            round(played.background_llm_computed / played.duration_s, 1)
            if played.background_llm_computed is not None
            else None
        ),
        "embedded_tokens_per_s": round(played.embedded_tokens / played.duration_s),
        "summaries_per_min": round(60 * played.summaries_done / played.duration_s, 2),
        "summarised_tokens_per_s": round(played.summarised_tokens / played.duration_s, 1),
        "errors": len(played.errors),
        "first_errors": played.errors[:3],
        "timed_out": played.timed_out,
        "prediction_error": played.prediction_error,
        "background_steps": played.background_steps,
        "device_busy": played.device_busy,
        "interactive_busy": played.interactive_busy,
        "background_busy": played.background_busy,
        "fewer_threads": played.fewer_threads,
    }


def format_prediction(reports: list[dict[str, Any]]) -> str:
    """Beside the SLO table: how far each Fairlane server's step predictions were from its
    steps (median / p95 of |predicted − measured| / measured, over the phase)."""
    lines = ["cost-model error, median / p95 (over the phase)"]
    for report in reports:
        kinds = {
            f"{step}" + (f"@{device}" if len(report["prediction_error"]) > 1 else ""): figures
            for device, steps in report.get("prediction_error", {}).items()
            for step, figures in steps.items()
        }
        if kinds:
            cells = "  ".join(
                f"{name} {_f(f['median'], '.0%')}/{_f(f['p95'], '.0%')}"
                for name, f in sorted(kinds.items())
            )
            where = f"{report['target']:<16}{report['phase']:<12}{report['round']:>3}"
            lines.append(f"{where}  {cells}")
    return "\n".join(lines)


def format_background_steps(reports: list[dict[str, Any]]) -> str:
    """Per Fairlane server and phase: background-only steps' p50 / p95 (ms) and the p95 over
    the slice, per engine kind, then the same for the steps planned to the slice or less
    (someone was talking) and the p95 of each step over its own time bound; and the LLM loop's
    busy share (all steps / interactive ones), with the share of its steps that gave a thread
    up (`llm.give_way`)."""
    lines = [
        "background steps p50/p95 ms (p95 / slice) | planned to a slice: n, p95 ms (p95 / slice)"
        " | p95 over own bound; LLM loop busy: all / interactive"
    ]
    for report in reports:
        if report.get("device_busy") is None:
            continue
        cells = "  ".join(
            _background_cell(kind, f)
            for device, kinds in sorted(report.get("background_steps", {}).items())
            for kind, f in sorted(kinds.items())
        )
        where = f"{report['target']:<16}{report['phase']:<12}{report['round']:>3}"
        busy = f"busy {report['device_busy']:.0%} / {report['interactive_busy']:.0%}"
        if report.get("fewer_threads") is not None:
            busy += f", {report['fewer_threads']:.0%} of steps on fewer threads"
        lines.append(f"{where}  {busy}  {cells or '-'}")
    return "\n".join(lines)


def _background_cell(kind: str, f: dict[str, Any]) -> str:
    cell = f"{kind} {_f(f['p50_ms'])}/{_f(f['p95_ms'])} ({_f(f['p95_over_slice'], '.2f')}x)"
    sliced = f.get("sliced")
    if sliced is None:  # a report from before the steps carried their bound
        return cell
    return (
        f"{cell} | {sliced['steps']}, {_f(sliced['p95_ms'])} "
        f"({_f(sliced['p95_over_slice'], '.2f')}x) | {_f(f['p95_over_budget'], '.2f')}x"
    )


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
                f"{report['embedded_tokens_per_s']} embedded tokens/s done, "
                f"{_f(report.get('summaries_per_min'), '.1f')} summaries/min finished "
                f"({_f(report.get('summarised_tokens_per_s'), '.1f')} tokens of text/s)"
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
        if "background_llm_ratio" in row and alone and alone.get("interactive_busy") is not None:
            # Work-conserving efficiency: the background LLM work done beside the interactive
            # work, over what it does alone scaled to the device share the interactive work
            # leaves (1 - its busy share alone). 1: every second it leaves goes to background.
            left = 1.0 - alone["interactive_busy"]
            if left > 0:
                row["work_conserving"] = round(row["background_llm_ratio"] / left, 2)
                whole = _all_background_ratio(row, background)
                if whole is not None:
                    row["work_conserving_all"] = round(whole / left, 2)
                # The same from the server's own count of the tokens it computed, which the
                # phase's end does not cut (a prompt half prefilled counts what is done).
                computed = (mixed.get("background_llm_computed_per_s"),
                            (background or {}).get("background_llm_computed_per_s"))
                if computed[0] is not None and computed[1]:
                    row["work_conserving_computed"] = round(computed[0] / computed[1] / left, 2)
        out.append(row)
    return out


def _all_background_ratio(row: dict[str, Any], background: dict[str, Any] | None) -> float | None:
    """All background work done beside the interactive work over what it does alone: each
    lane's mixed/alone ratio weighted by the device share it had alone (the LLM's summaries
    and the embedder's documents are one background budget; the lane rotation decides how it
    splits). None without both lanes' figures."""
    shares = (background or {}).get("background_busy") or {}
    lanes = {"llm": row.get("background_llm_ratio"), "embed": row.get("embedded_ratio")}
    weights = {k: shares.get(k, 0.0) for k in lanes}
    if any(r is None for r in lanes.values()) or sum(weights.values()) <= 0:
        return None
    return float(sum(lanes[k] * weights[k] for k in lanes) / sum(weights.values()))


def format_ratios(rows: list[dict[str, Any]]) -> str:
    header = (
        f"{'target':<16}{'rnd':>4}{'chat TTFT p95 loaded/alone':>28}"
        f"{'voice turn p95 loaded/alone':>29}{'bg LLM mixed/alone':>20}"
        f"{'embed mixed/alone':>19}{'work-conserving':>17}{'(all bg)':>10}{'(computed)':>12}"
        f"{'interactive SLO':>17}"
        f"{'bg LLM tok/s':>14}{'embed tok/s':>13}"
    )
    lines = [header, "-" * len(header)]
    for row in rows:
        lines.append(
            f"{row['target']:<16}{row['round']:>4}"
            f"{_f(row.get('chat_ttft_p95_ratio'), '.2f'):>28}"
            f"{_f(row.get('voice_first_token_p95_ratio'), '.2f'):>29}"
            f"{_f(row.get('background_llm_ratio'), '.2f'):>20}"
            f"{_f(row.get('embedded_ratio'), '.2f'):>19}"
            f"{_f(row.get('work_conserving'), '.2f'):>17}"
            f"{_f(row.get('work_conserving_all'), '.2f'):>10}"
            f"{_f(row.get('work_conserving_computed'), '.2f'):>12}"
            f"{_f(row['interactive_slo_met'], '.0%'):>17}"
            f"{row['background_llm_tokens_per_s']:>14}{row['embedded_tokens_per_s']:>13}"
        )
    return "\n".join(lines)


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
