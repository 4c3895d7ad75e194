"""`fairlane simulate`, `fairlane tune` and `fairlane profile fit`: the real policy on a
simulated device, the settings it finds for a household, and the cost profiles it plans with.

Nothing at this module's top imports numpy or an engine (see fairlane.cli).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from fairlane.bench_command import default_threads

PER_MEMBER = (
    "each interactive member's service and TTFT beside the others against their own requests "
    "alone (Jain's index within each class)"
)


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from fairlane.policy import POLICIES

    sim = sub.add_parser("simulate", help="run the real policy on a simulated device")
    sim.add_argument("--workload", help="workload YAML (default: the family evening)")
    sim.add_argument(
        "--policy",
        default="fairlane,separate,vllm",
        help=f"comma-separated, side by side (of: {', '.join(POLICIES)})",
    )
    sim.add_argument("--profile", default="rtx4090", help="cost profile name or YAML path")
    sim.add_argument("--config", help="YAML configuration file (its policy: section is used)")
    sim.add_argument("--duration", type=float, help="only arrivals before this many seconds")
    sim.add_argument("--noise", type=float, default=0.05, help="relative step-time noise")
    sim.add_argument("--seed", type=int, default=0)
    sim.add_argument(
        "--truth",
        help="profile the simulated device really runs at (default: the one the policy plans "
        "with); the policy learns the difference online",
    )
    sim.add_argument(
        "--remote",
        metavar="PROFILE",
        help="also run each policy with a remote lane: the --remote-classes' work of "
        "--remote-kinds on a second device with this profile's costs",
    )
    sim.add_argument(
        "--remote-classes", default="background", help="classes the remote lane takes"
    )
    sim.add_argument(
        "--remote-kinds", default="llm", help="kinds of work it takes: llm, or llm,embed"
    )
    sim.add_argument(
        "--homes", type=int, default=1, help="households living the workload at once on the device"
    )
    sim.add_argument(
        "--capacity",
        type=float,
        metavar="ATTAINMENT",
        help="instead of one run: the most households the device serves with every interactive "
        "row within its SLO for this fraction of requests (e.g. 0.99), per policy",
    )
    sim.add_argument(
        "--against",
        metavar="FAMILY_JSON",
        help="set the simulator beside a `bench family --json` run of the same workload: its "
        "phases simulated and reported as the bench reports them, row by row, within 5 points "
        "(SLO attainment, device shares) or 15%% (rates, latencies)",
    )
    sim.add_argument("--target", default="fairlane", help="with --against: the run's target")
    sim.add_argument(
        "--rounds", type=int, default=3, help="with --against: simulated rounds (seeds)"
    )
    sim.add_argument("--per-member", action="store_true", help=PER_MEMBER)
    sim.add_argument("--json", help="write the report here")
    sim.add_argument("--plot", help="write a PNG of TTFT CDFs and device occupancy here")
    sim.set_defaults(func=_simulate)

    tune = sub.add_parser(
        "tune", help="find the policy settings with the most background work within the SLOs"
    )
    tune.add_argument("--workload", help="workload YAML (default: the family evening)")
    tune.add_argument("--profile", default="cpu-2core", help="cost profile name or YAML path")
    tune.add_argument(
        "--calibrate", action="store_true", help="time this machine's engines for the profile"
    )
    tune.add_argument(
        "--attainment", type=float, default=0.95, help="fraction of each row within its SLO"
    )
    tune.add_argument("--passes", type=int, default=2, help="rounds of coordinate descent")
    tune.add_argument(
        "--margin", type=float, default=0.05,
        help="the gain in background work over the defaults a recommendation needs (0.05: 5%%)",
    )
    tune.add_argument("--duration", type=float, help="only arrivals before this many seconds")
    tune.add_argument(
        "--verify", type=int, default=0,
        help="run the best N and the defaults on the real server (the mixed phase)",
    )
    tune.add_argument("--threads", type=int, help="engine threads (default: cores owned)")
    tune.add_argument("--fixtures", default="tests/fixtures/speech", help="WAV recordings")
    tune.add_argument("--out", default="fairlane-tuned.yaml", help="the configuration file")
    tune.add_argument("--json", help="write every trial here")
    tune.set_defaults(func=_tune)

    profile = sub.add_parser("profile", help="cost profiles")
    profile_sub = profile.add_subparsers(dest="action", required=True)
    fit = profile_sub.add_parser(
        "fit", help="fit a profile's terms from `fairlane bench engine --json` (and embeddings)"
    )
    fit.add_argument(
        "--engine", required=True, nargs="+", help="`fairlane bench engine --json` runs"
    )
    fit.add_argument("--embed", help="embedding throughput JSON (texts/s per batch size)")
    fit.add_argument("--embed-dtype", default="float16", help="which of its runs to fit")
    fit.add_argument("--base", default="cpu-2core", help="profile for the terms not measured")
    fit.add_argument("--name", required=True)
    fit.add_argument("--description", required=True)
    fit.add_argument("--out", required=True, help="the profile YAML to write")
    fit.add_argument(
        "--without", nargs="+", metavar="TERM", help="LLM terms the data cannot identify: kept at 0"
    )
    fit.add_argument("--note", action="append", help="a line for the profile's header")
    fit.set_defaults(func=_profile_fit)


def _simulate(args: argparse.Namespace) -> int:
    from fairlane import config as config_mod
    from fairlane.policy import Kind, Priority
    from fairlane.sim import default_workload, merged, scenario, simulate, simulate_with_remote
    from fairlane.sim.report import format_table, plot, summarize

    cfg = config_mod.load(args.config)
    # The server's budgets for this config (its engine's context, sequences and prefix cache);
    # the scenario scales the SLOs for a CPU profile itself.
    budgets = cfg.serving_policy("gpu")
    policies = _policies(args.policy)
    if args.capacity is not None:
        return _capacity(args, budgets, policies)
    if args.against:
        return _against(args, budgets)
    scn = scenario(
        args.workload or default_workload(), args.profile, budgets, args.duration, args.homes
    )
    results = [
        simulate(scn, name, noise=args.noise, seed=args.seed, truth=args.truth) for name in policies
    ]
    if args.remote:
        # Beside each policy on one device: the same policy with the remote classes' LLM
        # work on a second device (rule 10's remote lane).
        classes = frozenset(Priority.parse(c) for c in args.remote_classes.split(","))
        kinds = frozenset(Kind(k) for k in args.remote_kinds.split(","))
        results = [
            result
            for name, alone in zip(policies, results, strict=True)
            for result in (alone, merged(*simulate_with_remote(
                scn, name, args.remote, classes, noise=args.noise, seed=args.seed, kinds=kinds
            ), f"{name}+remote"))
        ]
    reports = [summarize(r, scn.workload.slo, scn.workload.duration_s) for r in results]
    device = f"; the device runs at {args.truth}'s costs" if args.truth else ""
    if args.remote:
        device += (
            f"; +remote: {args.remote_classes} {args.remote_kinds} work on a second device "
            f"({args.remote}), "
            "device figures are the local device's"
        )
    print(
        f"workload {scn.workload.name} ({len(scn.workload.jobs)} jobs over "
        f"{scn.workload.duration_s:.0f} s) on profile {args.profile}{device}; "
        f"KV {budgets.kv_blocks * budgets.block_size} tokens, {budgets.max_num_seqs} sequences; "
        "times in ms"
    )
    print(format_table(reports))
    if args.per_member:
        from fairlane.sim.clients import format_fairness, per_member

        for name, result, report in zip(policies, results, reports, strict=False):
            report["members"] = per_member(scn, name, result, args.noise, args.seed)
            print(format_fairness(name, report["members"]))
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


def _against(args: argparse.Namespace, budgets: Any) -> int:
    """`simulate --against`: a measured `bench family` run beside the simulator, row by row."""
    from fairlane.bench.family_sim import fit, format_fit, simulated
    from fairlane.sim import default_workload, scenario

    measured = json.loads(Path(args.against).read_text())
    duration = args.duration or measured.get("duration_s")
    if duration is None:
        raise SystemExit(f"{args.against} does not say its phases' length: give --duration")
    scn = scenario(args.workload or default_workload(), args.profile, budgets, duration)
    if measured.get("workload") not in (None, scn.workload.name):
        raise SystemExit(
            f"{args.against} played {measured['workload']!r}, not {scn.workload.name!r}"
        )
    runs = [r for r in measured["reports"] if r["target"] == args.target]
    if not runs:
        targets = sorted({r["target"] for r in measured["reports"]})
        raise SystemExit(f"no {args.target!r} in {args.against}; it has {', '.join(targets)}")
    phases = list(dict.fromkeys(r["phase"] for r in runs if ":" not in r["phase"]))
    reports = simulated(
        scn.workload, phases, args.profile, scn.config, args.rounds, noise=args.noise
    )
    rows = fit(measured["reports"], reports, args.target)
    print(
        f"{scn.workload.name}, {duration:.0f} s a phase: {args.target} in {args.against} "
        f"beside the simulator on profile {args.profile} ({args.rounds} seeds, their mean)"
    )
    print(format_fit(rows))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({
            "profile": args.profile, "against": args.against, "target": args.target,
            "simulated": reports, "fit": rows,
        }, indent=2))
        print(f"report: {args.json}")
    return 0


def _capacity(args: argparse.Namespace, budgets: Any, policies: list[str]) -> int:
    """`simulate --capacity`: how many households the profile's device serves, per policy."""
    from fairlane.sim import default_workload, homes_served

    print(
        f"households on profile {args.profile} (simulation): every interactive row within its "
        f"SLO for {args.capacity:.0%} of its requests; KV {budgets.kv_blocks * budgets.block_size}"
        f" tokens, {budgets.max_num_seqs} sequences; each home's prompt prefix cached"
    )
    found = {}
    for name in policies:
        served, tried = homes_served(
            args.workload or default_workload(), args.profile, budgets, name, args.capacity,
            duration_s=args.duration, noise=args.noise, seed=args.seed,
        )
        found[name] = {"homes": served, "tried": [vars(t) for t in tried]}
        for t in sorted(tried, key=lambda t: t.homes):
            print(
                f"  {name:<10} {t.homes:>4} homes: worst row {t.worst_row} "
                f"{t.worst_attainment:.1%}, background done {t.background_done:.0%}"
            )
        print(f"{name}: {served} households")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"profile": args.profile, **found}, indent=2))
    return 0


def _policies(value: str) -> list[str]:
    from fairlane.policy import POLICIES

    names = [name.strip() for name in value.split(",") if name.strip()]
    unknown = [name for name in names if name not in POLICIES]
    if unknown or not names:
        raise SystemExit(f"unknown policy {unknown}; expected some of {', '.join(POLICIES)}")
    return names


def _tune(args: argparse.Namespace) -> int:
    from fairlane.bench import tune
    from fairlane.sim import default_workload, scenario

    threads = args.threads or default_threads()
    profile = args.profile
    if args.calibrate:
        print(f"calibrating the cost model on this machine ({threads} threads)", flush=True)
        path = Path(args.out).with_suffix(".profile.yaml")
        text = tune.calibrate(threads, Path(args.fixtures), path, base=args.profile)
        path.write_text(text)
        print(f"profile: {path}\n{text}")
        profile = str(path)
    scn = scenario(args.workload or default_workload(), profile, duration_s=args.duration)
    print(
        f"searching the policy settings on {scn.workload.name} ({scn.workload.duration_s:.0f} "
        f"s), profile {profile}: the most background work with every interactive row within "
        f"its SLO for {args.attainment:.0%} of its requests",
        flush=True,
    )
    trials = tune.search(scn, args.attainment, passes=args.passes)
    start = {k: float(getattr(scn.config, k)) for k in tune.SEARCH_SPACE}
    default = next(t for t in trials if t.settings == start)  # the server's own settings
    best, why = tune.recommend(trials, default, args.attainment, args.margin)
    if best.feasible(args.attainment):
        verdict = f"meets every interactive SLO for {best.worst:.0%} or more of requests"
    else:
        verdict = (
            f"MISSED: no setting tried meets {args.attainment:.0%}; this one comes closest "
            f"(worst row {best.worst:.0%})"
        )
    print(f"\n{len(trials)} settings simulated. Recommended: {tune._describe(best.settings)}")
    print(f"  {why}; {verdict}")
    print(
        f"  background {best.background_llm_tokens_per_s} LLM tok/s (defaults: "
        f"{default.background_llm_tokens_per_s}), {best.embedded_tokens_per_s} embedded tok/s "
        f"(defaults: {default.embedded_tokens_per_s}); worst SLO met {best.worst:.0%} "
        f"(defaults: {default.worst:.0%})"
    )
    result: dict[str, Any] = {
        "workload": scn.workload.name,
        "profile": profile,
        "attainment": args.attainment,
        "recommended": best.settings,
        "why": why,
        "trials": [vars(t) for t in trials],
    }
    if args.verify:
        # The defaults are measured beside the best: a recommendation is worth what it gains.
        chosen = [best, *(t for t in trials if t is not best)][: args.verify]
        chosen += [default] if default not in chosen else []
        print(f"\nverifying the best {args.verify} and the defaults on the real server (mixed "
              "phase)", flush=True)
        rows = tune.verify(scn.workload, chosen, threads, Path(args.fixtures))
        print(tune.format_verification(rows))
        result["verified"] = rows
    note = f"fairlane tune on {scn.workload.name}, profile {profile}: {why}; {verdict}"
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(tune.config_file(best.settings, note))
    print(f"\nconfiguration: {args.out} (fairlane serve --config {args.out})")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


def _profile_fit(args: argparse.Namespace) -> int:
    from fairlane.profiles.fit import fit_profile

    text, errors = fit_profile(
        [Path(p) for p in args.engine],
        args.base,
        args.name,
        args.description,
        Path(args.embed) if args.embed else None,
        args.embed_dtype,
        command="fairlane " + shlex.join(sys.argv[1:]),
        without=tuple(args.without or ()),
        notes=tuple(args.note or ()),
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    print(text)
    print(f"written: {args.out}; fit error: {json.dumps(errors)}")
    return 0
