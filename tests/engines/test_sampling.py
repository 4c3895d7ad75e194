"""Sampling outside llama.cpp's chain: greedy as the argmax of the decode's logits, and a
temperature draw with the same distribution as llama.cpp's `temperature → dist` chain."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import numpy as np
import pytest

from fairlane.engines import models
from fairlane.engines.llm import EngineConfig, LlamaEngine, lc
from fairlane.engines.sampling import SamplingParams, draw, drawn_here, greedy
from fairlane.policy import Chunk, LlmPlan, Priority


def _softmax(row: np.ndarray, temperature: float) -> np.ndarray:
    weights = np.exp((row.astype(np.float64) - row.max()) / temperature)
    return weights / weights.sum()


@pytest.mark.parametrize("shape", ["peaked", "flat"])
def test_a_draw_has_the_softmax_distribution(shape: str) -> None:
    """Peaked: the head holds the mass; flat: most draws land in the tail, walked in order."""
    rng = np.random.default_rng(7)
    row = rng.standard_normal(50_000).astype(np.float32)
    if shape == "peaked":
        row[[11, 222, 3333]] += np.float32(12.0)
    expected = _softmax(row, 0.7)
    counts = Counter(draw(row, SamplingParams(temperature=0.7), rng) for _ in range(20_000))
    for token in np.argsort(expected)[::-1][:5]:
        # 20,000 draws: the standard error of a frequency p is sqrt(p(1-p)/20000) ≤ 0.0036.
        assert counts[int(token)] / 20_000 == pytest.approx(expected[token], abs=0.015)
    if shape == "flat":
        assert len(counts) > 5_000  # the tail is really drawn from


def test_the_same_seed_gives_the_same_draws_and_top_k_keeps_to_the_k_best() -> None:
    row = np.random.default_rng(1).standard_normal(1000).astype(np.float32)
    params = SamplingParams(temperature=1.5, top_k=5)
    first = [draw(row, params, np.random.default_rng(42)) for _ in range(3)]
    assert first == [draw(row, params, np.random.default_rng(42)) for _ in range(3)]
    best = set(np.argsort(row)[-5:].tolist())
    rng = np.random.default_rng(3)
    assert {draw(row, params, rng) for _ in range(500)} == best


def test_which_parameters_leave_llama_cpp_s_chain() -> None:
    assert greedy(SamplingParams(temperature=0)) and not drawn_here(SamplingParams(temperature=0))
    assert drawn_here(SamplingParams(temperature=0.7, top_k=40))
    assert not drawn_here(SamplingParams(temperature=0.7, top_p=0.9))  # top-p: llama.cpp's
    # A grammar is applied apart from the choice: greedy stays the argmax of what it allows.
    assert greedy(SamplingParams(temperature=0, grammar='root ::= "a"'))


@pytest.fixture(scope="module")
def engine() -> Iterator[LlamaEngine]:
    engine = LlamaEngine(EngineConfig(models.resolve_llm("gemma-3-270m"), n_ctx=1024,
                                      n_seq_max=3, n_batch=256))
    yield engine
    engine.close()


def test_greedy_tokens_are_llama_cpp_s_greedy_choice(engine: LlamaEngine) -> None:
    """A mixed batch (a prompt chunk beside others' one-token decodes): each sequence's argmax
    is the token llama.cpp's own greedy sampler picks from the same logits."""
    prompts = {"a": "The capital of France is", "b": "One, two, three,", "c": "Hello"}
    tokens = {rid: engine.tokenize(text, add_special=True) for rid, text in prompts.items()}
    for rid, prompt in tokens.items():
        engine.add(rid, prompt, SamplingParams(max_tokens=8, temperature=0))
    engine.execute(LlmPlan((Chunk("a", 0, len(tokens["a"]), True, False, Priority.CHAT),), (),
                           0.0, 0))
    engine.execute(LlmPlan((Chunk("b", 0, len(tokens["b"]), True, False, Priority.CHAT),), (),
                           0.0, 0))
    chunks = (
        Chunk("c", 0, len(tokens["c"]), True, False, Priority.CHAT),
        Chunk("a", len(tokens["a"]), 1, True, True, Priority.CHAT),
        Chunk("b", len(tokens["b"]), 1, True, True, Priority.CHAT),
    )
    _, events = engine.execute(LlmPlan(chunks, (), 0.0, 0))
    assert len(events) == 3
    chain = lc.llama_sampler_chain_init(lc.llama_sampler_chain_default_params())
    lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_greedy())
    try:
        positions = {"c": len(tokens["c"]) - 1, "a": len(tokens["c"]), "b": len(tokens["c"]) + 1}
        for rid, position in positions.items():
            assert engine.sequences[rid].tokens[-1] == lc.llama_sampler_sample(
                chain, engine.ctx, position
            )
    finally:
        lc.llama_sampler_free(chain)
        for rid in prompts:
            engine.release(rid)
