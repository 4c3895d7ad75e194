"""Input a hostile or unlucky client sends: each gets a 4xx in OpenAI's error shape, never a
500 (each case below was a 500 before)."""

from __future__ import annotations

import asyncio
import http.client
import io
import json
import logging
import socket
import wave
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fairlane.server import BackgroundServer
from tests.server.conftest import MODEL_WAIT_S, TOKEN

CHAT = "/v1/chat/completions"


def send(server: BackgroundServer, method: str, path: str, body: bytes = b"",
         content_type: str = "application/json",
         authorization: str = f"Bearer {TOKEN}") -> tuple[int, Any]:
    """Raw HTTP, so headers and bodies can be what no client library would send."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=MODEL_WAIT_S)
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


@pytest.mark.parametrize(("schema", "words"), [
    # Each killed the server (SIGSEGV in llama.cpp's grammar), took all its memory, or was a
    # 500 before.
    ({"type": "string", "maxLength": 100_000}, "`maxLength` is 100000; at most 500"),
    ({"type": "array", "items": {"type": "string"}, "maxItems": 100_000}, "`maxItems` is 100000"),
    ({"type": "array", "items": {"type": "string"}, "minItems": 1_000_000_000}, "`minItems`"),
    ({"type": "string", "pattern": "^a{100000}$"}, "`pattern` repeats 100000 times"),
    ({"type": "string", "maxLength": 10_000}, "`maxLength` is 10000"),
    ({"enum": []}, "`enum` must list at least one value"),
    # Review 39cbe61: each froze the device loop for minutes (nested quantifiers), held up the
    # event loop (optional properties), or was a 500 (a keyword of the wrong type).
    ({"type": "object", "required": ["s"], "properties": {"s": {
        "type": "string", "pattern": "^((a{0,10}){0,10}){0,10}a{60}$"}}}, "multiply to 1000"),
    ({"type": "string", "pattern": "^(a{0,100}){0,100}a{100}$"}, "multiply to 10000"),
    ({"type": "string", "pattern": "^((a{0,5}){0,5}){0,5}a{60}$"}, "at most 100"),
    ({"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(950)}},
     "950 optional properties; at most 64"),
    ({"type": "object", "properties": []}, "`properties` must be an object of schemas"),
    ({"allOf": [[1]]}, "a sub-schema must be an object or a boolean, not a list"),
    ({"type": "string", "pattern": 5}, "`pattern` must be a string, not a number"),
    ({"$ref": 5}, "`$ref` must be a string, not a number"),
    ({"type": "object", "properties": {"a": False}}, "a `false` sub-schema accepts nothing"),
])
def test_a_response_schema_over_a_limit_is_a_400_and_the_server_lives(
        server: BackgroundServer, schema: dict[str, Any], words: str) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
            "response_format": {"type": "json_schema", "json_schema": {"schema": schema}}}
    status, reply = send(server, "POST", CHAT, json.dumps(body).encode())
    assert_refused(status, reply, 400, words)
    assert reply["error"]["param"] == "response_format.json_schema"
    assert send(server, "GET", "/health")[0] == 200


def test_a_response_schema_at_the_limits_is_served(server: BackgroundServer) -> None:
    schema = {"type": "object", "required": ["names"], "properties": {"names": {
        "type": "array", "maxItems": 500,
        "items": {"type": "string", "maxLength": 500, "pattern": "^[a-z]{1,500}$"}}}}
    body = {"messages": [{"role": "user", "content": "Name three fruits."}], "max_tokens": 12,
            "temperature": 0,
            "response_format": {"type": "json_schema", "json_schema": {"schema": schema}}}
    status, reply = send(server, "POST", CHAT, json.dumps(body).encode())
    assert status == 200, reply
    assert reply["choices"][0]["message"]["content"].startswith('{')


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"a": True}, "required": ["a"]},
    {"anyOf": [True]},
    {"type": "object", "properties": {"s": {"type": "string", "pattern": "^(a+)+b$"}}},
])
def test_boolean_sub_schemas_and_unambiguous_patterns_are_served(
        server: BackgroundServer, schema: dict[str, Any]) -> None:
    """`true` is any value (it was a 500); `(a+)+` is one recursive rule, not a product."""
    body = {"messages": [{"role": "user", "content": "Answer in JSON."}], "max_tokens": 8,
            "temperature": 0,
            "response_format": {"type": "json_schema", "json_schema": {"schema": schema}}}
    status, reply = send(server, "POST", CHAT, json.dumps(body).encode())
    assert status == 200, reply


def test_a_grammar_too_slow_to_sample_is_a_400_and_the_house_goes_on(
        server: BackgroundServer) -> None:
    """Sixty-four overlapping ambiguous patterns, each under the static bound: a mask of the
    vocabulary takes ~0.5 s from the first step, and grows. The request ends with a 400 once
    its grammar passes its budget in a step, while another client's chat, sent beside it, is
    served."""
    slow = {"anyOf": [{"type": "string", "pattern": f"^(a{{0,10}}){{0,10}}a{{{60 + i}}}$"}
                      for i in range(64)]}
    body = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 80,
            "temperature": 0,
            "response_format": {"type": "json_schema", "json_schema": {"schema": slow}}}
    chat = {"messages": [{"role": "user", "content": "Name a fruit."}], "max_tokens": 16,
            "temperature": 0}
    with ThreadPoolExecutor(2) as pool:
        refused = pool.submit(send, server, "POST", CHAT, json.dumps(body).encode())
        served = pool.submit(send, server, "POST", CHAT, json.dumps(chat).encode())
        status, reply = refused.result()
        assert served.result()[0] == 200
    assert_refused(status, reply, 400, "too slow to sample")
    assert reply["error"]["code"] == "grammar_too_slow"


@pytest.mark.parametrize("parameters", [
    {"type": "object", "properties": {"a": True}},
    {"type": "object", "properties": []},
    {"type": "object", "properties": {"p": {"type": "string", "pattern": 5}}},
    {"type": "object", "properties": {"s": {"type": "string",
                                            "pattern": "^(a{0,30}){0,30}a{60}$"}}},
])
def test_a_tool_whose_parameters_cannot_be_a_grammar_takes_free_arguments(
        server: BackgroundServer, parameters: dict[str, Any]) -> None:
    """As the tools' docstring promises: free JSON arguments, not a 500 or a frozen device."""
    tool = {"type": "function", "function": {"name": "note", "parameters": parameters}}
    body = {"messages": [{"role": "user", "content": "Take a note."}], "max_tokens": 24,
            "temperature": 0, "tools": [tool], "tool_choice": "required"}
    status, reply = send(server, "POST", CHAT, json.dumps(body).encode())
    assert status == 200, reply  # each was a 500, or held the device for minutes
    choice = reply["choices"][0]
    if choice["finish_reason"] != "length":  # a call the small model wrote to the end
        calls = choice["message"]["tool_calls"]
        assert [call["function"]["name"] for call in calls] == ["note"]


def test_characters_beyond_the_basic_plane_are_answered_as_themselves(
        server: BackgroundServer) -> None:
    """An emoji in an enum became two surrogate code points in the grammar, and the reply was
    mojibake with a 200."""
    schema = {"type": "object", "required": ["vote"],
              "properties": {"vote": {"enum": ["👍", "👎"]}}}
    body = {"messages": [{"role": "user", "content": "Do you like tea? Vote."}],
            "max_tokens": 16, "temperature": 0,
            "response_format": {"type": "json_schema", "json_schema": {"schema": schema}}}
    status, reply = send(server, "POST", CHAT, json.dumps(body).encode())
    assert status == 200, reply
    assert json.loads(reply["choices"][0]["message"]["content"])["vote"] in ("👍", "👎")


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
    assert_refused(status, reply, 400, "sample_rate: must be between 1000 and 384000 Hz")


@pytest.mark.parametrize("path", ["/v1/audio/transcriptions", "/v1/documents"])
def test_a_control_character_in_a_part_header_is_a_400(server: BackgroundServer,
                                                       path: str) -> None:
    body, content_type = _pcm_form("16000", filename="a\x01.pcm")
    status, reply = send(server, "POST", path, body, content_type)
    assert_refused(status, reply, 400, "multipart body is malformed")


def _wav_form(samples: int, rate: int) -> tuple[bytes, str]:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(rate)
        wav.writeframes(b"\1\0" * samples)
    boundary = "b0undary"
    head = (f'--{boundary}\r\nContent-Disposition: form-data; name="file"; '
            'filename="long.wav"\r\nContent-Type: audio/wav\r\n\r\n')
    body = head.encode() + buffer.getvalue() + f"\r\n--{boundary}--\r\n".encode()
    return body, f"multipart/form-data; boundary={boundary}"


def test_long_audio_at_a_low_rate_is_refused_before_it_is_resampled(
        server: BackgroundServer) -> None:
    # 2 MB of audio at 1 kHz is 1,000 s: resampled first, it was 64 MB of float samples
    # (at the 100 Hz the report used, 640 MB) before the length check said no.
    body, content_type = _wav_form(1_000_000, 1000)
    status, reply = send(server, "POST", "/v1/audio/transcriptions", body, content_type)
    assert_refused(status, reply, 400, "longer than 120 s")


# --- Wyoming: no authentication, so every bound is the server's ---------------------------------


async def _wyoming_reply(port: int, sent: list[bytes],
                         most: int = 100) -> tuple[list[dict[str, Any]], bool]:
    """Send raw bytes; read events until the server closes the connection (or 30 s pass:
    `closed` is then False, the client left hanging), or `most` events came."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    events: list[dict[str, Any]] = []
    closed = False
    try:
        for piece in sent:
            writer.write(piece)
            await writer.drain()
        async with asyncio.timeout(30):
            while line := await reader.readline():
                event = json.loads(line)
                if event.get("data_length"):
                    event["data"] = json.loads(await reader.readexactly(event["data_length"]))
                if event.get("payload_length"):
                    await reader.readexactly(event["payload_length"])
                events.append(event)
                if len(events) >= most:
                    return events, False
            closed = True
    except ConnectionError:  # closed with our bytes unread: a reset is a close too
        closed = True
    except TimeoutError:
        pass
    finally:
        writer.close()
    return events, closed


def _event(kind: str, data: dict[str, Any] | None = None, payload: bytes = b"") -> bytes:
    header: dict[str, Any] = {"type": kind, "data": data or {}}
    if payload:
        header["payload_length"] = len(payload)
    return json.dumps(header).encode() + b"\n" + payload


@pytest.mark.parametrize(("sent", "words"), [
    ([b"this is not json\n"], "not JSON"),
    ([b'{"data": {}}\n'], "without a type"),
    ([b'["audio-start"]\n'], "without a type"),
    ([b'{"type": "audio-chunk", "payload_length": 1000000000}\n'], "payload_length"),
    ([b'{"type": "transcribe", "data_length": -5}\n'], "data_length"),
    ([_event("audio-start", {"rate": 16000, "width": 2, "channels": 1}),
      _event("audio-chunk", {"width": 2}, b"\0" * 320)], "malformed event"),
    ([_event("audio-start", {"rate": 16000, "width": 2, "channels": 1}),
      _event("audio-chunk", {"rate": 16000, "width": 5, "channels": 1}, b"\0" * 320)],
     "a sample width of 1, 2 or 4 bytes"),
    # Resampled from 1 Hz, 1 MiB became 32 GB of audio: refused before any work.
    ([_event("audio-start", {"rate": 1, "width": 2, "channels": 1})], "a sample rate of"),
    ([_event("audio-start", {"rate": 16000, "width": 2, "channels": 1}),
      _event("audio-chunk", {"rate": 1, "width": 2, "channels": 1}, b"\0" * 1_048_576)],
     "a sample rate of 8000-96000 Hz, not 1"),
    ([_event("audio-start", {"rate": 16000, "width": 2, "channels": 1}),
      _event("audio-chunk", {"rate": 10, "width": 2, "channels": 1}, b"\0" * 1_048_576)],
     "not 10"),
    ([_event("audio-start", {"rate": 16000, "width": 2, "channels": 0})], "1-8 channels"),
])
def test_a_malformed_wyoming_event_gets_an_error_and_a_closed_connection(
        server: BackgroundServer, sent: list[bytes], words: str) -> None:
    events, closed = asyncio.run(_wyoming_reply(server.services.wyoming_port, sent))
    assert closed, "the client was left waiting"
    assert [e["type"] for e in events] == ["error"], events
    assert words in events[0]["data"]["text"]


def test_a_wyoming_utterance_is_capped_while_it_arrives(server: BackgroundServer) -> None:
    audio = {"rate": 16000, "width": 2, "channels": 1}
    chunk = _event("audio-chunk", audio, b"\0" * 1_000_000)  # 31 s each
    # The fourth chunk passes 120 s; nothing follows it, so the server reads every byte sent
    # (closing with bytes unread would reset the connection and could lose the error).
    sent = [_event("audio-start", audio)] + [chunk] * 4
    events, closed = asyncio.run(_wyoming_reply(server.services.wyoming_port, sent))
    assert closed and [e["type"] for e in events] == ["error"], events
    assert "longer than 120 s" in events[0]["data"]["text"]


def test_wyoming_connections_beyond_the_limit_are_told_busy(server: BackgroundServer) -> None:
    port = server.services.wyoming_port
    limit = server.services.config.wyoming.max_connections

    async def scenario() -> tuple[list[dict[str, Any]], bool, dict[str, Any]]:
        held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(limit)]
        for reader, writer in held:  # each connection is being served once it answers
            writer.write(_event("describe"))
            await writer.drain()
            await reader.readline()
        try:
            # Nothing sent: the server answers at once, and closing with our bytes unread
            # would reset the connection and could lose its error.
            events, closed = await _wyoming_reply(port, [])
        finally:
            for _, writer in held:
                writer.close()
        # The connections are released when they close: a new one is served again.
        async with asyncio.timeout(30):
            while server.services.wyoming.connections:  # type: ignore[union-attr]
                await asyncio.sleep(0.05)
        again, _ = await _wyoming_reply(port, [_event("describe")], most=1)
        return events, closed, again[0]

    events, closed, again = asyncio.run(scenario())
    assert closed and [e["type"] for e in events] == ["error"], events
    assert "busy" in events[0]["data"]["text"]
    assert again["type"] == "info"


def test_idle_wyoming_connections_are_closed_and_free_their_slots(
        server: BackgroundServer) -> None:
    """Connections that never send an event once held every slot, and each real client was
    told busy, for as long as they stayed open. Now each is closed with an error after
    FIRST_EVENT_S; then a real client is served."""
    port = server.services.wyoming_port
    limit = server.services.config.wyoming.max_connections

    async def scenario() -> tuple[list[bytes], dict[str, Any]]:
        idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(limit)]
        told = []
        async with asyncio.timeout(60):
            for reader, writer in idle:  # nothing sent: the server says why, and closes
                told.append(await reader.readline())
                await reader.read()  # the rest of the event, then the end: it was closed
                writer.close()
            while server.services.wyoming.connections:  # type: ignore[union-attr]
                await asyncio.sleep(0.05)
        again, _ = await _wyoming_reply(port, [_event("describe")], most=1)
        return told, again[0]

    told, again = asyncio.run(scenario())
    assert all(json.loads(line)["type"] == "error" for line in told)
    assert again["type"] == "info"


# --- review 39cbe61: clients that never read, channels beyond two, the length in frames -------

SPEECH = Path(__file__).resolve().parents[1] / "fixtures" / "speech"


def test_wyoming_clients_that_never_read_lose_their_slots(
        server: BackgroundServer, caplog: pytest.LogCaptureFixture) -> None:
    """Two clients with small receive buffers ask for a long text and read nothing: they held
    both slots for as long as the synthesis took, and longer (their writes waited forever).
    Now each write waits at most the idle timeout: their slots are freed, the refusal is
    logged, and the next client is served."""
    services = server.services.wyoming
    assert services is not None
    port = server.services.wyoming_port
    text = " ".join(f"Sentence number {n} of a long text nobody listens to." for n in range(40))
    before, services.idle_timeout_s = services.idle_timeout_s, 2.0

    async def scenario() -> dict[str, Any]:
        stalled = []
        for _ in range(2):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(("127.0.0.1", port))
            sock.sendall(_event("synthesize", {"text": text}))
            stalled.append(sock)
        try:
            async with asyncio.timeout(MODEL_WAIT_S):
                while services.connections:  # their slots, freed while they stay connected
                    await asyncio.sleep(0.05)
            again, _ = await _wyoming_reply(port, [_event("describe")], most=1)
        finally:
            for sock in stalled:
                sock.close()
        return again[0]

    caplog.set_level(logging.WARNING, logger="fairlane.voice.wyoming")
    try:
        again = asyncio.run(scenario())
    finally:
        services.idle_timeout_s = before
    assert again["type"] == "info"
    assert "NotReading" in caplog.text and "127.0.0.1" in caplog.text


def _wyoming_transcript(port: int, fmt: dict[str, int], audio: bytes,
                        stop: bool = True) -> list[dict[str, Any]]:
    chunk = 256 * 1024 - 256 * 1024 % (fmt["width"] * fmt["channels"])
    sent = [_event("transcribe", {}), _event("audio-start", fmt)]
    sent += [_event("audio-chunk", fmt, audio[i : i + chunk]) for i in range(0, len(audio), chunk)]
    if stop:
        sent.append(_event("audio-stop"))
    events, closed = asyncio.run(_wyoming_reply(port, sent))
    assert closed, events
    return events


@pytest.mark.parametrize("channels", [4, 8])
def test_wyoming_audio_of_many_channels_is_mixed_down_to_the_same_words(
        server: BackgroundServer, channels: int) -> None:
    """A command copied onto 4 or 8 channels was read as stereo ("I'm sorry."): now it is
    heard as the mono recording is."""
    with wave.open(str(SPEECH / "command-00.wav")) as recording:
        rate, mono = recording.getframerate(), recording.readframes(recording.getnframes())
    samples = np.frombuffer(mono, "<i2")
    fmt = {"rate": rate, "width": 2, "channels": 1}
    alone = _wyoming_transcript(server.services.wyoming_port, fmt, mono)
    many = np.repeat(samples[:, None], channels, axis=1).tobytes()
    mixed = _wyoming_transcript(
        server.services.wyoming_port, {**fmt, "channels": channels}, many)
    assert alone[-1]["type"] == mixed[-1]["type"] == "transcript", (alone, mixed)
    assert "kitchen" in alone[-1]["data"]["text"].lower()
    assert mixed[-1]["data"]["text"] == alone[-1]["data"]["text"]


def test_a_wyoming_utterance_of_8_channels_is_measured_in_its_own_frames(
        server: BackgroundServer) -> None:
    """8 channels of 32-bit samples: 25 s is served (it became 100 s of audio, refused by the
    speech lane), 120.5 s is refused as it arrives."""
    fmt = {"rate": 16000, "width": 4, "channels": 8}
    second = bytes(16000 * 4 * 8)  # 512 KiB: two chunks
    served = _wyoming_transcript(server.services.wyoming_port, fmt, second * 25)
    assert served[-1]["type"] == "transcript", served[:1]
    # The last chunk passes 120 s and nothing follows it (see the capped utterance above).
    over = second * 120 + second[: len(second) // 2]
    refused = _wyoming_transcript(server.services.wyoming_port, fmt, over, stop=False)
    assert [e["type"] for e in refused] == ["error"], refused[:1]
    assert "longer than 120 s" in refused[0]["data"]["text"]


@pytest.mark.parametrize("calls", ['[{}]', '[{"function": {}}]', '[{"function": {"name": 5}}]'])
def test_a_tool_call_without_a_function_name_is_a_400(server: BackgroundServer,
                                                       calls: str) -> None:
    # Found by the schemathesis test: the chat template read a missing name (a 500 before).
    body = ('{"messages": [{"role": "assistant", "content": null, "tool_calls": ' + calls
            + '}, {"role": "user", "content": "and now?"}], "max_tokens": 2}')
    status, reply = send(server, "POST", CHAT, body.encode())
    assert_refused(status, reply, 400, "messages.0.tool_calls.0.function")
