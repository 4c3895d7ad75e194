"""What Home Assistant core's own OpenAI-style clients send, replayed against the real server.

Core's `llama_cpp` integration talks to any OpenAI-compatible server through the `openai`
client; these are its request shapes (read from `homeassistant/components/llama_cpp/api.py`
and `entity.py`): the set-up check (a three-token completion with a test tool, plain and
streamed), tools and structured output as probatio writes them (OpenAPI 3.1 dialect,
`strict: true`), `user` set to the conversation id, `top_p`, and attachments (an image as an
`image_url` part, a PDF pasted into a text part as base64). Core's `openai_conversation`
speaks OpenAI's Responses API to api.openai.com and has no address to change, so it is not a
client of this server.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import openai
import pytest

from fairlane.server import BackgroundServer
from tests.server.conftest import pdf_bytes
from tests.server.test_chat_api import QUESTION, client, http

# llama_cpp/api.py: the set-up check.
TEST_MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France?"},
]
TEST_TOOLS = [{"type": "function", "function": {
    "name": "test_function", "description": "Test function.",
    "parameters": {"type": "object", "properties": {}},
}}]
# probatio.to_openapi(..., openapi_version="3.1.0") of an AI task's structure with an optional,
# nullable field: 3.1 writes nullability as a list of types.
STRUCTURE = {
    "type": "object",
    "properties": {
        "item": {"type": "string", "description": "What to buy"},
        "quantity": {"type": "integer", "minimum": 1},
        "note": {"type": ["string", "null"]},
    },
    "required": ["item", "quantity"],
    "additionalProperties": False,
}


def stats_requests(server: BackgroundServer) -> dict[str, int]:
    _, stats = http(server, "GET", "/v1/stats")
    return {name: lane["requests"] for name, lane in stats["classes"].items()}


@pytest.mark.parametrize("stream", [False, True])
def test_the_llama_cpp_setup_check_passes(server: BackgroundServer, stream: bool) -> None:
    models = [model.id for model in client(server).models.list()]
    result: Any = client(server).chat.completions.create(
        model=models[0], messages=TEST_MESSAGES, tools=TEST_TOOLS, max_tokens=3, stream=stream
    )
    if stream:
        finishes = [c.choices[0].finish_reason for c in result if c.choices]
        assert finishes[-1] in ("length", "stop", "tool_calls")
    else:
        assert result.choices[0].finish_reason in ("length", "stop", "tool_calls")


def test_a_strict_structured_output_in_the_3_1_dialect(server: BackgroundServer) -> None:
    reply = client(server).chat.completions.create(
        model="x",
        messages=[{"role": "user", "content": "We need two litres of milk."}],
        response_format={"type": "json_schema", "json_schema": {
            "name": "shopping", "strict": True, "schema": STRUCTURE}},
        max_tokens=60, temperature=0, top_p=1.0, user="01JCONVERSATIONULID000000",
    )
    data = json.loads(reply.choices[0].message.content or "")
    assert set(data) <= {"item", "quantity", "note"} and {"item", "quantity"} <= set(data)
    assert isinstance(data["quantity"], int) and data["quantity"] >= 1


def test_an_image_part_is_refused_with_what_the_model_reads(server: BackgroundServer) -> None:
    png = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 64).decode()
    messages = [{"role": "user", "content": [
        {"type": "text", "text": "What is in this picture?"},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png}",
                                             "detail": "auto"}},
    ]}]
    with pytest.raises(openai.BadRequestError) as caught:
        client(server).chat.completions.create(model="x", messages=messages, max_tokens=5)
    error = caught.value.body
    assert isinstance(error, dict)
    assert "image input is not supported" in error["message"]
    assert "reads text only" in error["message"]
    assert error["param"] == "messages.0.content.1"


def test_a_pdf_pasted_as_base64_is_read_as_its_text(server: BackgroundServer) -> None:
    """llama_cpp pastes a PDF into the prompt as base64 ("[File: x]\\nContent: ..."): the
    server reads the PDF instead, so the model sees the words, not 1,000 tokens of base64."""
    pdf = pdf_bytes("The dishwasher warranty ends on 14 March 2029.")
    pasted = f"[File: warranty.pdf]\nContent: {base64.b64encode(pdf).decode()}"
    question = "When does the dishwasher warranty end? Answer with the date only."
    # Core puts the question first and the files after it.
    messages = [{"role": "user", "content": [{"type": "text", "text": question},
                                             {"type": "text", "text": pasted}]}]
    reply = client(server).chat.completions.create(
        model="x", messages=messages, max_tokens=16, temperature=0
    )
    assert "2029" in (reply.choices[0].message.content or "")
    assert reply.usage is not None and reply.usage.prompt_tokens < len(pasted) // 4


def test_a_file_part_is_extracted_on_the_server(server: BackgroundServer) -> None:
    data = base64.b64encode(b"# Boiler\nService the boiler every October.").decode()
    messages = [{"role": "user", "content": [
        {"type": "text", "text": "In which month is the boiler serviced? One word."},
        {"type": "file", "file": {"filename": "boiler.md",
                                  "file_data": f"data:text/markdown;base64,{data}"}},
    ]}]
    reply = client(server).chat.completions.create(
        model="x", messages=messages, max_tokens=8, temperature=0
    )
    assert "october" in (reply.choices[0].message.content or "").lower()

    bad = [{"role": "user", "content": [{"type": "file", "file": {"file_id": "file-123"}}]}]
    status, body = http(server, "POST", "/v1/chat/completions", {"messages": bad})
    assert status == 400 and "file_data" in body["error"]["message"]
    broken = [{"role": "user", "content": [{"type": "file", "file": {
        "filename": "x.pdf", "file_data": "data:application/pdf;base64,JVBERi0xLjQgbm90"}}]}]
    status, body = http(server, "POST", "/v1/chat/completions", {"messages": broken})
    assert status == 400 and "PDF cannot be read" in body["error"]["message"]


@pytest.mark.parametrize(("priority", "lane"), [(-1, "voice"), (0, "chat"), (5, "background"),
                                                ("background", "background")])
def test_the_priority_field_picks_the_class(server: BackgroundServer, priority: object,
                                            lane: str) -> None:
    before = stats_requests(server)
    status, _ = http(server, "POST", "/v1/chat/completions",
                     {"messages": QUESTION, "max_tokens": 2, "priority": priority})
    assert status == 200
    after = stats_requests(server)
    assert {name for name in after if after[name] != before[name]} == {lane}


def test_a_bad_priority_is_a_400(server: BackgroundServer) -> None:
    status, body = http(server, "POST", "/v1/chat/completions",
                        {"messages": QUESTION, "max_tokens": 2, "priority": "urgent"})
    assert status == 400 and body["error"]["param"] == "priority"
    status, body = http(server, "POST", "/v1/chat/completions",
                        {"messages": QUESTION, "max_tokens": 2, "priority": 1.5})
    assert status == 400 and "priority" in body["error"]["message"]


def test_health_names_a_stable_instance(server: BackgroundServer) -> None:
    _, first = http(server, "GET", "/health", token=None)
    _, again = http(server, "GET", "/health", token=None)
    assert len(first["instance_id"]) == 32 and first["instance_id"] == again["instance_id"]
