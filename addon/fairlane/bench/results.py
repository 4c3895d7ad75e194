"""`fairlane bench results`: the plots of docs/results.md, one PNG per area, drawn from the JSON
the benchmarks wrote (kept in docs/results/data, each file named by what made it).

- `assist.png`: Home Assistant's assistant benchmark, accuracy per agent and category
  (`fairlane bench assist --json`), beside the leaderboard's published models;
- `family.png`: the household evening, the first token of a spoken command and a chat turn
  alone and under the background, and the background work kept (`fairlane bench family
  --json`), per target;
- `remote.png`: the LLM on a second box running llama-server, directly and with Fairlane in
  front (`fairlane bench remote --json`);
- `fairness.png`: one member's long prompts beside two who chat: each member's service kept
  against alone (`fairlane bench family --per-member --json`);
- `gpu.png`: households one H200 serves, per policy (`fairlane simulate --capacity --json`).

An area whose JSON is missing is skipped and said so.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fairlane.runtime.metrics import percentile

SOURCES = {
    "assist": "assist.json",
    "family": "family.json",
    "remote": "remote.json",
    "fairness": "fairness-turns.json",
    "gpu": "../../gpu/h200-households.json",  # docs/gpu, where the GPU run put it
}


def plot_all(data: Path, out: Path) -> list[str]:
    """Every area whose JSON is in `data`, as `out`/AREA.png; returns what was written."""
    import matplotlib

    matplotlib.use("Agg")
    out.mkdir(parents=True, exist_ok=True)
    drawers: dict[str, Callable[[Any, Any], None]] = {
        "assist": _assist, "family": _family, "remote": _remote, "fairness": _fairness,
        "gpu": _gpu,
    }
    written = []
    for area, name in SOURCES.items():
        path = data / name
        if not path.is_file():
            print(f"{area}: no {path}, skipped")
            continue
        import matplotlib.pyplot as plt

        figure, axes = plt.subplots(1, 2, figsize=(11, 4))
        drawers[area](json.loads(path.read_text()), axes)
        figure.tight_layout()
        target = out / f"{area}.png"
        figure.savefig(target, dpi=110)
        plt.close(figure)
        written.append(str(target))
    return written


def _assist(result: dict[str, Any], axes: Any) -> None:
    agents = result["agents"]
    names = list(agents) + list(result.get("published", {}))
    values = [agents[a]["accuracy"] for a in agents] + list(result.get("published", {}).values())
    colours = ["tab:blue"] * len(agents) + ["tab:gray"] * len(result.get("published", {}))
    axes[0].barh(names, [100 * v for v in values], color=colours)
    axes[0].set_xlabel("tasks passed (%)")
    axes[0].set_title(f"{result['dataset']}: agents here (blue), leaderboard (grey)")
    axes[0].set_xlim(0, 100)
    categories = sorted({c for a in agents.values() for c in a["categories"]})
    width = 0.8 / max(1, len(agents))
    for index, (agent, figures) in enumerate(agents.items()):
        shares = [100 * figures["categories"][c]["passed"] / figures["categories"][c]["n"]
                  if c in figures["categories"] else 0 for c in categories]
        axes[1].bar([i + index * width for i in range(len(categories))], shares, width,
                    label=agent)
    axes[1].set_xticks([i + 0.4 - width / 2 for i in range(len(categories))], categories,
                       rotation=30)
    axes[1].set_ylabel("passed (%)")
    axes[1].set_title("per category")
    axes[1].set_ylim(0, 119)
    axes[1].legend(fontsize=7, ncol=len(agents), loc="upper center")


def _family(result: dict[str, Any], axes: Any) -> None:
    rows: dict[str, dict[str, list[float]]] = {}
    for report in result["reports"]:
        target, phase = report["target"], report["phase"]
        for row in ("voice/llm", "chat/llm"):
            p95 = report["classes"].get(row, {}).get("ttft_ms", {}).get("p95")
            if p95 is not None and phase in ("interactive", "mixed"):
                label = f"{_label(target)}\n{row}"
                rows.setdefault(label, {}).setdefault(phase, []).append(p95 / 1000)
    labels = list(rows)
    for offset, phase in ((-0.2, "interactive"), (0.2, "mixed")):
        medians = [_median(rows[label].get(phase, [])) for label in labels]
        axes[0].bar([i + offset for i in range(len(labels))], medians, 0.4,
                    label="alone" if phase == "interactive" else "under the background")
    axes[0].set_xticks(range(len(labels)), labels, fontsize=7)
    axes[0].set_ylabel("first token p95 (s), median of rounds")
    axes[0].set_title("spoken command and chat turn, alone and under load")
    axes[0].legend(fontsize=8)
    kept: dict[str, list[float]] = {}
    for report in result["reports"]:
        label = _label(report["target"])
        if report["phase"] == "mixed":
            kept.setdefault(f"{label}, under load", []).append(
                report["background_llm_tokens_per_s"])
        if report["phase"] == "background":
            kept.setdefault(f"{label}, alone", []).append(report["background_llm_tokens_per_s"])
    names = sorted(kept)
    axes[1].barh(names, [_median(kept[n]) for n in names])
    axes[1].set_xlabel("background LLM tokens/s (median of rounds)")
    axes[1].set_title("background work, alone and under the household")


def _remote(result: dict[str, Any], axes: Any) -> None:
    targets = sorted({row["target"] for row in result["rows"]})
    for offset, group in ((-0.2, "voice"), (0.2, "chat")):
        values = [_median([r[group]["ttft_p95_ms"] / 1000 for r in result["rows"]
                           if r["target"] == t and r[group]["ttft_p95_ms"] is not None])
                  for t in targets]
        axes[0].bar([i + offset for i in range(len(targets))], values, 0.4, label=group)
    axes[0].set_xticks(range(len(targets)), targets)
    axes[0].set_ylabel("first token p95 (s) under a background flood")
    axes[0].set_title(f"llama-server --parallel {result['parallel']}: direct vs Fairlane in front")
    axes[0].legend(fontsize=8)
    axes[1].bar(targets, [_median([r["background_tokens_per_s"] for r in result["rows"]
                                   if r["target"] == t]) for t in targets])
    axes[1].set_ylabel("background tokens/s")
    axes[1].set_title("background work done")


def _fairness(result: dict[str, Any], axes: Any) -> None:
    cases = result.get("members", [])
    for index, case in enumerate(cases):
        members = case["members"]
        names = list(members)
        width = 0.8 / max(1, len(cases))
        axes[0].bar([i + index * width for i in range(len(names))],
                    [members[n]["service_kept"] for n in names], width,
                    label=f"{case['target']} r{case['round']}")
        axes[1].bar([i + index * width for i in range(len(names))],
                    [(members[n]["ttft_p50_ms"] or 0) / 1000 for n in names], width,
                    label=f"{case['target']} r{case['round']}")
        axes[0].set_xticks(range(len(names)), names)
        axes[1].set_xticks(range(len(names)), names)
    axes[0].set_ylabel("service beside the others / alone")
    axes[0].set_title("each member's tokens served, kept")
    axes[1].set_ylabel("TTFT p50 (s) beside the others")
    axes[1].set_title("each member's wait")
    axes[0].legend(fontsize=8)


def _gpu(result: dict[str, Any], axes: Any) -> None:
    policies = [p for p in result if p != "profile"]
    axes[0].bar(policies, [result[p]["homes"] for p in policies])
    axes[0].set_ylabel("households served (every row ≥ 99% within SLO)")
    axes[0].set_title(f"one {result['profile'].upper()} (simulated, measured profile)")
    for policy in policies:
        tried = sorted(result[policy]["tried"], key=lambda t: t["homes"])
        axes[1].plot([t["homes"] for t in tried], [100 * t["worst_attainment"] for t in tried],
                     marker="o", label=policy)
    axes[1].axhline(99, color="gray", linestyle=":")
    axes[1].set_xlabel("households")
    axes[1].set_ylabel("worst interactive row within SLO (%)")
    axes[1].legend(fontsize=8)


def _label(target: str) -> str:
    """`fairlane@checkout=/tmp/after` as `fairlane (after)`."""
    head, _, checkout = target.partition("@checkout=")
    return f"{head} ({Path(checkout).name})" if checkout else target


def _median(values: list[float]) -> float:
    """The median (0 with no values: an empty bar)."""
    return percentile(values, 50) or 0.0
