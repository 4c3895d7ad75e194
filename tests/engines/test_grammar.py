"""Output grammars in the engine, on the default chat model: a tool call under its tools'
grammar, lazy until the reply starts one, and spelt as the chat template writes it back; a
trigger the grammar refuses leaves the reply free (llama.cpp's own lazy mode aborts the process
there); the masked choice is the best allowed."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from fairlane.api.response_format import output_grammar
from fairlane.api.tool_calls import OPENING_TRIGGERS, TRIGGERS, tool_call_grammar
from fairlane.engines import models
from fairlane.engines.chat_template import ChatTemplate, parse_tool_calls
from fairlane.engines.llm import EngineConfig, LlamaEngine, SamplingParams, lc
from fairlane.engines.sampling import GRAMMAR_OVER_BUDGET
from fairlane.policy import Chunk, LlmPlan, Priority

COLOUR = {"type": "function", "function": {
    "name": "set_colour", "description": "Set the lamp's colour",
    "parameters": {"type": "object", "properties": {
        "colour": {"type": "string", "enum": ["crimson-7", "teal-3"]}}, "required": ["colour"]}}}
TURN_ON = {"type": "function", "function": {
    "name": "HassTurnOn", "description": "Turns on a device",
    "parameters": {"type": "object", "properties": {"name": {"type": "string"}}}}}

LIGHT = {"type": "function", "function": {
    "name": "light_turn_on", "description": "Turn on a light in the house",
    "parameters": {"type": "object", "properties": {"name": {"type": "string"}},
                   "required": ["name"]}}}


@pytest.fixture(scope="module")
def engine() -> Iterator[LlamaEngine]:
    engine = LlamaEngine(EngineConfig(models.resolve_llm(models.DEFAULT_LLM), n_ctx=2048,
                                      n_seq_max=2, n_batch=512))
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def template(engine: LlamaEngine) -> ChatTemplate:
    return ChatTemplate(engine.metadata("tokenizer.chat_template"), engine.bos_text,
                        engine.eos_text)


def _reply(engine: LlamaEngine, template: ChatTemplate, text: str | list[dict[str, Any]],
           tools: list[Any], fed: list[int] | None = None, **params: Any) -> str:
    """The whole greedy reply to a user's text (or to these messages); `fed` gets the tokens
    the sequence fed to the model (the prompt and the reply but its last token)."""
    messages = [{"role": "user", "content": text}] if isinstance(text, str) else text
    prompt = engine.tokenize(template.render(messages, tools))
    engine.add("r", prompt, SamplingParams(max_tokens=60, temperature=0, **params))
    try:
        _, events = engine.execute(
            LlmPlan((Chunk("r", 0, len(prompt), True, False, Priority.CHAT),), (), 0.0, 0))
        out = [e.text for e in events]
        while not events[-1].finish_reason:
            seq = engine.sequences["r"]
            _, events = engine.execute(LlmPlan(
                (Chunk("r", len(seq.tokens) - 1, 1, True, True, Priority.CHAT),), (), 0.0, 0))
            out += [e.text for e in events]
        if fed is not None:
            fed += engine.sequences["r"].tokens[:-1]
        return "".join(out)
    finally:
        engine.release("r")


def test_the_default_template_writes_tagged_calls(template: ChatTemplate) -> None:
    assert template.tagged_tool_calls


def test_a_tool_call_keeps_to_the_tool_s_schema(engine, template) -> None:
    """Free, the small model invents a colour ("blue-7"); under the grammar it must pick one
    the schema lists. The rest of the call is what it wrote free."""
    tools = [COLOUR]
    grammar, triggers = tool_call_grammar(tools, None, engine.grammar_parses)
    assert grammar is not None and triggers == TRIGGERS
    ask = "Set the lamp to a blue colour"
    free = parse_tool_calls(_reply(engine, template, ask, tools), tools)
    constrained = parse_tool_calls(
        _reply(engine, template, ask, tools, grammar=grammar, grammar_triggers=triggers), tools)
    assert free and constrained
    assert json.loads(free[0]["function"]["arguments"])["colour"] not in ("crimson-7", "teal-3")
    assert json.loads(constrained[0]["function"]["arguments"])["colour"] in ("crimson-7", "teal-3")


@pytest.mark.parametrize("template_shape", [False, True])
def test_a_lazy_grammar_leaves_a_plain_reply_alone(engine, template, template_shape) -> None:
    tools = [TURN_ON, COLOUR]
    grammar, triggers = tool_call_grammar(tools, None, engine.grammar_parses, template_shape)
    ask = "Hello, how are you today?"
    free = _reply(engine, template, ask, tools)
    assert not parse_tool_calls(free, tools)
    assert _reply(engine, template, ask, tools, grammar=grammar,
                  grammar_triggers=triggers) == free


def test_a_call_is_spelt_as_the_template_writes_it_back(engine, template) -> None:
    """Free, the small model opens a call with a ```json fence and pretty-prints it. In the
    template's shape the fence's token is replaced by `<tool_call>` and the call is one line of
    `json.dumps` JSON: the next round's prompt (the call sent back, then its result) holds
    every token of this round, prompt and reply, so the prefix cache holds through the call."""
    tools = [TURN_ON]
    grammar, triggers = tool_call_grammar(tools, None, engine.grammar_parses, True)
    assert grammar is not None and triggers == OPENING_TRIGGERS
    ask = [{"role": "user", "content": "Turn on the kitchen light"}]
    free = _reply(engine, template, ask, tools)
    assert free.startswith("```json\n{\n")
    shaped = _reply(engine, template, ask, tools, grammar=grammar, grammar_triggers=triggers)
    calls = parse_tool_calls(shaped, tools)
    assert calls and parse_tool_calls(free, tools)
    assert calls[0]["function"] == parse_tool_calls(free, tools)[0]["function"]
    arguments = json.loads(calls[0]["function"]["arguments"])
    assert shaped == (
        '<tool_call>\n{"name": "HassTurnOn", "arguments": ' + json.dumps(arguments)
        + "}\n</tool_call>"
    )
    # The next round, as a client sends it (the arguments as a JSON string), starts with the
    # text of this round's prompt and reply.
    answer_round = _answer_round(ask, calls[0])
    assert template.render(answer_round, tools).startswith(template.render(ask, tools) + shaped)


@pytest.mark.parametrize("parallel", [False, True])
def test_one_call_unless_parallel_calls_are_asked_for(engine, template, parallel) -> None:
    """Asked for three lights, the model calls the tool three times when a reply may hold
    several calls; by default (`parallel_tool_calls` false, as llama.cpp's server) the reply
    ends after its first call: a small model may go on calling tools nobody asked for."""
    tools = [LIGHT, TURN_ON, COLOUR]
    grammar, triggers = tool_call_grammar(tools, None, engine.grammar_parses, True, parallel)
    reply = _reply(engine, template, "Turn on the kitchen, bedroom and hall lights.", tools,
                   grammar=grammar, grammar_triggers=triggers)
    calls = parse_tool_calls(reply, tools) or []
    names = [json.loads(c["function"]["arguments"])["name"] for c in calls]
    if parallel:
        assert names[:2] == ["kitchen", "bedroom"]
    else:
        assert names == ["kitchen"] and reply.endswith("</tool_call>")


def _answer_round(ask: list[dict[str, Any]], call: dict[str, Any]) -> list[dict[str, Any]]:
    sent_back = {"id": call["id"], "type": "function", "function": {
        "name": call["function"]["name"],
        "arguments": json.dumps(json.loads(call["function"]["arguments"]))}}
    return ask + [
        {"role": "assistant", "content": None, "tool_calls": [sent_back]},
        {"role": "tool", "tool_call_id": call["id"], "content": '{"success": true}'},
    ]


def test_the_answer_round_starts_from_every_token_of_the_call(template) -> None:
    """The call comes back as the same text, and the prompt is spelt with the tokens the
    model sampled for it (where the tokenizer would merge them otherwise): the prefix cache
    holds the first round's prompt and every token of the call the model fed."""
    engine = LlamaEngine(EngineConfig(models.resolve_llm(models.DEFAULT_LLM), n_ctx=2048,
                                      n_seq_max=2, n_batch=512, prefix_cache_tokens=512))
    try:
        tools = [LIGHT]
        ask = [{"role": "user", "content": "Turn on the kitchen lights."}]
        grammar, triggers = tool_call_grammar(tools, None, engine.grammar_parses, True)
        first = engine.tokenize(template.render(ask, tools))
        fed: list[int] = []
        reply = _reply(engine, template, ask, tools, fed=fed, grammar=grammar,
                       grammar_triggers=triggers)
        calls = parse_tool_calls(reply, tools)
        assert calls and fed[: len(first)] == first
        text = template.render(_answer_round(ask, calls[0]), tools)
        prompt = engine.tokenize_prompt(text)
        assert prompt[: len(fed)] == fed
        assert "".join(engine.token_text(t) for t in prompt) == text
        assert engine.add("a", prompt, SamplingParams(max_tokens=1)) == len(fed)
        engine.release("a")
        # The same prompt again (the round after one whose reply is not sent back: a call the
        # turn had made already): the cache holds it spelt as above, and a reply after it.
        engine.add("b", prompt, SamplingParams(max_tokens=2, temperature=0))
        engine.execute(LlmPlan((Chunk("b", len(fed), len(prompt) - len(fed), True, False,
                                      Priority.CHAT),), (), 0.0, 0))
        engine.execute(LlmPlan((Chunk("b", len(prompt), 1, True, True, Priority.CHAT),),
                               (), 0.0, 0))
        engine.release("b")
        assert len(engine.cache) == 1 and len(engine.cache[0].tokens) > len(prompt)
        assert engine.tokenize_prompt(text) == prompt
        assert engine.add("c", prompt, SamplingParams(max_tokens=1)) == len(prompt) - 1
        engine.release("c")
    finally:
        engine.close()


def test_a_named_tool_choice_is_called_from_the_first_token(engine, template) -> None:
    tools = [TURN_ON, COLOUR]
    grammar, triggers = tool_call_grammar(
        tools, {"type": "function", "function": {"name": "set_colour"}}, engine.grammar_parses)
    assert grammar is not None and triggers == ()
    ask = "Hello, how are you today?"
    calls = parse_tool_calls(_reply(engine, template, ask, tools, grammar=grammar), tools)
    assert calls and calls[0]["function"]["name"] == "set_colour"
    assert json.loads(calls[0]["function"]["arguments"])["colour"] in ("crimson-7", "teal-3")


def test_a_trigger_the_grammar_refuses_leaves_the_reply_free(engine, template) -> None:
    """The model opens its call with "```json" and "{\\n"; this grammar takes only "{}", and
    the trigger's match starts in the fence, a token before the one that completes it. The
    tokens since the match are offered to the grammar one by one, the fence is refused, and
    the reply goes on free: the same text as without a grammar, and the process lives."""
    tools = [TURN_ON]
    ask = "Turn on the kitchen light"
    free = _reply(engine, template, ask, tools)
    assert free.startswith("```json\n{\n")
    refusing = _reply(engine, template, ask, tools, grammar='root ::= "{}"',
                      grammar_triggers=(r"json\s*\{",))
    assert refusing == free


def test_the_token_that_fires_a_trigger_is_the_grammar_s(engine, template) -> None:
    """A trigger whose match starts in the token that completes it: that token is checked as
    an armed grammar's token is, and the grammar's best choice replaces it."""
    tools = [TURN_ON]
    ask = "Turn on the kitchen light"
    assert _reply(engine, template, ask, tools, grammar='root ::= "Yes."',
                  grammar_triggers=(r"\A```",)) == "Yes."


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_refused_choice_is_replaced_by_the_best_allowed_token(engine, template,
                                                                temperature) -> None:
    """Under `root ::= "Hello" | "Goodbye"` the model's free first token (its argmax) is
    refused. Greedy, the engine takes the most likely allowed token from the few most likely
    (no mask over the vocabulary): the argmax of what the grammar allows, which a mask of the
    same row says. Sampling, it masks what the grammar forbids in place and samples the rest."""
    grammar = 'root ::= "Hello" | "Goodbye"'
    ask = [{"role": "user", "content": "Say bonjour in French."}]
    prompt = engine.tokenize(template.render(ask))
    engine.add("m", prompt, SamplingParams(max_tokens=4, temperature=temperature, seed=1,
                                           grammar=grammar))
    fresh = lc.llama_sampler_init_grammar(engine.vocab, grammar.encode(), b"root")
    try:
        engine.execute(LlmPlan((Chunk("m", 0, len(prompt) - 1, False, False, Priority.CHAT),),
                               (), 0.0, 0))
        engine.execute(LlmPlan((Chunk("m", len(prompt) - 1, 1, True, False, Priority.CHAT),),
                               (), 0.0, 0))
        row = engine._logits(1)[0].copy()
        assert np.isfinite(row).all() == (temperature == 0)  # masked in place when sampling
        engine.sampling._candidates.mask(fresh, row)
        allowed = np.flatnonzero(np.isfinite(row))
        assert 0 < len(allowed) < 10
        texts = {engine.token_text(int(t)) for t in allowed}
        assert all("Hello".startswith(t) or "Goodbye".startswith(t) for t in texts)
        chosen = engine.sequences["m"].tokens[-1]
        assert chosen in allowed
        if temperature == 0:
            assert chosen == int(allowed[np.argmax(row[allowed])])
    finally:
        lc.llama_sampler_free(fresh)
        engine.release("m")


def test_json_that_does_not_start_a_call_stays_free(engine, template) -> None:
    """After a tool's result the small model echoes it as JSON; that is its answer, not a call
    to force into a tool's shape (which Home Assistant would run again)."""
    tools = [TURN_ON]
    messages = [
        {"role": "user", "content": "Turn on the kitchen lights."},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
         "function": {"name": "HassTurnOn", "arguments": '{"name": "kitchen"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"success": true}'},
    ]
    grammar, triggers = tool_call_grammar(tools, None, engine.grammar_parses)
    replies = [_reply(engine, template, messages, tools),
               _reply(engine, template, messages, tools, grammar=grammar,
                      grammar_triggers=triggers)]
    assert replies[0].lstrip().startswith("{") and not parse_tool_calls(replies[0], tools)
    assert replies[1] == replies[0]


# Sixty-four overlapping readings of one ambiguous pattern: under the API's static bounds each,
# but together a mask of the vocabulary takes ~0.5 s at the first step on this CPU, and grows
# (review 39cbe61, finding 1 froze the device for minutes with one such pattern nested deeper).
SLOW = {"anyOf": [{"type": "string", "pattern": f"^(a{{0,10}}){{0,10}}a{{{60 + i}}}$"}
                  for i in range(64)]}


def test_a_grammar_past_its_budget_ends_its_request_and_the_step_goes_on(engine, template):
    """The slow grammar's sequence ends with `grammar_budget` (its client gets an error); the
    free sequence beside it gets its token in that same step, and every step after."""
    slow = output_grammar({"type": "json_schema", "json_schema": {"schema": SLOW}},
                          engine.grammar_parses)
    assert slow is not None
    messages = [{"role": "user", "content": "Count from one to fifty in words."}]
    prompt = engine.tokenize(template.render(messages))
    engine.add("slow", prompt, SamplingParams(max_tokens=70, temperature=0, grammar=slow))
    engine.add("free", prompt, SamplingParams(max_tokens=300, temperature=0))
    try:
        first = LlmPlan(tuple(Chunk(r, 0, len(prompt), True, False, Priority.CHAT)
                              for r in ("slow", "free")), (), 0.0, 0)
        _, events = engine.execute(first)
        finished: dict[str, str | None] = {e.request_id: e.finish_reason for e in events}
        while not finished["slow"]:
            chunks = tuple(
                Chunk(r, len(engine.sequences[r].tokens) - 1, 1, True, True, Priority.CHAT)
                for r in ("slow", "free"))
            _, events = engine.execute(LlmPlan(chunks, (), 0.0, 0))
            assert sorted(e.request_id for e in events) == ["free", "slow"]
            finished = {e.request_id: e.finish_reason for e in events}
            assert finished["free"] is None  # still going, beside the slow one
        assert str(finished["slow"]).startswith(GRAMMAR_OVER_BUDGET), finished
        assert "budget is 500 ms" in str(finished["slow"])
        assert engine.sequences["slow"].grammar is None  # closed: no more grammar work
    finally:
        engine.release("slow")
        engine.release("free")
