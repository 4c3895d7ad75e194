"""Hypothesis over `response_format` JSON schemas: each one becomes a grammar llama.cpp parses
and samples from, or a 400; nothing crashes the process, takes its memory, or takes more than
two seconds (to build, and to walk the grammar for a few tokens as sampling would).

The schemas include what review 39cbe61 found: boolean sub-schemas and keywords of the wrong
type (500s), nested quantifiers (the device frozen for minutes), characters beyond the Basic
Multilingual Plane (mojibake), and many optional properties (the event loop held up).

Run by tests/server/test_response_schema_fuzz.py in a child process under a memory limit
(RLIMIT_AS), so a schema that makes the grammar explode fails the suite instead of the
machine. Not collected on its own (its name is not test_*)."""

from __future__ import annotations

import ctypes
from datetime import timedelta
from typing import Any

import llama_cpp as lc
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fairlane.api.common import ApiError
from fairlane.api.response_format import output_grammar
from fairlane.engines import models

lc.llama_backend_init()
_params = lc.llama_model_default_params()
_params.vocab_only = True
MODEL = lc.llama_model_load_from_file(str(models.resolve_llm(models.DEFAULT_LLM)).encode(), _params)
VOCAB = lc.llama_model_get_vocab(MODEL)
CANDIDATES = 2048  # the first tokens of the vocabulary: enough to walk the grammar's start
WALK = 12  # tokens accepted, as sampling would, before a case ends


def parses(grammar: str) -> bool:
    """As the engine asks (LlamaEngine.grammar_parses), then a walk of WALK tokens on it: each
    a mask of the first CANDIDATES tokens and the first one allowed accepted."""
    sampler = lc.llama_sampler_init_grammar(VOCAB, grammar.encode(), b"root")
    if not sampler:
        return False
    data = (lc.llama_token_data * CANDIDATES)()
    for _ in range(WALK):
        for i in range(CANDIDATES):
            data[i].id, data[i].logit, data[i].p = i, 0.0, 0.0
        array = lc.llama_token_data_array(data, CANDIDATES, -1, False)
        lc.llama_sampler_apply(sampler, ctypes.byref(array))
        allowed = [data[i].id for i in range(CANDIDATES) if np.isfinite(data[i].logit)]
        if not allowed:
            break
        lc.llama_sampler_accept(sampler, allowed[len(allowed) // 2])
    lc.llama_sampler_free(sampler)
    return True


COUNTS = st.one_of(st.integers(0, 8), st.integers(0, 1_000), st.integers(0, 10**10))
NAMES = st.text("abcxyz_", min_size=1, max_size=4)
PATTERNS = st.sampled_from(
    ["^a{3}$", "^[a-z]{2,5}$", "^a{100000}$", "^(ab|c)*$", "^x{0,600}$", "^[0-9]{4}-[0-9]{2}$",
     "[a-z]+", "^a{2,}$", "^(a{400}){400}$",
     # nested quantifiers: refused past a product of 100, served below it
     "^((a{0,10}){0,10}){0,10}a{60}$", "^(a{0,100}){0,100}a{100}$", "^(a{0,30}){0,30}a{60}$",
     "^((a{0,4}){0,4}){0,4}a{20}$", "^(a{0,10}){0,10}a{20}$", "^(a+)+b$", "^(a*)*$",
     "^((a{0,10}){0,10})*b$", "^(?:a{0,9}|b){0,9}$", "^([a-z]+\\.)*[a-z]+$", "^[(]{0,9}$"]
)
# Text beyond the Basic Multilingual Plane too (emoji): json.dumps writes it as surrogate pairs.
TEXT = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=6)
SCALARS = st.one_of(st.integers(-(10**15), 10**15), TEXT, st.booleans(), st.none())
# Keywords of the wrong JSON type, and boolean sub-schemas: a 400 or served, never a 500.
MISTYPED = st.one_of(
    st.fixed_dictionaries({"type": st.just("string"),
                           "pattern": st.one_of(st.integers(), st.none(), st.lists(TEXT))}),
    st.fixed_dictionaries({"$ref": st.one_of(st.integers(), st.none(), st.just("#/nowhere"))}),
    st.fixed_dictionaries({"type": st.one_of(st.integers(), st.just(["string", 5]))}),
    st.fixed_dictionaries({"properties": st.one_of(st.lists(st.integers()), st.integers())}),
    st.fixed_dictionaries({"required": st.one_of(st.integers(), st.just([1, 2]))}),
    st.fixed_dictionaries({"enum": st.one_of(st.integers(), st.just({}))}),
    st.fixed_dictionaries({"allOf": st.just([[1]])}),
    st.fixed_dictionaries({"items": st.one_of(st.integers(), st.just([]))}),
)
LEAVES = st.one_of(
    st.fixed_dictionaries(
        {"type": st.just("string")},
        optional={"minLength": COUNTS, "maxLength": COUNTS, "pattern": PATTERNS,
                  "format": st.sampled_from(["date", "time", "date-time", "uuid", "email"])},
    ),
    st.fixed_dictionaries(
        {"type": st.sampled_from(["integer", "number"])},
        optional={"minimum": st.integers(-(10**18), 10**18),
                  "maximum": st.integers(-(10**18), 10**18)},
    ),
    st.fixed_dictionaries({"type": st.sampled_from(["boolean", "null"])}),
    st.fixed_dictionaries({"enum": st.lists(SCALARS, max_size=4)}),
    st.fixed_dictionaries({"const": SCALARS}),
    st.just({}),
    st.booleans(),
    MISTYPED,
)


def _containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.fixed_dictionaries(
            {"type": st.just("array"), "items": children},
            optional={"minItems": COUNTS, "maxItems": COUNTS},
        ),
        st.fixed_dictionaries(
            {"type": st.just("object"), "properties": st.dictionaries(NAMES, children, max_size=3)},
            optional={"required": st.lists(NAMES, max_size=3),
                      "minProperties": COUNTS, "maxProperties": COUNTS,
                      "additionalProperties": st.one_of(st.booleans(), children)},
        ),
        st.fixed_dictionaries({"anyOf": st.lists(children, min_size=1, max_size=3)}),
        st.fixed_dictionaries(
            {"type": st.just("object"),
             "properties": st.dictionaries(NAMES, children, min_size=60, max_size=80)}),
        st.fixed_dictionaries({"oneOf": st.lists(children, max_size=3)}),
        st.fixed_dictionaries({"allOf": st.lists(children, max_size=2)}),
    )


SCHEMAS = st.recursive(LEAVES, _containers, max_leaves=12)


# Each case, building and walking, within two seconds.
@settings(max_examples=400, deadline=timedelta(seconds=2),
          suppress_health_check=list(HealthCheck))
@given(SCHEMAS)
def test_every_schema_is_a_grammar_or_a_400(schema: Any) -> None:
    response_format = {"type": "json_schema", "json_schema": {"schema": schema}}
    try:
        grammar = output_grammar(response_format, parses)
    except ApiError as err:
        assert err.status == 400 and err.message
        return
    assert grammar and len(grammar) <= 128 * 1024
    assert np.isfinite(len(grammar))
