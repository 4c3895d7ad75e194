"""The llama.cpp engine's mechanics on a real (small) model: batches, ids, isolation, KV."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fairlane import models
from fairlane.chat import ChatTemplate, ChatTemplateError
from fairlane.engines.llm import EngineConfig, LlamaEngine, SamplingParams
from fairlane.policy import Chunk, LlmPlan, Priority

GREEDY = SamplingParams(max_tokens=12, temperature=0)


@pytest.fixture(scope="module")
def engine() -> Iterator[LlamaEngine]:
    # Gemma 3 270M is a base model: fast, fine for mechanics, never for chat.
    engine = LlamaEngine(EngineConfig(models.resolve_llm("gemma-3-270m"), n_ctx=2048,
                                      n_seq_max=4, n_batch=256))
    yield engine
    engine.close()


def _run(engine: LlamaEngine, prompts: dict[str, str], steps: int) -> dict[str, list[int]]:
    """Prefill every prompt in one iteration, then decode them together for `steps` more."""
    tokens = {rid: engine.tokenize(text, add_special=True) for rid, text in prompts.items()}
    for rid, prompt in tokens.items():
        engine.add(rid, prompt, GREEDY)
    chunks = tuple(Chunk(rid, 0, len(t), True, False, Priority.CHAT) for rid, t in tokens.items())
    engine.execute(LlmPlan(chunks, (), 0.0, 0))
    for _ in range(steps):
        chunks = tuple(
            Chunk(rid, len(engine.sequences[rid].tokens) - 1, 1, True, True, Priority.CHAT)
            for rid in tokens
        )
        engine.execute(LlmPlan(chunks, (), 0.0, 0))
    out = {rid: engine.sequences[rid].tokens[len(tokens[rid]):] for rid in tokens}
    for rid in tokens:
        engine.release(rid)
    return out


def test_one_decode_call_carries_every_sequence(engine: LlamaEngine) -> None:
    out = _run(engine, {"a": "The kitchen light is", "b": "Dinner tonight will be",
                        "c": "The school letter says"}, steps=5)
    assert all(len(tokens) == 6 for tokens in out.values())  # 1 from prefill + 5 decodes


def test_a_sequence_is_unaffected_by_what_the_others_contain(engine: LlamaEngine) -> None:
    target = "The washing machine finished its cycle and"
    with_b = _run(engine, {"t": target, "o": "Bread needs flour, water and"}, steps=8)
    with_c = _run(engine, {"t": target, "o": "Invoice 4471 from the plumber is due in"}, steps=8)
    assert with_b["t"] == with_c["t"]


def test_released_ids_and_kv_are_reused(engine: LlamaEngine) -> None:
    for round_ in range(3):
        _run(engine, {f"r{round_}-{i}": "Hello there" for i in range(4)}, steps=1)
        assert sorted(engine.free_ids) == [0, 1, 2, 3]
    assert engine.sequences == {}


def test_preempted_sequence_resumes_by_recomputation(engine: LlamaEngine) -> None:
    prompt = engine.tokenize("The garden needs water because", add_special=True)
    engine.add("p", prompt, GREEDY)
    engine.execute(LlmPlan((Chunk("p", 0, len(prompt), True, False, Priority.BACKGROUND),),
                           (), 0.0, 0))
    seq_id = engine.sequences["p"].seq_id
    known = len(engine.sequences["p"].tokens)
    # Preempted: its cells are dropped, its id goes back; the next plan recomputes everything.
    engine.execute(LlmPlan((), ("p",), 0.0, 0))
    assert engine.sequences["p"].seq_id is None and seq_id in engine.free_ids
    result, _ = engine.execute(
        LlmPlan((Chunk("p", 0, known, True, False, Priority.BACKGROUND),), (), 0.0, 0)
    )
    assert result.outputs[0].new_tokens == 1 and len(engine.sequences["p"].tokens) == known + 1
    engine.release("p")


def test_a_base_model_without_chat_template_is_refused_loudly(engine: LlamaEngine) -> None:
    assert engine.metadata("tokenizer.chat_template") is None
    with pytest.raises(ChatTemplateError, match=r"no tokenizer\.chat_template"):
        ChatTemplate(engine.metadata("tokenizer.chat_template"))


def test_prompt_longer_than_the_context_is_an_error(engine: LlamaEngine) -> None:
    from fairlane.engines.llm import EngineError

    with pytest.raises(EngineError, match="exceeds the context"):
        engine.add("big", list(range(10, 3000)), GREEDY)
