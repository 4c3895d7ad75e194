"""The simulator's tables in docs/history/benchmarks.md, as markdown: every shipped workload on the
profile it is meant for, Fairlane beside the baselines households run.

Usage: .venv/bin/python scripts/simulation-tables.py [POLICY,...]
"""

from __future__ import annotations

import subprocess
import sys
from importlib import resources

from fairlane.sim import scenario, simulate
from fairlane.sim.report import summarize

CASES = (
    ("family.yaml", "rtx4090"),
    ("family-party.yaml", "rtx4090"),
    ("family-cpu.yaml", "cpu-2core"),
    ("family-party-cpu.yaml", "cpu-2core"),
)
ROWS = ("voice/stt", "voice/llm", "chat/llm")


def cell(row: dict | None) -> str:
    if not row:
        return "–"
    ttft, itl = row["ttft_ms"]["p95"], row["itl_ms"]["p99"]
    itl_text = "" if itl is None else f", ITL p99 {itl:,.0f}"
    return f"{row['slo_met']:.0%} ({ttft:,.0f}{itl_text})" if ttft is not None else "0% (–)"


def main() -> None:
    policies = (sys.argv[1] if len(sys.argv) > 1 else "fairlane,separate,vllm").split(",")
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    print(f"commit {commit}; `python scripts/simulation-tables.py {','.join(policies)}`\n")
    for name, profile in CASES:
        path = resources.files("fairlane").joinpath(f"workloads/{name}")
        scn = scenario(str(path), profile)
        print(f"**{scn.workload.name}** on `{profile}` ({scn.workload.duration_s:.0f} s)\n")
        print(
            "| policy | voice/stt SLO met (TTFT p95 ms) | voice/llm (TTFT p95, ITL p99) | chat/llm "
            "| background LLM tok/s in the workload | embedded tok/s | backlog drained | Jain |"
        )
        print("|---|---|---|---|---|---|---|---|")
        for policy in policies:
            report = summarize(simulate(scn, policy), scn.workload.slo, scn.workload.duration_s)
            bg = report["background"]
            cells = " | ".join(cell(report["classes"].get(row)) for row in ROWS)
            print(
                f"| {policy} | {cells} | {bg['llm_tokens_per_s']:,} | "
                f"{bg['embedded_tokens_per_s']:,} | {bg['backlog_drain_s']:,.1f} s | "
                f"{report['fairness']['jain_slo_attainment']} |"
            )
        print()


if __name__ == "__main__":
    main()
