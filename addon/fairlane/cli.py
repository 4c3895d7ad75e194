"""The `fairlane` command: serve, and the subcommands of `sim_command` (simulate, tune,
profile), `models_command` (models) and `bench_command` (bench), each module with its
subcommands' arguments next to the few lines that run them.
"""

from __future__ import annotations

import argparse
import sys

from fairlane import __version__
from fairlane.runtime import host

# Nothing at this module's top may import numpy, llama.cpp, onnxruntime or torch: `main` sets
# the thread environment first, and each native library reads it once, when it loads
# (tests/runtime/test_host.py checks). Each command imports what it runs.


def _serve(args: argparse.Namespace) -> int:
    from fairlane.server import serve

    return int(serve(args))


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

    from fairlane import bench_command, models_command, sim_command

    sim_command.add_parsers(sub)
    models_command.add_parser(sub)
    bench_command.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    host.configure()  # before any engine's native library loads
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except ValueError as err:  # configuration and input errors carry a message for a person
        print(f"fairlane: {err}", file=sys.stderr)
        return 2
