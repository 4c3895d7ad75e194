"""The OpenAI chat API on the real default model: clients, batching, cancellation, bad input."""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import openai
import pytest

from fairlane.server import BackgroundServer
from tests.server.conftest import MODEL_WAIT_S, TOKEN

QUESTION = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]


def client(server: BackgroundServer, token: str = TOKEN) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=token, max_retries=0)


def http(server: BackgroundServer, method: str, path: str, body: bytes | dict | None = None,
         token: str | None = TOKEN, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    request = urllib.request.Request(f"{server.url}{path}", data=data, method=method)
    request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    for key, value in (headers or {}).items():
        request.add_header(key, value)
    try:
        with urllib.request.urlopen(request, timeout=MODEL_WAIT_S) as response:
            raw = response.read()
            status = response.status
    except urllib.error.HTTPError as err:
        raw, status = err.read(), err.code
    try:
        return status, json.loads(raw)
    except json.JSONDecodeError:
        return status, raw.decode()


# --- the official client ---------------------------------------------------------------------


def test_openai_client_streams_a_real_answer(server: BackgroundServer) -> None:
    stream = client(server).chat.completions.create(
        model="qwen2.5-coder-0.5b-instruct", messages=QUESTION, stream=True, temperature=0,
        stream_options={"include_usage": True},
    )
    pieces, usage, finish = [], None, None
    for chunk in stream:
        if chunk.choices:
            pieces.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
        if chunk.usage:
            usage = chunk.usage
    text = "".join(pieces)
    assert "Paris" in text and len(pieces) > 3  # streamed token by token
    assert finish == "stop"
    assert usage is not None and usage.completion_tokens > 0 and usage.prompt_tokens > 10


def test_non_streaming_completion_has_usage(server: BackgroundServer) -> None:
    reply = client(server).chat.completions.create(
        model="x", messages=QUESTION, temperature=0, max_tokens=5
    )
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == 5
    assert reply.choices[0].message.content


def test_stop_strings_end_the_reply_before_them(server: BackgroundServer) -> None:
    reply = client(server).chat.completions.create(model="x", messages=QUESTION, temperature=0,
                                                   stop=["Paris"])
    assert reply.choices[0].finish_reason == "stop"
    assert "Paris" not in reply.choices[0].message.content
    assert reply.choices[0].message.content.strip()  # the words before it were sent


def test_tool_call_comes_back_in_openai_shape(server: BackgroundServer) -> None:
    tools = [{"type": "function", "function": {
        "name": "light_turn_on", "description": "Turn on a light in the house",
        "parameters": {"type": "object", "properties": {"name": {"type": "string"}},
                       "required": ["name"]}}}]
    messages = [{"role": "user", "content": "Turn on the kitchen lights."}]
    reply = client(server).chat.completions.create(model="x", messages=messages, tools=tools,
                                                   temperature=0)
    call = reply.choices[0].message.tool_calls[0]
    assert reply.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "light_turn_on"
    assert "kitchen" in json.loads(call.function.arguments)["name"].lower()

    # The tool's result goes back as a `tool` message and the model answers in words.
    follow_up = messages + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"success": true}'},
    ]
    answer = client(server).chat.completions.create(model="x", messages=follow_up, tools=tools,
                                                    temperature=0, max_tokens=40)
    assert answer.choices[0].message.content
    # The call came back as the text the model wrote, spelt with its tokens: the answer round's
    # prefill starts after the call (every token but the reply's last, which was never fed).
    cached = answer.usage.prompt_tokens_details.cached_tokens
    assert cached == reply.usage.prompt_tokens + reply.usage.completion_tokens - 1


def test_models_health_stats_metrics_and_openapi(server: BackgroundServer) -> None:
    models = client(server).models.list()
    assert [m.id for m in models.data] == [
        "qwen2.5-coder-0.5b-instruct", "whisper-base", "all-minilm-l6-v2", "en_US-joe-medium"
    ]
    assert http(server, "GET", "/health", token=None) == (200, http(server, "GET", "/health")[1])
    _, before = http(server, "GET", "/v1/stats")
    reply = client(server).chat.completions.create(model="x", messages=QUESTION, max_tokens=3)
    status, stats = http(server, "GET", "/v1/stats")
    # Each position computed once: the prompt (less a prefix the cache held) and the tokens
    # fed back (all the reply's but its last).
    tokens = (stats["device"]["class_llm_tokens_total"]["chat"]
              - before["device"]["class_llm_tokens_total"]["chat"])
    assert reply.usage is not None
    assert 0 < tokens <= reply.usage.prompt_tokens + reply.usage.completion_tokens - 1
    assert tokens >= reply.usage.completion_tokens - 1
    assert status == 200 and set(stats["classes"]) == {"voice", "chat", "background"}
    assert stats["classes"]["chat"]["ttft_ms"]["p50"] is not None
    assert stats["steps"] and stats["steps"][-1]["kind"] == "llm"
    assert 0 < stats["device"]["busy"] <= 1 and stats["device"]["share"]["chat"] > 0
    # Counters since start, so a client can take one period's device use from two reads.
    device = stats["device"]
    assert device["busy_s_total"] >= device["class_busy_s_total"]["chat"] > 0
    assert device["interactive_busy_s_total"] == device["class_busy_s_total"]["chat"]
    assert stats["steps_window_s"] == 300 and stats["background_steps"] == {}
    status, narrow = http(server, "GET", "/v1/stats?steps_window_s=0.5")
    assert status == 200 and narrow["steps_window_s"] == 0.5
    for bad in ("0", "-1", "nan", "soon", "1e9"):
        status, error = http(server, "GET", f"/v1/stats?steps_window_s={bad}")
        assert status == 400 and error["error"]["param"] == "steps_window_s"
    # The cost model's error on the steps just run: a prefill and decodes of the LLM.
    llm = stats["prediction_error"][stats["steps"][-1]["device"]]
    assert llm["decode"]["steps"] >= 1 and llm["decode"]["median"] >= 0
    assert {"prefill", "decode", "mixed"} & set(llm) and llm["decode"]["p95"] >= 0
    # The CPU LLM's threads: one per core owned, one fewer while a neighbour holds a core
    # (llm.give_way, on by default where there is a thread to give).
    threads = stats["llm_threads"]
    owned = len(os.sched_getaffinity(0))
    if owned == 1:
        assert threads == {"threads": 1, "fixed": True}
    else:
        assert threads["most"] == owned and not threads["fixed"]
        assert 1 <= threads["threads"] <= owned and threads["steps"] >= 1
        assert 0 <= threads["steps_on_fewer_threads"] <= threads["steps"]
    status, text = http(server, "GET", "/metrics")
    assert status == 200 and "fairlane_ttft_seconds_bucket" in text
    assert 'fairlane_prediction_error_ratio{device=' in text
    status, spec = http(server, "GET", "/openapi.json")
    assert status == 200 and "/v1/chat/completions" in spec["paths"]


# --- continuous batching and cancellation ----------------------------------------------------


def _stream_in_thread(server: BackgroundServer, tag: str, out: dict, max_tokens: int = 40,
                      cls: str = "chat", prompt: str | None = None) -> threading.Thread:
    def run() -> None:
        stream = client(server).chat.completions.create(
            model="x", stream=True, temperature=0, max_tokens=max_tokens,
            messages=[{"role": "user", "content": prompt or f"Count slowly from one ({tag})."}],
            extra_body={"fairlane_class": cls},
        )
        times = []
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                times.append(time.monotonic())
            out.setdefault(f"{tag}-id", chunk.id)
        out[tag] = times

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_concurrent_streams_share_iterations_and_late_arrivals_join(server) -> None:
    out: dict = {}
    first = [_stream_in_thread(server, f"s{i}", out) for i in range(3)]
    time.sleep(1.0)
    late = _stream_in_thread(server, "late", out)
    for thread in [*first, late]:
        thread.join(timeout=300)
    records = list(server.services.device.records)
    ids = {tag: out[f"{tag}-id"] for tag in ("s0", "s1", "s2", "late")}
    mine = [r for r in records if set(r.request_ids) & set(ids.values())]
    assert max(len(r.request_ids) for r in mine) >= 3  # one llama_decode, several sequences
    early = {ids["s0"], ids["s1"], ids["s2"]}
    # The late request shared an iteration with an earlier one that had not finished yet.
    assert any(ids["late"] in r.request_ids and early & set(r.decodes) for r in mine)


def test_disconnect_frees_kv_within_an_iteration_and_ids_are_reused(server) -> None:
    device, engine = server.services.device, server.services.engine
    stream = client(server).chat.completions.create(
        model="x", messages=QUESTION, stream=True, max_tokens=2000, temperature=0.8,
        extra_body={"fairlane_class": "chat"},
    )
    iterator = iter(stream)
    chunk = next(iterator)
    request_id = chunk.id
    for _ in range(3):
        next(iterator)
    assert request_id in device.policy.kv.held
    stream.close()  # the client goes away mid-stream
    deadline = time.monotonic() + 30
    # The policy frees its KV blocks at once; the engine drops the cells at the next boundary.
    while (request_id in device.policy.kv.held or request_id in engine.sequences) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.01)
    assert request_id not in device.policy.kv.held
    assert request_id not in engine.sequences
    time.sleep(0.2)
    last = [r for r in device.records if request_id in r.request_ids][-1]
    later = [r for r in device.records if r.start > last.end]
    assert all(request_id not in r.request_ids for r in later)
    assert sorted(engine.free_ids) == list(range(engine.config.n_seq_max))  # ids back in the pool


def test_cancel_endpoint_stops_a_running_completion(server) -> None:
    out: dict = {}
    thread = _stream_in_thread(server, "victim", out, max_tokens=2000)
    deadline = time.monotonic() + 60
    while "victim-id" not in out and time.monotonic() < deadline:
        time.sleep(0.01)
    status, body = http(server, "POST", f"/v1/chat/completions/{out['victim-id']}/cancel")
    assert status == 200 and body["cancelled"]
    thread.join(timeout=60)
    assert len(out.get("victim", [])) < 2000
    assert http(server, "POST", "/v1/chat/completions/nope/cancel")[0] == 404


COLOUR = {"type": "function", "function": {
    "name": "set_colour", "description": "Set the lamp's colour",
    "parameters": {"type": "object", "properties": {
        "colour": {"type": "string", "enum": ["crimson-7", "teal-3"]}}, "required": ["colour"]}}}


def test_a_tool_call_keeps_to_its_schema_and_tool_choice_is_honoured(server) -> None:
    """The default model, free, calls set_colour with "blue-7"; under the tools' grammar its
    arguments are in the schema. A named tool_choice makes a greeting a call of that tool."""
    tools = [COLOUR, {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {}}}}]
    ask = [{"role": "user", "content": "Set the lamp to a blue colour"}]
    reply = client(server).chat.completions.create(model="x", messages=ask, tools=[COLOUR],
                                                   temperature=0, max_tokens=60)
    [call] = reply.choices[0].message.tool_calls
    assert call.function.name == "set_colour"
    assert json.loads(call.function.arguments)["colour"] in ("crimson-7", "teal-3")

    hello = [{"role": "user", "content": "Hello, how are you today?"}]
    named = client(server).chat.completions.create(
        model="x", messages=hello, tools=tools, temperature=0, max_tokens=60,
        tool_choice={"type": "function", "function": {"name": "set_colour"}})
    [call] = named.choices[0].message.tool_calls
    assert call.function.name == "set_colour"
    assert json.loads(call.function.arguments)["colour"] in ("crimson-7", "teal-3")
    status, body = http(server, "POST", "/v1/chat/completions", {
        "messages": hello, "tools": tools,
        "tool_choice": {"type": "function", "function": {"name": "open_door"}}})
    assert status == 400 and "open_door" in body["error"]["message"]

    # "none": the same prompt, tools and all (the model knows them; the prefix cache matches
    # the turn's other calls), and the reply is text, even one that reads as a call.
    ask_none = client(server).chat.completions.create(
        model="x", messages=ask, tools=[COLOUR], temperature=0, max_tokens=60,
        tool_choice="none")
    assert ask_none.usage.prompt_tokens == reply.usage.prompt_tokens
    assert not ask_none.choices[0].message.tool_calls
    assert ask_none.choices[0].finish_reason == "stop"


def test_json_schema_response_format_constrains_the_output(server: BackgroundServer) -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"},
                                               "population": {"type": "integer"}},
              "required": ["city", "population"]}
    messages = [{"role": "user", "content": "Which city is the capital of France? Describe it."}]
    reply = client(server).chat.completions.create(
        model="x", messages=messages, temperature=0, max_tokens=60,
        response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": schema}},
    )
    data = json.loads(reply.choices[0].message.content)  # prose was asked for; JSON came back
    assert set(data) == {"city", "population"} and isinstance(data["population"], int)
    assert reply.choices[0].finish_reason == "stop"

    any_json = client(server).chat.completions.create(
        model="x", messages=QUESTION, temperature=0, max_tokens=40,
        response_format={"type": "json_object"},
    )
    assert isinstance(json.loads(any_json.choices[0].message.content), dict)


# --- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (b"{not json", 400, "not valid JSON"),
        (b"[1, 2]", 400, "JSON object"),
        ({"messages": []}, 400, "messages"),
        ({}, 400, "messages"),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages.0.role"),
        ({"messages": QUESTION, "temperature": "hot"}, 400, "temperature"),
        ({"messages": QUESTION, "temperature": 5}, 400, "temperature"),
        ({"messages": QUESTION, "top_p": 0}, 400, "top_p"),
        ({"messages": QUESTION, "max_tokens": 0}, 400, "max_tokens"),
        ({"messages": QUESTION, "max_tokens": "many"}, 400, "max_tokens"),
        ({"messages": QUESTION, "n": 2}, 400, "n=1"),
        ({"messages": QUESTION, "stream": "yes"}, 400, "stream"),
        ({"messages": QUESTION, "fairlane_class": "urgent"}, 400, "fairlane_class"),
        ({"messages": [{"role": "user", "content": "word " * 5000}]}, 400, "may hold"),
        ({"messages": QUESTION, "response_format": {"type": "xml"}}, 400, "response_format"),
        ({"messages": QUESTION, "tool_choice": "sometimes"}, 400, "tool_choice"),
        ({"messages": QUESTION, "response_format": {"type": "json_schema"}}, 400,
         "response_format"),
    ],
)
def test_bad_input_gets_a_4xx_with_a_message(server, body, status, message) -> None:
    got, reply = http(server, "POST", "/v1/chat/completions", body)
    assert got == status
    assert message in reply["error"]["message"]
    assert reply["error"]["type"] == "invalid_request_error"


def test_auth_is_required_except_for_health(server) -> None:
    assert http(server, "GET", "/v1/models", token=None)[0] == 401
    status, reply = http(server, "GET", "/v1/models", token="wrong")
    assert status == 401 and reply["error"]["type"] == "authentication_error"
    with pytest.raises(openai.AuthenticationError):
        client(server, token="wrong").chat.completions.create(model="x", messages=QUESTION)
    assert http(server, "GET", "/health", token=None)[0] == 200


def test_unknown_route_and_class_header(server) -> None:
    status, reply = http(server, "GET", "/v1/nothing")
    assert status == 404 and reply["error"]["message"]
    status, reply = http(server, "POST", "/v1/chat/completions",
                         {"messages": QUESTION, "max_tokens": 2},
                         headers={"X-Fairlane-Class": "loud"})
    assert status == 400 and "unknown class" in reply["error"]["message"]


def test_a_shared_system_prompt_is_prefilled_once(server: BackgroundServer) -> None:
    system = {"role": "system", "content": "You are the assistant of a family home. " * 20}
    prefilled: list[int] = []
    for question in ("Is the oven on?", "Is the back door locked?"):
        reply = client(server).chat.completions.create(
            model="x", messages=[system, {"role": "user", "content": question}],
            temperature=0, max_tokens=4,
        )
        ours = [r for r in server.services.device.records if reply.id in r.request_ids]
        prefilled.append(sum(r.prefill_tokens for r in ours))
        prompt = reply.usage.prompt_tokens
    # The second turn computes only what follows the shared system prompt (~200 tokens).
    assert prefilled[0] >= prompt - 10 and prefilled[1] < 40


def test_a_non_streaming_client_that_goes_away_stops_its_generation(server) -> None:
    """Before, the reply went on for its whole max_tokens with no one to read it."""
    import http.client

    device, engine = server.services.device, server.services.engine
    cancelled = server.services.telemetry.requests.labels("chat", "cancelled")
    cancelled_before = cancelled._value.get()
    held_before = set(device.policy.kv.held)
    body = json.dumps({"messages": [{"role": "user", "content":
                                     "Count from 1 to 1000, one number per line."}],
                       "max_tokens": 2000, "temperature": 0.8}).encode()
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=MODEL_WAIT_S)
    connection.request("POST", "/v1/chat/completions", body,
                       {"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"})
    deadline = time.monotonic() + 60
    while not set(device.policy.kv.held) - held_before and time.monotonic() < deadline:
        time.sleep(0.01)
    [request_id] = set(device.policy.kv.held) - held_before
    time.sleep(0.5)  # a few tokens in
    connection.close()  # the client goes away before the reply
    # The handler counts the cancel on the event loop's thread while the device thread frees
    # the sequence: wait for all three, not for the first to show.
    deadline = time.monotonic() + 30
    while (
        request_id in device.policy.kv.held
        or request_id in engine.sequences
        or cancelled._value.get() == cancelled_before
    ) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert request_id not in device.policy.kv.held and request_id not in engine.sequences
    assert cancelled._value.get() == cancelled_before + 1  # counted as cancelled, not served


HOME_TOOLS = [{"type": "function", "function": {
    "name": name, "description": description,
    "parameters": {"type": "object", "properties": {"name": {"type": "string"}}}}}
    for name, description in (("HassTurnOn", "Turns on/opens/presses a device or entity."),
                              ("HassTurnOff", "Turns off/closes a device or entity."))]
AFTER_A_RESULT = [
    {"role": "system", "content": "You are a voice assistant for Home Assistant. Answer in plain "
     "text.\nThe devices in this smart home:\n- names: Kitchen lights\n  domain: light\n"},
    {"role": "user", "content": "turn on the kitchen lights"},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
     "function": {"name": "HassTurnOn", "arguments": '{"name": "Kitchen lights"}'}}]},
    {"role": "tool", "tool_call_id": "c1", "content": json.dumps({
        "speech": {}, "response_type": "action_done", "data": {"targets": [], "success": [
            {"name": "Kitchen lights", "type": "entity", "id": "light.kitchen_lights"}],
            "failed": []}})},
]


@pytest.mark.parametrize("words", [False, True])
def test_a_reply_in_words_does_not_echo_the_result(server: BackgroundServer, words: bool) -> None:
    """After a tool's result the small model echoes the result's JSON; a reply asked for in
    words (`fairlane_words`) opens with a word instead."""
    body = {"messages": AFTER_A_RESULT, "tools": HOME_TOOLS, "tool_choice": "none",
            "temperature": 0, "max_tokens": 24, **({"fairlane_words": True} if words else {})}
    status, reply = http(server, "POST", "/v1/chat/completions", body)
    assert status == 200, reply
    text = reply["choices"][0]["message"]["content"]
    if words:
        assert text[0].isalnum() and not set("{}[]`") & set(text), text
    else:  # what the default model does when free: the case the option is for
        assert text.lstrip().startswith("{"), text
