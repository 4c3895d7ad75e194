"""The `fairlane` command: serve, simulate, tune, bench.

Longer than the project's ~450 lines on purpose: every subcommand's arguments, each next to the
few lines that run it (the work is in `server`, `sim` and `bench`).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from fairlane import __version__
from fairlane.runtime import host

# Nothing at this module's top may import numpy, llama.cpp, onnxruntime or torch: `main` sets
# the thread environment first, and each native library reads it once, when it loads
# (tests/runtime/test_host.py checks). Each command imports what it runs.


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


def _bench(args: argparse.Namespace) -> int:
    from fairlane.bench import llm
    from fairlane.bench.scheduler import scheduler_decision_time

    threads = args.threads or _default_threads()
    if args.what == "scheduler":
        result: object = scheduler_decision_time(sizes=args.sizes, steps=args.steps)
    elif args.what == "engine":
        result = llm.engine_costs(
            threads,
            args.gpu_layers,
            Path(args.model) if args.model else None,
            tuple(args.prefill_sizes),
            tuple(args.decode_sizes),
            tuple(args.context_sizes),
            tuple(args.occupancy),
            args.after_embed,
        )
    elif args.what == "embed":
        from fairlane.bench.embed import embed_bench, search_latency

        result = {
            "throughput": embed_bench(threads, args.texts, args.backend),
            "search": search_latency([10_000, 100_000]),
        }
    elif args.what == "speech":
        from fairlane.bench.speech import speech

        result = speech(Path(args.fixtures), threads)
    elif args.what == "family":
        result = _bench_family(args, threads)
    elif args.what == "voice":
        from fairlane.bench.voice import voice

        result = voice(Path(args.fixtures), threads, args.rounds, args.targets or "fairlane")
    elif args.what == "speculation":
        from fairlane.bench.speculation import speculation

        result = speculation(threads, args.rounds, args.lead)
    elif args.what in ("overload", "soak"):
        from fairlane.bench import overload

        duration = args.duration or (60.0 if args.what == "overload" else 300.0)
        result = overload.run(
            args.what,
            duration,
            args.hang_s,
            args.factor,
            args.url,
            args.pid,
            args.token,
            backoff=not args.no_backoff,
            fixtures=Path(args.fixtures) if args.fixtures else None,
        )
        print(overload.format_summary(args.what, result))
    elif args.what == "busy-host":
        from fairlane.bench.busy_host import TARGETS, busy_host

        targets = (args.targets or ",".join(TARGETS)).split(",")
        result = busy_host(Path(args.fixtures), targets, args.rounds)
    elif args.what == "throughput":
        result = llm.throughput(args.streams, threads, args.max_tokens, args.rounds)
    elif args.what == "assist":
        from fairlane.bench.assist import assist, format_table

        if not args.datasets or not args.synthetic_home:
            raise ValueError("assist needs --datasets and --synthetic-home (checkouts)")
        result = assist(
            Path(args.datasets), Path(args.synthetic_home), args.dataset,
            tuple((args.targets or "fairlane,fairlane+local,homeassistant").split(",")),
            args.count, args.categories, args.turn_timeout,
            serve_args=tuple(f"--set={item}" for item in args.set or ()),
            checkout=Path(args.checkout) if args.checkout else None,
        )
        print(format_table(result))
    elif args.what == "host":
        from fairlane.bench.host import host_overhead

        result = host_overhead(
            args.streams, args.duration or 20.0, threads, args.model, args.rounds, args.max_tokens,
            args.gpu_layers,
        )
    else:
        policy = dict(_key_value(item) for item in args.set or []) or None
        # Another model (a GPU run): only the LLM runs, with room for the background streams.
        engine = (
            {"model": args.model, "gpu_layers": args.gpu_layers, "n_ctx": 16384,
             "n_seq_max": max(8, 2 * args.background)}
            if args.model
            else None
        )
        result = llm.interference(
            ["fairlane", "fcfs"], threads, args.chats, args.background, policy, args.rounds,
            engine, args.profile,
        )
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


def _bench_family(args: argparse.Namespace, threads: int) -> object:
    from fairlane.bench.family import family
    from fairlane.bench.family_play import ALONE, PHASES
    from fairlane.bench.family_report import (
        format_background_steps,
        format_prediction,
        format_ratios,
        format_rows,
    )
    from fairlane.bench.family_targets import TARGETS, target_parts
    from fairlane.sim import default_workload, scenario
    from fairlane.sim.clients import members

    targets = [t for t in (args.targets or "fairlane,fcfs,separate").split(",") if t]
    phases = [p for p in args.phases.split(",") if p]
    known = [t for t in targets if target_parts(t)[0] in TARGETS]
    if unknown := [t for t in targets if t not in known] + [p for p in phases if p not in PHASES]:
        raise ValueError(f"unknown target or phase {unknown}: targets {TARGETS}, phases {PHASES}")
    # The workload's SLOs as the simulator scales them for this device's profile.
    scn = scenario(args.workload or default_workload(), args.profile, duration_s=args.duration)
    if args.per_member:
        phases += [f"{ALONE}{member}" for member in members(scn.workload)]
    audio = Path(args.fixtures) if args.fixtures else None
    print(
        f"bench family: {scn.workload.name}, {scn.workload.duration_s:.0f} s a phase, "
        f"targets {', '.join(targets)}, phases {', '.join(phases)}, {args.rounds} rounds, "
        f"{threads} threads; SLOs as on profile {args.profile}",
        flush=True,
    )
    result = family(scn.workload, targets, phases, args.rounds, threads, audio)
    print()
    print(format_rows(result["reports"]))
    print()
    print(format_ratios(result["ratios"]))
    print()
    print(format_prediction(result["reports"]))
    print()
    print(format_background_steps(result["reports"]))
    result["workload"] = scn.workload.name
    result["slo"] = {p.label: vars(s) for p, s in scn.workload.slo.items()}
    if args.plot:
        from fairlane.bench.family_report import plot

        plot(result, Path(args.plot))
        print(f"plot: {args.plot}")
    return result


def _tune(args: argparse.Namespace) -> int:
    from fairlane.bench import tune
    from fairlane.sim import default_workload, scenario

    threads = args.threads or _default_threads()
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
    best = trials[0]
    if best.feasible(args.attainment):
        verdict = f"meets every interactive SLO for {best.worst:.0%} or more of requests"
    else:
        verdict = (
            f"MISSED: no setting tried meets {args.attainment:.0%}; this one comes closest "
            f"(worst row {best.worst:.0%})"
        )
    start = {k: float(getattr(scn.config, k)) for k in tune.SEARCH_SPACE}
    default = next(t for t in trials if t.settings == start)  # the server's own settings
    print(f"\n{len(trials)} settings simulated. Best: {tune._describe(best.settings)}")
    print(f"  {verdict}")
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
        "trials": [vars(t) for t in trials],
    }
    if args.verify:
        print(f"\nverifying the best {args.verify} on the real server (mixed phase)", flush=True)
        rows = tune.verify(scn.workload, trials[: args.verify], threads, Path(args.fixtures))
        print(tune.format_verification(rows))
        result["verified"] = rows
    note = f"fairlane tune on {scn.workload.name}, profile {profile}: {verdict}"
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(tune.config_file(best.settings, note))
    print(f"\nconfiguration: {args.out} (fairlane serve --config {args.out})")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


def _occupancy(item: str) -> tuple[int, int]:
    try:
        others, cells = (int(part) for part in item.lower().split("x"))
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"{item!r}: give NxM, e.g. 2x512") from err
    return others, cells


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


def _key_value(item: str) -> tuple[str, float]:
    key, _, value = item.partition("=")
    try:
        return key, float(value)
    except ValueError as err:
        raise ValueError(f"--set {item!r}: expected KEY=NUMBER") from err


def _default_threads() -> int:
    from fairlane.engines.llm import default_threads

    return default_threads()


def _serve(args: argparse.Namespace) -> int:
    from fairlane.server import serve

    return int(serve(args))


PER_MEMBER = (
    "each interactive member's service and TTFT beside the others against their own requests "
    "alone (Jain's index within each class)"
)


def build_parser() -> argparse.ArgumentParser:
    from fairlane.policy import POLICIES

    parser = argparse.ArgumentParser(prog="fairlane", description="One home GPU, many voices.")
    parser.add_argument("--version", action="version", version=f"fairlane {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the inference server")
    serve.add_argument("--config", help="YAML configuration file")
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    serve.add_argument("--token", help="bearer token (or FAIRLANE_TOKEN)")
    serve.add_argument("--policy", choices=list(POLICIES))
    serve.add_argument(
        "--set",
        action="append",
        metavar="SECTION.KEY=VALUE",
        help="override one setting of the config file, e.g. --set llm.gpu_layers=99 (repeatable)",
    )
    serve.set_defaults(func=_serve)

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
    tune.add_argument("--duration", type=float, help="only arrivals before this many seconds")
    tune.add_argument("--verify", type=int, default=0, help="run the best N on the real server")
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

    from fairlane import models_command

    models_command.add_parser(sub)

    bench = sub.add_parser("bench", help="benchmarks (printed figures)")
    bench.add_argument(
        "what",
        choices=[
            "scheduler",
            "engine",
            "throughput",
            "interference",
            "speech",
            "embed",
            "family",
            "voice",
            "speculation",
            "overload",
            "soak",
            "busy-host",
            "host",
            "assist",
        ],
    )
    bench.add_argument("--datasets", help="assist: a checkout of home-assistant-datasets")
    bench.add_argument(
        "--synthetic-home", help="assist: a checkout of home-assistant-synthetic-home"
    )
    bench.add_argument("--dataset", default="assist-mini", help="assist: assist-mini or assist")
    bench.add_argument("--count", type=int, default=2, help="assist: repeats of every agent")
    bench.add_argument(
        "--checkout", help="assist: the integration and server of another checkout (before/after)"
    )
    bench.add_argument("--categories", help="assist: only these categories (comma-separated)")
    bench.add_argument(
        "--turn-timeout", type=float, default=300.0, help="assist: seconds a turn may take"
    )
    bench.add_argument(
        "--sizes", type=int, nargs="+", default=[8, 64, 256], help="scheduler: running sequences"
    )
    bench.add_argument("--steps", type=int, default=2000, help="scheduler: steps to time")
    bench.add_argument("--threads", type=int, help="engine threads (default: cores owned)")
    bench.add_argument(
        "--streams",
        type=int,
        nargs="+",
        default=[1, 4, 8],
        help="throughput, host: concurrent streams",
    )
    bench.add_argument("--max-tokens", type=int, default=64, help="throughput: tokens a stream")
    bench.add_argument("--chats", type=int, default=10, help="interference: chat turns per phase")
    bench.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="throughput, interference, family, voice, speculation: rounds of each target, "
        "alternating",
    )
    bench.add_argument(
        "--lead",
        type=float,
        default=0.35,
        help="speculation: seconds a guess is sent before its turn",
    )
    bench.add_argument(
        "--background", type=int, default=2, help="interference: concurrent background streams"
    )
    bench.add_argument(
        "--model", help="engine, host, interference: a GGUF file instead of the default model"
    )
    bench.add_argument(
        "--prefill-sizes",
        type=int,
        nargs="+",
        default=[64, 256, 512],
        help="engine: prompt chunk sizes to time",
    )
    bench.add_argument(
        "--decode-sizes",
        type=int,
        nargs="+",
        default=[1, 2, 4, 8],
        help="engine: numbers of sequences decoding together",
    )
    bench.add_argument(
        "--context-sizes",
        type=int,
        nargs="*",
        default=[],
        help="engine: context lengths before one sequence's decode iteration",
    )
    bench.add_argument(
        "--occupancy",
        type=_occupancy,
        nargs="*",
        default=[],
        help="engine: NxM, a decode beside N sequences holding M KV cells each (e.g. 2x512)",
    )
    bench.add_argument(
        "--after-embed",
        type=int,
        default=0,
        metavar="TEXTS",
        help="engine: a decode right after an embedding batch of TEXTS chunks (0: not timed)",
    )
    bench.add_argument(
        "--gpu-layers",
        type=int,
        default=0,
        help="engine, interference, host: layers of the model offloaded to the GPU (999: all)",
    )
    bench.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="interference: a policy setting for both servers, e.g. --set slice_ms=50; assist: "
        "a server setting, e.g. --set llm.model=PATH",
    )
    bench.add_argument(
        "--fixtures",
        default="tests/fixtures/speech",
        help="speech, family, voice: folder of WAV commands (speech: with commands.json)",
    )
    bench.add_argument("--texts", type=int, default=1024, help="embed: texts in the bulk job")
    bench.add_argument("--backend", default="onnx-int8", help="embed: the server's backend")
    bench.add_argument("--workload", help="family: workload YAML (default: the family evening)")
    bench.add_argument("--per-member", action="store_true", help=f"family: {PER_MEMBER}")
    bench.add_argument(
        "--targets",
        help="family: servers, comma-separated (default fairlane,fcfs,separate; "
        "fairlane:PROFILE plans with another cost profile, fairlane@SETTING=VALUE with a policy "
        "setting changed, e.g. fairlane@slice_ms=100); voice: "
        "`separate` measures Fairlane against wyoming-piper (default fairlane); busy-host: "
        "spin10k,spin300k,passive,threads1,shell (default all)",
    )
    bench.add_argument(
        "--phases", default="interactive,background,mixed", help="family: phases, comma-separated"
    )
    bench.add_argument(
        "--profile",
        default="cpu-2core",
        help="family: the profile for the SLOs; interference: the servers' cost profile",
    )
    bench.add_argument(
        "--duration",
        type=float,
        help="family: seconds a phase (default: all); overload, soak: seconds of load "
        "(default 60 and 300)",
    )
    bench.add_argument(
        "--factor", type=float, default=3.0, help="overload: clients per queue-limit place"
    )
    bench.add_argument(
        "--hang-s",
        type=float,
        default=150.0,
        help="overload, soak: a request with no answer after this long counts as hung (the "
        "longest waiting limit, background's, is 120 s)",
    )
    bench.add_argument("--url", help="overload, soak: a running server (default: start one)")
    bench.add_argument("--pid", type=int, help="overload, soak: that server's process, for RSS")
    bench.add_argument("--token", help="overload, soak: that server's bearer token")
    bench.add_argument(
        "--no-backoff",
        action="store_true",
        help="overload: clients retry a 429 at once (a hostile or broken client)",
    )
    bench.add_argument("--plot", help="family: write a PNG of the results here")
    bench.add_argument("--json", help="write the figures here")
    bench.set_defaults(func=_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    host.configure()  # before any engine's native library loads
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except ValueError as err:  # configuration and input errors carry a message for a person
        print(f"fairlane: {err}", file=sys.stderr)
        return 2
