"""`fairlane models list | pull | rm`: the catalogue for this machine, and pulled models."""

from __future__ import annotations

import argparse
import sys

from fairlane.engines import catalogue, pull
from fairlane.engines.models import ModelError


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    models = sub.add_parser("models", help="the model catalogue; pull and remove models")
    action = models.add_subparsers(dest="action", required=True)
    listing = action.add_parser("list", help="the catalogue, this machine's tier marked")
    listing.add_argument("--gpu-gb", type=float, help="the GPU's memory (default: none)")
    fetch = action.add_parser("pull", help="pull a model: a catalogue name, hf:OWNER/REPO/FILE"
                              ".gguf or OWNER/REPO:QUANT (HF_ENDPOINT: another hub)")
    fetch.add_argument("model")
    remove = action.add_parser("rm", help="remove a pulled model")
    remove.add_argument("model")
    models.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        if args.action == "list":
            return _list(args.gpu_gb)
        found = catalogue.reference(args.model)
        if isinstance(found, str):
            print(f"{found} is packaged: it comes with Fairlane, nothing to pull or remove")
            return 0
        if args.action == "pull":
            path = pull.pull(found, progress=_show)
            print(f"\n{path}\nserve it with: fairlane serve --set llm.model={args.model}")
            return 0
        if not pull.remove(found):
            print(f"{found.label} was not pulled", file=sys.stderr)
            return 1
        print(f"removed {found.label}")
        return 0
    except ModelError as err:
        print(f"fairlane: {err}", file=sys.stderr)
        return 2


def _list(gpu_gb: float | None) -> int:
    tier = catalogue.this_machine(gpu_gb)
    print(f"this machine: {tier}  (pulled: {', '.join(p for p, _ in pull.pulled()) or 'none'})")
    for role in catalogue.ROLES:
        print(f"\n{role}:")
        fits = {e.name for e in catalogue.recommended(role, tier)}
        for entry in (e for e in catalogue.load() if e.role == role):
            source = "packaged" if entry.packaged else entry.faster_whisper or (
                f"{entry.repo}/{entry.file}")
            assist = entry.assist or {}
            accuracy = (f", assist-mini {assist['published']:.0%} (published)"
                        if "published" in assist else "")
            mark = "*" if entry.name in fits else " "
            print(f" {mark} {entry.name:<28} {entry.size_mb / 1000:5.1f} GB  "
                  f"{'/'.join(entry.tiers):<26} {entry.licence}{accuracy}\n"
                  f"     {source}: {entry.why}")
    print("\n* fits this machine")
    return 0


def _show(state: pull.Progress) -> None:
    total = state.total or 0
    percent = f"{100 * state.done / total:5.1f}%" if total else ""
    eta = f", {state.eta_s:.0f} s left" if state.eta_s is not None else ""
    print(f"\r{state.label}: {state.done / 1e6:8.1f} / {total / 1e6:.1f} MB {percent} "
          f"{state.rate / 1e6:.1f} MB/s{eta}   ", end="", flush=True)
