"""`fairlane bench engine --after-embed`: a decode right after an embedding batch on the same
device, beside one right after a decode, on the real engines."""

from __future__ import annotations

import pytest

from fairlane.bench.llm import AFTER_ROUNDS, engine_costs
from fairlane.profiles.fit import llm_points


@pytest.mark.model
def test_a_decode_is_timed_after_an_embedding_batch_and_after_a_decode() -> None:
    out = engine_costs(1, prefill_sizes=(16,), decode_sizes=(1,), after_embed=2)
    after = out["after_embed"]
    assert set(after) == {"after_decode_ms", "embed_ms", "after_embed_ms"}
    assert all(ms > 0 for ms in after.values())
    # Both are fitted as what they are to the cost model: one sequence's decode at the KV
    # position the rounds reached halfway.
    points = [p for p in llm_points(out) if p.what == "after"]
    # The point keeps 3 decimals and the summary 2, each rounded from the same median.
    assert [p.ms for p in points] == pytest.approx(
        [after["after_decode_ms"], after["after_embed_ms"]], abs=0.006
    )
    assert all(p.decodes == 1 and p.prefill == 0 for p in points)
    assert points[0].context == 64 + 2 * AFTER_ROUNDS
