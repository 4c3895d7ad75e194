"""Input a hostile or unlucky client sends: each gets a 4xx in OpenAI's error shape, never a
500 (each case below was a 500 before)."""

from __future__ import annotations

import http.client
import json
from typing import Any

import pytest

from fairlane.server import BackgroundServer
from tests.server.conftest import TOKEN

CHAT = "/v1/chat/completions"


def send(server: BackgroundServer, method: str, path: str, body: bytes = b"",
         content_type: str = "application/json",
         authorization: str = f"Bearer {TOKEN}") -> tuple[int, Any]:
    """Raw HTTP, so headers and bodies can be what no client library would send."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    connection.putrequest(method, path)
    connection.putheader("Content-Type", content_type)
    connection.putheader("Authorization", authorization)
    connection.putheader("Content-Length", str(len(body)))
    connection.endheaders()
    connection.send(body)
    response = connection.getresponse()
    raw = response.read()
    try:
        return response.status, json.loads(raw)
    except json.JSONDecodeError:
        return response.status, raw.decode(errors="replace")


def assert_refused(status: int, body: Any, expected: int, words: str) -> None:
    assert status == expected, body
    assert isinstance(body, dict) and words in body["error"]["message"], body


def test_json_nested_100000_deep_is_a_400(server: BackgroundServer) -> None:
    deep = b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    assert_refused(*send(server, "POST", CHAT, deep), 400, "nested too deeply")


@pytest.mark.parametrize(("path", "body"), [
    (CHAT, b'{"messages": [{"role": "user", "content": "hi \\ud800"}], "max_tokens": 2}'),
    ("/v1/embeddings", b'{"input": "hi \\ud800"}'),
    ("/v1/documents", b'{"text": "the boiler \\ud800 manual"}'),
    ("/v1/documents/search", b'{"query": "boiler \\udfff"}'),
    ("/v1/summaries", b'{"text": "a note \\ud800"}'),
])
def test_a_lone_surrogate_is_a_400(server: BackgroundServer, path: str, body: bytes) -> None:
    assert_refused(*send(server, "POST", path, body), 400, "lone surrogate")


def test_a_schema_llama_cpp_cannot_convert_is_a_400(server: BackgroundServer) -> None:
    schema = {"type": "object", "required": ["a"],
              "properties": {"a": {"type": "string", "pattern": "[a-z]+"}}}
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
            "response_format": {"type": "json_schema", "json_schema": {"schema": schema}}}
    status, reply = send(server, "POST", CHAT, json.dumps(body).encode())
    assert_refused(status, reply, 400, "unsupported JSON schema")
    assert reply["error"]["param"] == "response_format.json_schema"


@pytest.mark.parametrize(("method", "path"), [
    ("GET", "/v1/models"), ("GET", "/v1/stats"), ("POST", CHAT), ("POST", "/v1/embeddings"),
    ("POST", "/v1/documents"),
])
def test_a_non_ascii_token_is_a_401(server: BackgroundServer, method: str, path: str) -> None:
    status, reply = send(server, method, path, b"{}", authorization="Bearer caf\xe9")
    assert status == 401 and reply["error"]["type"] == "authentication_error"


def _pcm_form(rate: str, filename: str = "a.pcm") -> tuple[bytes, str]:
    boundary = "b0undary"
    head = (f'--{boundary}\r\nContent-Disposition: form-data; name="sample_rate"\r\n\r\n'
            f"{rate}\r\n--{boundary}\r\n"
            f'Content-Disposition: form-data; name="file"; filename="{filename}"\r\n'
            "Content-Type: audio/pcm\r\n\r\n")
    body = head.encode("latin-1") + b"\0" * 3200 + f"\r\n--{boundary}--\r\n".encode()
    return body, f"multipart/form-data; boundary={boundary}"


@pytest.mark.parametrize("rate", ["0", "-16000", "4294967296"])
def test_a_raw_audio_rate_out_of_range_is_a_400(server: BackgroundServer, rate: str) -> None:
    body, content_type = _pcm_form(rate)
    status, reply = send(server, "POST", "/v1/audio/transcriptions", body, content_type)
    assert_refused(status, reply, 400, "sample_rate must be between")


@pytest.mark.parametrize("path", ["/v1/audio/transcriptions", "/v1/documents"])
def test_a_control_character_in_a_part_header_is_a_400(server: BackgroundServer,
                                                       path: str) -> None:
    body, content_type = _pcm_form("16000", filename="a\x01.pcm")
    status, reply = send(server, "POST", path, body, content_type)
    assert_refused(status, reply, 400, "multipart body is malformed")
