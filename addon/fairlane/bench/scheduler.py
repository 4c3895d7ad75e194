"""Benchmarks that print figures (never timed tests). `fairlane bench scheduler`."""

from __future__ import annotations

import time

from fairlane.policy import (
    CostModel,
    FairlaneScheduler,
    IdlePlan,
    Kind,
    LlmPlan,
    PolicyConfig,
    Priority,
    Request,
    SeqOutput,
    StepResult,
)
from fairlane.profiles import load as load_profile


def _step_outputs(plan: LlmPlan) -> tuple[SeqOutput, ...]:
    return tuple(SeqOutput(c.request_id, new_tokens=1) for c in plan.chunks if c.samples)


def scheduler_decision_time(sizes: list[int], steps: int) -> list[dict[str, float]]:
    """Time `schedule()` (and `update_from_output()`) with N sequences decoding.

    Each case has N chat/voice/background sequences in the running batch and a waiting backlog
    of 1,000 texts to embed, so the lane choice and the fairness queues do real work too.
    """
    profile, _ = load_profile("rtx4090")
    rows = []
    print(f"{'running seqs':>12}{'schedule µs p50':>17}{'p99':>9}{'+ update µs p50':>17}{'p99':>9}")
    for size in sizes:
        config = PolicyConfig(
            max_num_seqs=size,
            kv_blocks=size * 512,
            max_batch_tokens=8192,
            queue_limit=dict.fromkeys(Priority, 10**6),  # every sequence admitted, at 256 too
        )
        policy = FairlaneScheduler(config, CostModel(profile))
        classes = [Priority.VOICE, Priority.CHAT, Priority.BACKGROUND]
        for i in range(size):
            # Long enough to decode through every timed step; within a sequence's KV share.
            sequence = Request(
                f"r{i}",
                Kind.LLM,
                classes[i % 3],
                f"client{i % 5}",
                0.0,
                prompt_tokens=64,
                max_tokens=steps + 100,
            )
            admission = policy.add(sequence, 0.0)
            assert admission.accepted, admission.reason
        for i in range(1000):
            policy.add(
                Request(f"e{i}", Kind.EMBED, Priority.BACKGROUND, "docs", 0.0, prompt_tokens=256),
                0.0,
            )
        now = 0.0
        decide: list[float] = []
        total: list[float] = []
        for step in range(steps + 50):
            t0 = time.perf_counter()
            plan = policy.schedule(now)
            t1 = time.perf_counter()
            if isinstance(plan, IdlePlan):
                break
            now += plan.predicted_s
            outputs = (
                _step_outputs(plan)
                if isinstance(plan, LlmPlan)
                else tuple(SeqOutput(r, finished=True) for r in plan.request_ids)
            )
            policy.update_from_output(plan, StepResult(plan.predicted_s, outputs), now)
            t2 = time.perf_counter()
            if step >= 50:  # the first steps prefill; measure the steady decode state
                decide.append((t1 - t0) * 1e6)
                total.append((t2 - t0) * 1e6)
        decide.sort()
        total.sort()
        row = {
            "running": size,
            "schedule_us_p50": decide[len(decide) // 2],
            "schedule_us_p99": decide[int(len(decide) * 0.99)],
            "step_us_p50": total[len(total) // 2],
            "step_us_p99": total[int(len(total) * 0.99)],
        }
        rows.append(row)
        print(
            f"{size:>12}{row['schedule_us_p50']:>17.0f}{row['schedule_us_p99']:>9.0f}"
            f"{row['step_us_p50']:>17.0f}{row['step_us_p99']:>9.0f}"
        )
    return rows
