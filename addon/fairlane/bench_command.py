"""`fairlane bench`: every benchmark's arguments, each next to the few lines that run it (the
work is in fairlane.bench).

Nothing at this module's top imports numpy or an engine (see fairlane.cli).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def default_threads() -> int:
    """One engine thread per core this process owns."""
    from fairlane.engines.llm import default_threads as owned

    return owned()


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from fairlane.sim_command import PER_MEMBER

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
            "remote",
            "results",
        ],
    )
    bench.add_argument("--datasets", help="assist: a checkout of home-assistant-datasets")
    bench.add_argument(
        "--data", default="docs/results/data", help="results: the benchmarks' JSON files"
    )
    bench.add_argument("--out", default="docs/results", help="results: where the PNGs go")
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
    bench.add_argument(
        "--parallel", type=int, default=4, help="remote: llama-server's --parallel slots"
    )
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
        "spin10k,giveway,fixed,spin300k,passive,threads1,shell (default all)",
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


def _bench(args: argparse.Namespace) -> int:
    from fairlane.bench import llm
    from fairlane.bench.scheduler import scheduler_decision_time

    threads = args.threads or default_threads()
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
    elif args.what == "results":
        from fairlane.bench.results import plot_all

        for written in plot_all(Path(args.data), Path(args.out)):
            print(f"plot: {written}")
        return 0
    elif args.what == "remote":
        from fairlane.bench import remote as remote_bench

        targets = (args.targets or ",".join(remote_bench.TARGETS)).split(",")
        result = remote_bench.remote(
            targets, args.rounds, threads, args.duration or 120.0, args.parallel
        )
        print(remote_bench.format_rows(result["rows"]))
        print(f"fairlane / llama-server (medians): {result['ratios']}")
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
    result["duration_s"] = scn.workload.duration_s
    result["slo"] = {p.label: vars(s) for p, s in scn.workload.slo.items()}
    if args.plot:
        from fairlane.bench.family_report import plot

        plot(result, Path(args.plot))
        print(f"plot: {args.plot}")
    return result


def _occupancy(item: str) -> tuple[int, int]:
    try:
        others, cells = (int(part) for part in item.lower().split("x"))
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"{item!r}: give NxM, e.g. 2x512") from err
    return others, cells


def _key_value(item: str) -> tuple[str, float]:
    key, _, value = item.partition("=")
    try:
        return key, float(value)
    except ValueError as err:
        raise ValueError(f"--set {item!r}: expected KEY=NUMBER") from err
