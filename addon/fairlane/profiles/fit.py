"""Profiles fitted, not typed: the cost model's terms from measured step times.

`fairlane bench engine` writes what one device measured: prefill chunks of several sizes,
decode iterations of 1-64 sequences, one sequence's decode after long contexts, and (with
`--occupancy`) a decode beside other sequences holding KV cells. Each measurement is one step
of a known shape (prompt tokens, decoding sequences, KV positions attended to, KV cells held),
and the cost model is linear in the terms of that shape (`policy.cost.LlmCost`), so the
profile is the non-negative least-squares fit of those terms, in relative error (a 2 s
prefill and a 2 ms decode count alike). The fit's error on the points it came from is written
into the profile's header, and tests/policy/test_profile_fit.py holds the profile to it.

`fairlane profile fit --engine run1.json [run2.json …] [--embed embeddings.json] --base h100
--name NAME --description TEXT --out NAME.yaml`
"""

from __future__ import annotations

import json
import statistics
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from scipy.optimize import nnls

from fairlane.policy import CostModel, CostProfile, EmbedCost, EmbedPlan, Kind, LlmCost
from fairlane.policy.cost import TERMS
from fairlane.profiles import load

# How `fairlane bench engine` lays out its steps (bench/llm.py): a decode sequence is measured
# after a 64-token prompt, over 12 iterations (the median is the 6th); a context decode after
# `context` prompt tokens, the same way.
DECODE_PROMPT = 64
MEDIAN_STEP = 6


@dataclass(frozen=True)
class Point:
    """One measured LLM step of a known shape."""

    what: str  # "prefill", "decode", "context" or "occupancy": which sweep it came from
    prefill: int
    decodes: int
    context: int  # KV positions the step's chunks attend to
    held: int  # KV cells in use by all sequences, this step's included
    ms: float


def llm_points(bench: dict[str, Any]) -> list[Point]:
    """The steps of one `fairlane bench engine` run (its JSON), each with its shape."""
    if "points" in bench:  # written with every step's shape (bench/llm.py since the fit)
        return [Point(**p) for p in bench["points"]]
    points = [
        Point("prefill", int(size), 0, int(size), int(size), per_token * int(size))
        for size, per_token in bench["prefill_ms_per_token"].items()
    ]
    position = DECODE_PROMPT + MEDIAN_STEP + 1
    points += [
        Point("decode", 0, int(seqs), int(seqs) * position, int(seqs) * position, ms)
        for seqs, ms in bench["decode_ms_per_iteration"].items()
    ]
    points += [
        Point("context", 0, 1, int(c) + MEDIAN_STEP + 1, int(c) + MEDIAN_STEP + 1, ms)
        for c, ms in bench.get("context_decode_ms", {}).items()
    ]
    return points


def _row(point: Point) -> list[float]:
    """The point's terms with every cost 1 (ms): the columns of the least-squares problem."""
    unit = CostModel(
        CostProfile(
            "unit",
            LlmCost(1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0),
            EmbedCost(1.0, 1.0),
            load("cpu-2core")[0].stt,
        )
    )
    return list(unit._llm_terms(point.prefill, point.decodes, point.context, point.held))


def fit_llm(points: list[Point], without: tuple[str, ...] = ()) -> LlmCost:
    """The non-negative LLM terms that fit `points` best in relative error; the terms named in
    `without` (of `TERMS[Kind.LLM]`) stay 0, for data that cannot tell them apart."""
    names = TERMS[Kind.LLM]
    if unknown := [name for name in without if name not in names]:
        raise ValueError(f"unknown LLM terms {unknown}; the terms are {', '.join(names)}")
    # A sweep's steps follow one another on one engine: the switch term is not in them.
    without = (*without, "switch")
    keep = [i for i, name in enumerate(names) if name not in without]
    rows = np.array([_row(p) for p in points])[:, keep]
    measured = np.array([p.ms for p in points])
    fitted, _ = nnls(rows / measured[:, None], np.ones(len(points)))
    weights = np.zeros(len(names))
    weights[keep] = fitted
    base, prefill_base, prefill_token, decode_seq, context_us, attention_ns, prefill_attention = (
        weights[: names.index("switch")]
    )
    return LlmCost(
        base_ms=_sig(base),
        prefill_token_ms=_sig(prefill_token),
        decode_seq_ms=_sig(decode_seq),
        context_token_us=_sig(context_us),
        prefill_base_ms=_sig(prefill_base),
        attention_ns=_sig(attention_ns),
        prefill_attention_ns=_sig(prefill_attention),
    )


def llm_errors(cost: LlmCost, points: list[Point]) -> list[float]:
    """|predicted − measured| / measured for each point, under `cost`."""
    model = CostModel(replace(load("cpu-2core")[0], llm=cost))
    return [
        abs(model.llm_s(p.prefill, p.decodes, p.context, p.held) * 1000 - p.ms) / p.ms
        for p in points
    ]


def embed_points(bench: dict[str, Any], dtype: str) -> list[tuple[int, float]]:
    """(padded tokens, ms) per micro-batch from an embedding throughput run."""
    tokens = int(bench["tokens_per_text"])
    return [
        (int(batch) * tokens, int(batch) / rate * 1000.0)
        for batch, rate in bench["texts_per_s"][dtype].items()
    ]


def fit_embed(points: list[tuple[int, float]]) -> EmbedCost:
    rows = np.array([[1.0, tokens] for tokens, _ in points])
    measured = np.array([ms for _, ms in points])
    (base, token), _ = nnls(rows / measured[:, None], np.ones(len(points)))
    return EmbedCost(base_ms=_sig(base), token_ms=_sig(token))


def embed_errors(cost: EmbedCost, points: list[tuple[int, float]]) -> list[float]:
    model = CostModel(replace(load("cpu-2core")[0], embed=cost))
    return [
        abs(model.plan_s(EmbedPlan((), 0, tokens, 0.0)) * 1000 - ms) / ms  # type: ignore[arg-type]
        for tokens, ms in points
    ]


def summary(errors: list[float]) -> dict[str, float]:
    ordered = sorted(errors)
    return {
        "median": round(statistics.median(ordered), 3),
        "p95": round(ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))], 3),
        "max": round(ordered[-1], 3),
        "points": len(errors),
    }


def _sig(value: float) -> float:
    """Four significant figures: a profile is read by people too."""
    return float(f"{value:.4g}")


def commit() -> str:
    try:
        found = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True,
            cwd=Path(__file__).parent,
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return found.stdout.strip()


def fit_profile(
    engine_json: list[Path],
    base: str,
    name: str,
    description: str,
    embed_json: Path | None = None,
    embed_dtype: str = "float16",
    command: str = "",
    without: tuple[str, ...] = (),
    notes: tuple[str, ...] = (),
    measured: dict[str, Any] | None = None,
) -> tuple[str, dict[str, Any]]:
    """A profile's YAML (header with the command, commit and the fit's error) and the errors.

    The LLM terms come from the `engine_json` runs together (repeats of a sweep on a noisy
    host are fitted as one set), the embedding terms from `embed_json` when given;
    what was not measured (speech, synthesis, embeddings otherwise) is taken from the `base`
    profile and said to be so in the header. `measured`: terms timed some other way
    (`fairlane tune --calibrate` times the embedder and Whisper: {"embed": EmbedCost, "stt":
    SttCost}), written as they are and named in the header.
    """
    measured = measured or {}
    start, device = load(base)
    points = [p for path in engine_json for p in llm_points(json.loads(path.read_text()))]
    # The switch term (a step right after another engine's) is measured otherwise: kept.
    llm = replace(fit_llm(points, without), switch_share=start.llm.switch_share)
    errors: dict[str, Any] = {"llm": summary(llm_errors(llm, points))}
    errors["llm_by_sweep"] = {
        what: summary(llm_errors(llm, [p for p in points if p.what == what]))
        for what in sorted({p.what for p in points})
    }
    embed = measured.get("embed", start.embed)
    if embed_json is not None:
        embed_measured = embed_points(json.loads(embed_json.read_text()), embed_dtype)
        embed = fit_embed(embed_measured)
        errors["embed"] = summary(embed_errors(embed, embed_measured))
    header = [
        f"{name}: {description}",
        f"Fitted by `{command or 'fairlane profile fit'}` at commit {commit()}.",
        f"LLM terms from {', '.join(p.name for p in engine_json)}: relative error median "
        f"{errors['llm']['median']:.1%}, p95 {errors['llm']['p95']:.1%}, max "
        f"{errors['llm']['max']:.1%} over "
        f"{errors['llm']['points']} steps ("
        + ", ".join(
            f"{what} {e['median']:.1%} / {e['max']:.1%}"
            for what, e in errors["llm_by_sweep"].items()
        )
        + ").",
    ]
    if embed_json is not None:
        header.append(
            f"Embedding terms from {embed_json.name} ({embed_dtype}): relative error median "
            f"{errors['embed']['median']:.1%}, max {errors['embed']['max']:.1%}."
        )
    elif "embed" in measured:
        header.append("Embedding terms: timed on this machine (fairlane tune --calibrate).")
    else:
        header.append(f"Embedding terms: not measured here, from the {base} profile.")
    stt = measured.get("stt", start.stt)
    if "stt" in measured:
        header.append(
            "Speech terms: timed on this machine (fairlane tune --calibrate); synthesis "
            f"terms: from the {base} profile."
        )
    else:
        header.append(f"Speech and synthesis terms: not measured here, from the {base} profile.")
    host = measured.get("host", start.host)
    header.append(
        "Host round trip: measured on this machine (fairlane tune --calibrate)."
        if "host" in measured
        else f"Host round trip: from the {base} profile."
    )
    if without:
        header.append(f"Not fitted (kept at 0): {', '.join(without)}.")
    if start.llm.switch_share:
        header.append(f"The LLM's switch term (a step right after another engine's): from the "
                      f"{base} profile.")
    header += notes
    data = {
        "name": name,
        "description": description,
        "device": device,
        "llm": {k: v for k, v in vars(llm).items()},
        "embed": {k: v for k, v in vars(embed).items()},
        "stt": {k: v for k, v in vars(stt).items()},
        "tts": {k: v for k, v in vars(start.tts).items()},
        "host": {k: v for k, v in vars(host).items()},
        "fit_error": errors,
    }
    text = "".join(f"# {line}\n" for line in header)
    text += yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=100)
    return text, errors
