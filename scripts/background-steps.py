"""Where a background summary's device time goes between the turns of a chat, by step shape.

Runs the real server in this process with three background summaries of a ~1,400-token manual
(each asks again when it is answered) and, after ROUNDS_ALONE_S of them alone, a short chat
turn every ~3 s for CHAT_S. Then, from the device loop's own step records, the LLM steps that
carried background work and nothing interactive, split by the time bound the policy planned
them to (the slice, or more: `forecast_wait_s` between turns, `arrival_wait_s` with nobody
talking): their count, p50, and the prompt tokens per second of their prefill-only steps; of
those planned to the slice that ran over 1.2 times it, whether the policy predicted it (the
smallest step it may run costs more) or the cost model was wrong. Also the chat turns' time to
first token and the background's LLM tokens per second over the chat phase.

Usage: .venv/bin/python scripts/background-steps.py [SETTING=VALUE ...]
  e.g. forecast_wait_fraction=0 (the rule off: steps between turns keep to the slice), or
  background_min_chunk=8 (an empty step's background prompt chunk at least 8 tokens, past the
  slice).
Time nothing else while it runs: it is a measurement (about 2 minutes).
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import openai
from tests.server.conftest import TOKEN, server_config
from tests.server.test_ordering import LONG_PROMPT

from fairlane.policy import Kind
from fairlane.runtime.metrics import percentile
from fairlane.server import BackgroundServer

ALONE_S = 40.0
CHAT_S = 70.0
SUMMARIES = 3


def main(settings: list[str]) -> None:
    cfg = server_config("fairlane", max_tokens=200)
    changes = {k: yaml.safe_load(v) for k, _, v in (s.partition("=") for s in settings)}
    cfg = replace(cfg, policy=replace(cfg.policy, **changes))
    with BackgroundServer(cfg) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=TOKEN, max_retries=0)
        device = server.services.device
        config = device.policy.config
        stop = threading.Event()

        def summaries(i: int) -> None:
            while not stop.is_set():
                nonce = f"{i}-{time.monotonic_ns()} "  # unique prompts: no prefix cache hits
                client.chat.completions.create(
                    model="x",
                    messages=[{"role": "user", "content": nonce + LONG_PROMPT}],
                    max_tokens=120,
                    extra_body={"fairlane_class": "background"},
                )

        workers = [
            threading.Thread(target=summaries, args=(i,), daemon=True) for i in range(SUMMARIES)
        ]
        for worker in workers:
            worker.start()
        time.sleep(ALONE_S)
        start = time.monotonic()
        ttfts = []
        while time.monotonic() - start < CHAT_S:
            sent = time.monotonic()
            stream = client.chat.completions.create(
                model="x",
                max_tokens=30,
                stream=True,
                messages=[{"role": "user", "content": f"{time.monotonic_ns()} A kitchen fact?"}],
            )
            for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    ttfts.append(time.monotonic() - sent)
                    break
            for _ in stream:
                pass
            time.sleep(3)
        end = time.monotonic()
        stop.set()
        phase = [r for r in device.records if r.kind is Kind.LLM and start <= r.start < end]
        background = sum(_background_tokens(r) for r in phase)
        ttfts.sort()
        print(
            f"chat phase: {len(ttfts)} turns, TTFT p50 {statistics.median(ttfts) * 1000:.0f} ms,"
            f" max {ttfts[-1] * 1000:.0f} ms; background LLM tokens (prompt + generated) "
            f"{background / (end - start):.1f}/s"
        )
        records = [
            r
            for r in device.records
            if r.kind is Kind.LLM and r.classes and not any(p.interactive for p in r.classes)
        ]
        print(
            f"settings {changes or 'default'}: slice {config.slice_s * 1000:.0f} ms, "
            f"forecast wait {config.forecast_wait_s * 1000:.0f} ms, "
            f"arrival wait {config.arrival_wait_s * 1000:.0f} ms"
        )
        eps = 1e-9
        groups = {
            "the slice or less": lambda b: b <= config.slice_s + eps,
            "the forecast wait": lambda b: config.slice_s + eps < b <= config.forecast_wait_s + eps,
            "more (nobody talking)": lambda b: b > config.forecast_wait_s + eps,
        }
        for name, planned in groups.items():
            group = [r for r in records if r.budget_s is not None and planned(r.budget_s)]
            if not group:
                continue
            prefill = [r for r in group if r.prefill_tokens and not r.decode_seqs]
            took = [r.end - r.start for r in group]
            line = (
                f"planned to {name}: {len(group):4d} steps, "
                f"p50 {statistics.median(took) * 1000:6.1f} ms, "
                f"p95 {(percentile(took, 95) or 0.0) * 1000:6.1f} ms"
            )
            if prefill:
                rate = sum(r.prefill_tokens for r in prefill) / sum(
                    r.end - r.start for r in prefill
                )
                tokens = statistics.median(r.prefill_tokens for r in prefill)
                line += (
                    f"; prefill-only {len(prefill)} steps, {tokens:.0f} tokens p50, "
                    f"{rate:.1f} prompt tokens/s"
                )
            print(line)
            _why_over(group, config.slice_s if name == "the slice or less" else None)


def _background_tokens(record) -> int:
    """A step's background tokens: its prompt tokens, when any chunk is background (a step
    carries background prefill only where it carries no interactive prompt), and its
    background decodes."""
    background = [
        rid for rid, p in zip(record.request_ids, record.classes, strict=True) if not p.interactive
    ]
    if not background:
        return 0
    return record.prefill_tokens + sum(1 for rid in record.decodes if rid in background)


def _why_over(group: list, slice_s: float | None) -> None:
    """Of the steps planned to the slice that took more than 1.2 times it: those the policy
    already predicted over it (the smallest step it may run costs more) and those it predicted
    within it (the cost model was wrong)."""
    if slice_s is None:
        return
    over = [r for r in group if r.end - r.start > 1.2 * slice_s]
    if not over:
        return
    planned_over = [r for r in over if r.predicted_s > slice_s * (1 + 1e-9)]
    mispredicted = [r for r in over if r.predicted_s <= slice_s * (1 + 1e-9)]
    print(f"  over 1.2x the slice: {len(over)} of {len(group)}")
    for label, part in (
        ("predicted over the slice", planned_over),
        ("predicted within it", mispredicted),
    ):
        if not part:
            continue
        shapes = (
            statistics.median(r.prefill_tokens for r in part),
            statistics.median(r.decode_seqs for r in part),
        )
        print(
            f"    {label}: {len(part)}, predicted p50 "
            f"{statistics.median(r.predicted_s for r in part) * 1000:.0f} ms, took p50 "
            f"{statistics.median(r.end - r.start for r in part) * 1000:.0f} ms; "
            f"prompt tokens p50 {shapes[0]:.0f}, decodes p50 {shapes[1]:.0f}"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
