"""The `fairlane` command: serve, simulate, bench."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from fairlane import __version__


def _simulate(args: argparse.Namespace) -> int:
    from fairlane import config as config_mod
    from fairlane.sim import default_workload, scenario, simulate
    from fairlane.sim.report import format_table, plot, summarize

    cfg = config_mod.load(args.config)
    scn = scenario(args.workload or default_workload(), args.profile, cfg.policy, args.duration)
    policies = ["fairlane", "fcfs"] if args.policy == "both" else [args.policy]
    results = [simulate(scn, name, noise=args.noise, seed=args.seed) for name in policies]
    reports = [summarize(r, scn.workload.slo) for r in results]
    print(
        f"workload {scn.workload.name} ({len(scn.workload.jobs)} jobs over "
        f"{scn.workload.duration_s:.0f} s) on profile {args.profile}; times in ms"
    )
    print(format_table(reports))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(
            json.dumps({"profile": args.profile, "reports": reports}, indent=2)
        )
        print(f"report: {args.json}")
    if args.plot:
        plot(results, Path(args.plot))
        print(f"plot: {args.plot}")
    return 0


def _bench(args: argparse.Namespace) -> int:
    from fairlane.bench import scheduler_decision_time

    if args.what == "scheduler":
        scheduler_decision_time(sizes=args.sizes, steps=args.steps)
    return 0


def _serve(args: argparse.Namespace) -> int:
    from fairlane.server import serve

    return int(serve(args))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fairlane", description="One home GPU, many voices.")
    parser.add_argument("--version", action="version", version=f"fairlane {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the inference server")
    serve.add_argument("--config", help="YAML configuration file")
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    serve.add_argument("--token", help="bearer token (or FAIRLANE_TOKEN)")
    serve.add_argument("--policy", choices=["fairlane", "fcfs"])
    serve.set_defaults(func=_serve)

    sim = sub.add_parser("simulate", help="run the real policy on a simulated device")
    sim.add_argument("--workload", help="workload YAML (default: the family evening)")
    sim.add_argument("--policy", choices=["fairlane", "fcfs", "both"], default="both")
    sim.add_argument("--profile", default="rtx4090", help="cost profile name or YAML path")
    sim.add_argument("--config", help="YAML configuration file (its policy: section is used)")
    sim.add_argument("--duration", type=float, help="only arrivals before this many seconds")
    sim.add_argument("--noise", type=float, default=0.05, help="relative step-time noise")
    sim.add_argument("--seed", type=int, default=0)
    sim.add_argument("--json", help="write the report here")
    sim.add_argument("--plot", help="write a PNG of TTFT CDFs and device occupancy here")
    sim.set_defaults(func=_simulate)

    bench = sub.add_parser("bench", help="benchmarks (printed figures)")
    bench.add_argument("what", choices=["scheduler"])
    bench.add_argument("--sizes", type=int, nargs="+", default=[8, 64, 256])
    bench.add_argument("--steps", type=int, default=2000)
    bench.set_defaults(func=_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except ValueError as err:  # configuration and input errors carry a message for a person
        print(f"fairlane: {err}", file=sys.stderr)
        return 2
