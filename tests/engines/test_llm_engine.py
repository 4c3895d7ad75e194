"""The llama.cpp engine's mechanics on a real (small) model: batches, ids, isolation, KV."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fairlane.engines import models
from fairlane.engines.chat_template import ChatTemplate, ChatTemplateError
from fairlane.engines.llm import EngineConfig, LlamaEngine, SamplingParams, extra_buffers_safe
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


# --- the prefix cache ----------------------------------------------------------------------

HOUSE = ("You are the voice assistant of a house with a kitchen, a living room, two bedrooms "
         "and a garden. The kitchen light, the hallway lamp and the garden sprinkler can be "
         "switched. Answer briefly. ")
SHORT = SamplingParams(max_tokens=4, temperature=0)


@pytest.fixture(scope="module")
def cached_engine() -> Iterator[LlamaEngine]:
    engine = LlamaEngine(EngineConfig(models.resolve_llm("gemma-3-270m"), n_ctx=2048,
                                      n_seq_max=4, n_batch=256, prefix_cache_tokens=256))
    yield engine
    engine.close()


def _complete(engine: LlamaEngine, rid: str, text: str, priority: Priority = Priority.VOICE,
              split: int = 0) -> tuple[int, int, list[int]]:
    """Run one request to its end as the device loop would; (reused, prefilled, output).

    `split`: prefill the prompt in two chunks, the first `split` tokens first."""
    prompt = engine.tokenize(text, add_special=True)
    reused = engine.add(rid, prompt, SHORT)
    if split > reused:
        engine.execute(LlmPlan(
            (Chunk(rid, reused, split - reused, False, False, priority),), (), 0.0, 0))
    start = max(reused, split)
    engine.execute(LlmPlan(
        (Chunk(rid, start, len(prompt) - start, True, False, priority),), (), 0.0, 0))
    while engine.sequences[rid].finish_reason is None:
        seq = engine.sequences[rid]
        engine.execute(LlmPlan(
            (Chunk(rid, len(seq.tokens) - 1, 1, True, True, priority),), (), 0.0, 0))
    out = engine.sequences[rid].tokens[len(prompt):]
    engine.release(rid)
    return reused, len(prompt) - reused, out


def test_a_prompt_that_starts_like_a_finished_one_reuses_its_cells(
    engine: LlamaEngine, cached_engine: LlamaEngine
) -> None:
    first = HOUSE + "Turn on the kitchen light."
    second = HOUSE + "Is the garden sprinkler on?"
    reused, prefilled, _ = _complete(cached_engine, "first", first)
    assert reused == 0  # nothing cached yet
    shared = len(engine.tokenize(HOUSE, add_special=True)) - 1
    reused, prefilled, out = _complete(cached_engine, "second", second)
    assert reused >= shared  # the whole shared preamble
    assert prefilled == len(engine.tokenize(second, add_special=True)) - reused
    # The same greedy answer as an engine without a cache that computed the same chunks from
    # the first token (a prompt in one chunk or in two is not the same arithmetic: on a CPU
    # with AVX512-BF16 the answers part after a few tokens).
    _, _, plain = _complete(engine, "plain", second, split=reused)
    assert out == plain


def test_the_cache_keeps_to_its_budget_and_never_evicts_what_is_about_to_be_used(
    cached_engine: LlamaEngine,
) -> None:
    for i in range(4):
        _complete(cached_engine, f"fill-{i}", f"Note {i}: " + HOUSE * 2)
        assert sum(len(e.tokens) for e in cached_engine.cache) <= 256
        assert len(cached_engine.cache) <= cached_engine.config.prefix_cache_slots
    # Admitted to start from an entry: that entry stays while other sequences finish.
    prompt = cached_engine.tokenize("Note 3: " + HOUSE * 2 + "And?", add_special=True)
    reused = cached_engine.add("pinned", prompt, SHORT)
    entry = cached_engine.sequences["pinned"].reuse
    assert reused > 0 and entry is not None
    for i in range(3):
        _complete(cached_engine, f"other-{i}", f"Other {i}: " + HOUSE * 2)
    assert entry in cached_engine.cache
    cached_engine.release("pinned")  # never ran: nothing new cached, the pin is gone
    assert entry.pins == 0


def test_a_cancelled_sequence_is_not_cached(cached_engine: LlamaEngine) -> None:
    before = [e.tokens for e in cached_engine.cache]
    prompt = cached_engine.tokenize("Cancelled: " + HOUSE, add_special=True)
    cached_engine.add("gone", prompt, SHORT)
    cached_engine.execute(LlmPlan((Chunk("gone", 0, len(prompt), True, False, Priority.CHAT),),
                                  (), 0.0, 0))
    cached_engine.release("gone")  # cancelled mid-answer: its finish reason is unset
    assert [e.tokens for e in cached_engine.cache] == before


# --- the prefix cache under the policy's accounting (review R12) ------------------------------


def test_shared_prefix_cells_are_counted_once_and_never_lost_from_the_budget() -> None:
    """The device loop's protocol (register → policy.add → schedule → execute → apply → release)
    on a 512-cell context: a turn that starts from a cached prefix is running when another turn
    finishes, and then the policy fills its capacity. The prefix's cells belong to the cache's
    budget until that turn is released, so the cache does not take in the finished turn in
    their place, and llama_decode always finds its cells (it failed here before)."""
    from fairlane import config
    from fairlane.policy import CostModel, IdlePlan, Kind, Request, make_policy
    from tests.policy.helpers import PROFILE

    cfg = config.parse({"llm": {"n_ctx": 512, "n_seq_max": 4, "prefix_cache_tokens": 128}})
    engine = LlamaEngine(EngineConfig(models.resolve_llm("gemma-3-270m"), n_ctx=512,
                                      n_seq_max=4, n_batch=256,
                                      prefix_cache_tokens=cfg.engine_cache_tokens))
    policy = make_policy("fairlane", cfg.serving_policy("gpu"), CostModel(PROFILE))
    assert engine.capacity == policy.capacity_tokens(Priority.VOICE) == 384
    # A literal answer: the turn cannot end early on an EOS while the scenario needs it.
    long_answer = SamplingParams(max_tokens=60, temperature=0,
                                 grammar='root ::= "' + "ab " * 30 + '"')
    now = 0.0

    def submit(rid: str, text: str, params: SamplingParams) -> Request:
        prompt = engine.tokenize(text, add_special=True)[:340]
        reused = engine.add(rid, prompt, params)
        request = Request(rid, Kind.LLM, Priority.CHAT, rid, now, prompt_tokens=len(prompt),
                          max_tokens=params.max_tokens)
        request.computed_tokens = request.cached_tokens = reused
        assert policy.add(request, now).accepted
        return request

    def step() -> None:
        nonlocal now
        plan = policy.schedule(now)
        assert not isinstance(plan, IdlePlan)
        result, _ = engine.execute(plan)  # raises EngineError when no cells are free
        now += 0.01
        for request in policy.update_from_output(plan, result, now):
            engine.release(request.id)

    prefix = HOUSE * 2  # 82 tokens
    submit("a", prefix + "First.", SamplingParams(max_tokens=1, temperature=0))
    while policy.has_work():
        step()
    assert len(engine.cache) == 1
    entry = engine.cache[0]
    b = submit("b", prefix + "Second.", long_answer)
    assert b.cached_tokens > 80 and entry.pins == 1
    step()  # b's first chunk runs from the cached cells
    submit("c", "Note: " + "the garden sprinkler runs at seven. " * 13,  # 95 tokens
           SamplingParams(max_tokens=1, temperature=0))
    while "c" in policy.requests:
        step()
    assert entry in engine.cache and entry.pins == 1  # b still uses its cells
    # 340 + 8 of the policy's 384 positions; with the cache's 128 cells on top, the context
    # is full only if the cache forgot the 82 cells b still uses and took c's 95 instead.
    submit("d", "Fill: " + "kitchen hallway garden " * 120, SamplingParams(max_tokens=8,
                                                                         temperature=0))
    while policy.has_work():
        step()
    assert entry.pins == 0
    engine.close()


def test_unique_background_prompts_do_not_push_out_a_reused_system_prompt() -> None:
    """Found by `bench family`: summaries of unique documents finished, were cached, and
    evicted Home Assistant's system prompt, so the next spoken command prefilled all of it
    again (5 s on 2 cores). A prefix that prompts have started from now stays."""
    engine = LlamaEngine(EngineConfig(models.resolve_llm("gemma-3-270m"), n_ctx=2048,
                                      n_seq_max=4, n_batch=256, prefix_cache_tokens=256))
    try:
        _complete(engine, "voice-0", HOUSE + "Turn on the kitchen light.")
        reused, _, _ = _complete(engine, "voice-1", HOUSE + "Is the sprinkler on?")
        assert reused > 0
        for i in range(4):  # unique documents, each as long as the cache allows
            _complete(engine, f"summary-{i}", f"Document {i}. " + HOUSE[::-1] * 2,
                      Priority.BACKGROUND)
        reused_after, _, _ = _complete(engine, "voice-2", HOUSE + "Lock the door.")
        assert reused_after >= reused
    finally:
        engine.close()


def test_turns_of_two_kinds_keep_both_system_prompts_in_a_two_entry_cache() -> None:
    """Found by `bench family`: voice and chat turns, each cached whole when it finished,
    pushed each other's system prompt out of the cache's two entries, so half the spoken
    commands prefilled Home Assistant's prompt again. A finished turn now replaces the entry
    it started from."""
    engine = LlamaEngine(EngineConfig(models.resolve_llm("gemma-3-270m"), n_ctx=2048,
                                      n_seq_max=4, n_batch=256, prefix_cache_tokens=512))
    chat_prompt = "You are a helpful family chat assistant. Keep answers short and kind. " * 3
    try:
        _complete(engine, "voice-warm", HOUSE + "Hello.")
        _complete(engine, "chat-warm", chat_prompt + "Hello.")
        reused = {"voice": [], "chat": []}
        for i in range(3):
            reused["chat"].append(_complete(engine, f"chat-{i}", chat_prompt + f"Idea {i}?")[0])
            reused["voice"].append(_complete(engine, f"voice-{i}", HOUSE + f"Lamp {i} on.")[0])
        assert min(reused["voice"]) >= len(engine.tokenize(HOUSE, add_special=True)) - 2
        assert min(reused["chat"]) >= len(engine.tokenize(chat_prompt, add_special=True)) - 2
    finally:
        engine.close()


# A household's cache under pressure: 200 tokens, Home Assistant's system prompt reused by two
# spoken commands, then the teen's long text pasted under the chat prompt.
CHAT_PROMPT = "You are a helpful family chat assistant. Keep answers short and kind. " * 2
PASTED = "Here is my essay about the history of the bicycle in our town. " * 6


def _busy_household_cache() -> LlamaEngine:
    cached = LlamaEngine(EngineConfig(models.resolve_llm("gemma-3-270m"), n_ctx=2048,
                                      n_seq_max=4, n_batch=256, prefix_cache_tokens=200))
    _complete(cached, "voice-warm", HOUSE + "Hello.")
    house = len(cached.tokenize(HOUSE, add_special=True)) - 2
    assert _complete(cached, "voice-1", HOUSE + "Lamp one on.")[0] >= house
    _complete(cached, "teen", CHAT_PROMPT + PASTED + "Fix the grammar.", Priority.CHAT)
    return cached


def test_a_chat_turn_that_shares_only_the_system_prompt_does_not_push_out_the_voice_one() -> None:
    """Found by `bench family` (150-s phases): the teen pasted a long text under the chat
    prompt, then a parent's short chat turn took only the chat prompt from that entry (less
    than half of it, so it did not replace it) and was stored beside it; with the cache full,
    the least recently used entry went: Home Assistant's system prompt, reused by every spoken
    command. The next three commands prefilled it again (first token 10-17 s, not 1 s). An
    entry whose reused part another entry (here the parent's) holds too now goes first."""
    engine = _busy_household_cache()
    try:
        house = len(engine.tokenize(HOUSE, add_special=True)) - 2
        shared = len(engine.tokenize(CHAT_PROMPT, add_special=True)) - 2
        parent = _complete(engine, "parent", CHAT_PROMPT + "Dinner ideas?", Priority.CHAT)
        assert parent[0] >= shared
        assert sum(len(e.tokens) for e in engine.cache) <= 200
        assert _complete(engine, "voice-2", HOUSE + "Lamp two off.")[0] >= house
        assert _complete(engine, "parent-2", CHAT_PROMPT + "Lunch?", Priority.CHAT)[0] >= shared
    finally:
        engine.close()


def test_room_is_made_by_trimming_each_entry_to_what_prompts_took_from_it(
    engine: LlamaEngine,
) -> None:
    """Every entry is some prompt's only copy of a system prompt: a third one is kept by
    dropping the turns' own words from the others (their cells past the shared part), and a
    prompt that starts from a trimmed entry answers as if nothing had been cached."""
    guest = "You answer the guests' questions about the house rules and the wifi. " * 3
    cached = _busy_household_cache()
    try:
        # A prompt takes the chat prompt from the teen's entry, then leaves (cancelled).
        prompt = cached.tokenize(CHAT_PROMPT + "Dinner?", add_special=True)
        assert cached.add("gone", prompt, SHORT) > 0
        cached.release("gone")
        full = {len(e.tokens) for e in cached.cache}
        _complete(cached, "guest", guest + "Wifi?", Priority.CHAT)
        assert len(cached.cache) == 3 and sum(len(e.tokens) for e in cached.cache) <= 200
        assert {len(e.tokens) for e in cached.cache} - full  # something was trimmed
        house = len(cached.tokenize(HOUSE, add_special=True)) - 2
        shared = len(cached.tokenize(CHAT_PROMPT, add_special=True)) - 2
        reused, _, out = _complete(cached, "voice-2", HOUSE + "Lamp two off.")
        assert reused >= house
        assert out == _complete(engine, "plain-voice", HOUSE + "Lamp two off.")[2]
        reused, _, out = _complete(cached, "parent", CHAT_PROMPT + "Lunch?", Priority.CHAT)
        assert reused >= shared
        assert out == _complete(engine, "plain-chat", CHAT_PROMPT + "Lunch?", Priority.CHAT)[2]
    finally:
        cached.close()


def test_a_chat_turn_never_pushes_out_the_system_prompt_spoken_commands_reuse() -> None:
    """Found by `bench family` after the trimming above: a parent's chat was still running
    from the teen's entry (pinned), so the teen's next short turn, to be kept, trimmed and then
    evicted Home Assistant's system prompt (reused six times). The entries prompts reuse now
    go only for a turn of the same or a more urgent class."""
    cached = _busy_household_cache()
    try:
        house = len(cached.tokenize(HOUSE, add_special=True)) - 2
        # The parent's chat starts from the teen's entry and is still running (pinned).
        prompt = cached.tokenize(CHAT_PROMPT + "Dinner?", add_special=True)
        assert cached.add("parent", prompt, SHORT) > 0
        _complete(cached, "teen-2", CHAT_PROMPT + "And a title?", Priority.CHAT)
        assert sum(len(e.tokens) for e in cached.cache) <= 200
        assert _complete(cached, "voice-2", HOUSE + "Lamp two off.")[0] >= house
        cached.release("parent")
    finally:
        cached.close()


def test_llama_cpps_amx_weight_buffers_stay_off() -> None:
    """With them, this engine's first llama_decode segfaults on a Xeon with AMX_INT8: every
    test above that decodes is this one's regression test there."""
    assert not extra_buffers_safe(b"CPU : AVX512 = 1 | AMX_INT8 = 1 | REPACK = 1 | ")
    assert extra_buffers_safe(b"CPU : AVX512 = 1 | AVX512_VNNI = 0 | REPACK = 1 | ")
