"""Hypothesis over `response_format` JSON schemas: each one becomes a grammar llama.cpp parses
and samples from, or a 400; nothing crashes the process or takes its memory.

Run by tests/server/test_response_schema_fuzz.py in a child process under a memory limit
(RLIMIT_AS), so a schema that makes the grammar explode fails the suite instead of the
machine. Not collected on its own (its name is not test_*)."""

from __future__ import annotations

import ctypes
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


def parses(grammar: str) -> bool:
    """As the engine asks (LlamaEngine.grammar_parses), then one sampling step on it."""
    sampler = lc.llama_sampler_init_grammar(VOCAB, grammar.encode(), b"root")
    if not sampler:
        return False
    data = (lc.llama_token_data * CANDIDATES)()
    for i in range(CANDIDATES):
        data[i].id, data[i].logit, data[i].p = i, 0.0, 0.0
    array = lc.llama_token_data_array(data, CANDIDATES, -1, False)
    lc.llama_sampler_apply(sampler, ctypes.byref(array))
    lc.llama_sampler_free(sampler)
    return True


COUNTS = st.one_of(st.integers(0, 8), st.integers(0, 1_000), st.integers(0, 10**10))
NAMES = st.text("abcxyz_", min_size=1, max_size=4)
PATTERNS = st.sampled_from(
    ["^a{3}$", "^[a-z]{2,5}$", "^a{100000}$", "^(ab|c)*$", "^x{0,600}$", "^[0-9]{4}-[0-9]{2}$",
     "[a-z]+", "^a{2,}$", "^(a{400}){400}$"]
)
SCALARS = st.one_of(st.integers(-(10**15), 10**15), st.text(max_size=6), st.booleans(), st.none())
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
        st.fixed_dictionaries({"oneOf": st.lists(children, max_size=3)}),
        st.fixed_dictionaries({"allOf": st.lists(children, max_size=2)}),
    )


SCHEMAS = st.recursive(LEAVES, _containers, max_leaves=12)


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
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
