"""Where a background summary's device time goes between the turns of a chat, by step shape.

Runs the real server in this process with three background summaries of a ~1,400-token manual
(each asks again when it is answered) and, after ROUNDS_ALONE_S of them alone, a short chat
turn every ~3 s for CHAT_S. Then, from the device loop's own step records, the LLM steps that
carried background work and nothing interactive, split by the time bound the policy planned
them to (the slice, or more: `forecast_wait_s` between turns, `arrival_wait_s` with nobody
talking): their count, p50, and the prompt tokens per second of their prefill-only steps.

Usage: .venv/bin/python scripts/background-steps.py [SETTING=VALUE ...]
  e.g. forecast_wait_fraction=0 (the rule off: steps between turns keep to the slice).
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
                    model="x", messages=[{"role": "user", "content": nonce + LONG_PROMPT}],
                    max_tokens=120, extra_body={"fairlane_class": "background"},
                )

        workers = [threading.Thread(target=summaries, args=(i,), daemon=True)
                   for i in range(SUMMARIES)]
        for worker in workers:
            worker.start()
        time.sleep(ALONE_S)
        start = time.monotonic()
        while time.monotonic() - start < CHAT_S:
            client.chat.completions.create(
                model="x", max_tokens=30,
                messages=[{"role": "user", "content": f"{time.monotonic_ns()} A kitchen fact?"}],
            )
            time.sleep(3)
        stop.set()
        records = [r for r in device.records if r.kind is Kind.LLM and r.classes
                   and not any(p.interactive for p in r.classes)]
        print(f"settings {changes or 'default'}: slice {config.slice_s * 1000:.0f} ms, "
              f"forecast wait {config.forecast_wait_s * 1000:.0f} ms, "
              f"arrival wait {config.arrival_wait_s * 1000:.0f} ms")
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
            line = (f"planned to {name}: {len(group):4d} steps, "
                    f"p50 {statistics.median(took) * 1000:6.1f} ms")
            if prefill:
                rate = sum(r.prefill_tokens for r in prefill) / sum(
                    r.end - r.start for r in prefill)
                tokens = statistics.median(r.prefill_tokens for r in prefill)
                line += (f"; prefill-only {len(prefill)} steps, {tokens:.0f} tokens p50, "
                         f"{rate:.1f} prompt tokens/s")
            print(line)

if __name__ == "__main__":
    main(sys.argv[1:])
