"""OpenAI speech: `POST /v1/audio/speech` and `GET /v1/audio/voices`, scheduled as `voice`.

The reply is the whole file by default. With `stream_format: "audio"` each sentence's audio is
sent as soon as it is synthesised (chunked transfer: a player starts on the first sentence);
with `stream_format: "sse"` it comes as OpenAI's `speech.audio.delta` events (base64 PCM) and a
closing `speech.audio.done`.
"""

from __future__ import annotations

import base64
import io
import json
import struct
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import voluptuous as vol
from aiohttp import web

from fairlane.api.common import (
    ApiError,
    deadline_passed,
    enabled,
    read_json,
    refused,
    request_class,
    request_deadline,
    services_of,
)
from fairlane.api.openapi import operation
from fairlane.engines.tts import MAX_INPUT_CHARS, TextError, wav_bytes
from fairlane.policy import Priority
from fairlane.voice.synthesis import VoiceService, sentences_of, speak
from fairlane.voice.transcription import Cancelled, Expired, Refused

PCM_RATE = 24_000  # OpenAI's `pcm` is 24 kHz 16-bit little-endian mono
# Formats PyAV encodes (format → (container, codec, sample rate)); wav and pcm need no encoder.
ENCODED = {
    "mp3": ("mp3", "libmp3lame", None),
    "flac": ("flac", "flac", None),
    "opus": ("ogg", "libopus", 48_000),
    "aac": ("adts", "aac", None),
}
CONTENT_TYPES = {
    "wav": "audio/wav",
    "pcm": "audio/pcm",
    "mp3": "audio/mpeg",
    "flac": "audio/flac",
    "opus": "audio/ogg",
    "aac": "audio/aac",
}
STREAMABLE = ("wav", "pcm", "mp3")  # formats whose pieces can be sent one sentence at a time

SPEECH_SCHEMA = vol.Schema(
    {
        vol.Optional("model"): str,
        vol.Required(
            "input", description=f"at most {MAX_INPUT_CHARS} characters (a longer one is a 400)"
        ): str,
        vol.Optional("voice"): vol.Any(str, {vol.Required("id"): str}),
        vol.Optional("instructions"): str,  # accepted for compatibility; a Piper voice has none
        vol.Optional("response_format", default="mp3"): vol.In(list(CONTENT_TYPES)),
        vol.Optional("speed", default=1.0): vol.All(
            vol.Coerce(float), vol.Range(min=0.25, max=4.0)
        ),
        vol.Optional("stream_format"): vol.In(["audio", "sse"]),
        vol.Optional("fairlane_class"): str,
        vol.Optional("deadline_ms"): vol.Any(int, float),
        vol.Optional("user"): str,
    }
)


def voice_service(request: web.Request) -> VoiceService:
    return enabled(
        services_of(request).voice,
        "speech synthesis is disabled on this server (tts.enabled: false)",
        "tts_disabled",
    )


@operation("The voices this server speaks with")
async def voices(request: web.Request) -> web.Response:
    """The voices this server speaks with (OpenAI's names are accepted and map to the first)."""
    voice = voice_service(request)
    engine = voice.engine
    data = [
        {
            "id": name,
            "object": "voice",
            "language": engine.language,
            "sample_rate": engine.sample_rate,
        }
        for name in voice.voices
    ]
    return web.json_response({"object": "list", "data": data})


@operation(
    "Speak a text (class voice by default); stream_format audio or sse sends each sentence as "
    "soon as it is synthesised",
    ok={200: "The audio, or text/event-stream of speech.audio.*"},
    errors=(400, 401, 409, 413, 429, 503),
    json=SPEECH_SCHEMA,
    class_header=True,
)
async def speech(request: web.Request) -> web.StreamResponse:
    """OpenAI's `POST /v1/audio/speech`."""
    voice = voice_service(request)
    body = await read_json(request)
    name = body.get("voice")
    try:
        voice.check_voice(name["id"] if isinstance(name, dict) else name)
    except TextError as err:
        raise ApiError(400, str(err), param="voice") from err
    try:
        sentences = sentences_of(body["input"])
    except TextError as err:
        raise ApiError(400, str(err), param="input") from err
    fmt = body["response_format"]
    stream_format = body.get("stream_format")
    if stream_format == "audio" and fmt not in STREAMABLE:
        raise ApiError(
            400,
            f"streamed audio is {', '.join(STREAMABLE)}; use stream_format sse or no stream_format",
            param="response_format",
        )
    audio = speak(
        voice,
        sentences,
        request_class(request, body, Priority.VOICE),
        body.get("user") or "anonymous",
        request_deadline(request, body),
        speed=body["speed"],
    )
    try:
        return await _respond(request, audio, voice.engine.sample_rate, fmt, stream_format)
    finally:
        await audio.aclose()  # a client that went away cancels the sentences still queued


async def _respond(
    request: web.Request, audio: Any, rate: int, fmt: str, stream_format: str | None
) -> web.StreamResponse:
    if stream_format is None:
        pieces = [event.pcm async for event in _checked(audio)]
        return web.Response(body=encode(pieces, rate, fmt), content_type=CONTENT_TYPES[fmt])
    # The first sentence decides the status: refusals and bad input are still a clean 4xx.
    first = await anext(_checked(audio), None)
    if stream_format == "sse":
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        tokens = 0
        async for event in _chain(first, audio):
            tokens += 1
            delta = base64.b64encode(_resample(event.pcm, rate, PCM_RATE)).decode()
            await _sse(response, {"type": "speech.audio.delta", "audio": delta})
        await _sse(response, {"type": "speech.audio.done", "usage": {"sentences": tokens}})
        await response.write_eof()
        return response
    response = web.StreamResponse(headers={"Content-Type": CONTENT_TYPES[fmt]})
    await response.prepare(request)
    if fmt == "wav":
        await response.write(streaming_wav_header(rate))
    async for event in _chain(first, audio):
        await response.write(_piece(event.pcm, rate, fmt))
    await response.write_eof()
    return response


async def _checked(audio: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """Synthesis errors as the API's errors."""
    try:
        async for event in audio:
            yield event
    except TextError as err:
        raise ApiError(400, str(err), param="input") from err
    except Refused as err:
        raise refused(err.admission) from err
    except Expired as err:
        raise deadline_passed(str(err)) from err
    except Cancelled as err:
        raise ApiError(409, str(err), code="cancelled") from err


async def _chain(first: Any, rest: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """The first event, then the rest. (After the headers are sent an error can only end the
    stream: the client sees it cut short.)"""
    if first is None:
        return
    yield first
    try:
        async for event in rest:
            yield event
    except (Refused, Expired, Cancelled, TextError):
        return


async def _sse(response: web.StreamResponse, data: dict[str, Any]) -> None:
    await response.write(f"data: {json.dumps(data)}\n\n".encode())


def _piece(pcm: bytes, rate: int, fmt: str) -> bytes:
    if fmt == "wav":
        return pcm
    if fmt == "pcm":
        return _resample(pcm, rate, PCM_RATE)
    return encode([pcm], rate, fmt)


def encode(pieces: list[bytes], rate: int, fmt: str) -> bytes:
    """16-bit mono PCM pieces → a file in `fmt`."""
    if fmt == "wav":
        return wav_bytes(pieces, rate)
    if fmt == "pcm":
        return _resample(b"".join(pieces), rate, PCM_RATE)
    import av

    container_name, codec, out_rate = ENCODED[fmt]
    samples = np.frombuffer(b"".join(pieces), dtype="<i2")
    buffer = io.BytesIO()
    with av.open(buffer, "w", format=container_name) as container:
        stream: Any = container.add_stream(codec, rate=out_rate or rate)
        stream.layout = "mono"
        resampler = av.AudioResampler(format=stream.format.name, layout="mono", rate=stream.rate)
        frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = rate
        for resampled in resampler.resample(frame) + resampler.resample(None):
            for packet in stream.encode(resampled):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return buffer.getvalue()


def _resample(pcm: bytes, rate: int, target: int) -> bytes:
    """16-bit PCM at `rate` → at `target` (linear interpolation; speech, not music)."""
    samples = np.frombuffer(pcm, dtype="<i2").astype(np.float32)
    if rate == target or samples.size == 0:
        return pcm
    count = round(samples.size * target / rate)
    positions = np.arange(count) * (rate / target)
    resampled = np.interp(positions, np.arange(samples.size), samples)
    return bytes(np.clip(resampled, -32768, 32767).astype("<i2").tobytes())


def streaming_wav_header(rate: int) -> bytes:
    """A WAV header for a stream of unknown length (sizes 0xFFFFFFFF, as OpenAI sends)."""
    unknown = 0xFFFFFFFF
    return (
        b"RIFF"
        + struct.pack("<I", unknown)
        + b"WAVEfmt "
        + struct.pack("<IHHIIHH", 16, 1, 1, rate, rate * 2, 2, 16)
        + b"data"
        + struct.pack("<I", unknown)
    )
