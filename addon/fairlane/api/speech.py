"""OpenAI transcriptions: decode, queue as voice work, answer in the format asked for."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import voluptuous as vol
from aiohttp import web

from fairlane.api.common import (
    ApiError,
    deadline_passed,
    enabled,
    read_form,
    refuse_early,
    refused,
    request_class,
    request_deadline,
    services_of,
)
from fairlane.api.openapi import operation
from fairlane.engines.stt import AudioError, Utterance, decode_audio
from fairlane.policy import Kind, Priority
from fairlane.voice.transcription import Cancelled, Expired, Refused, transcribe

RAW_PCM_TYPES = ("audio/pcm", "audio/l16", "audio/x-raw", "audio/raw")
RESPONSE_FORMATS = ("json", "text", "verbose_json")
TRANSCRIPTION_FORM = vol.Schema(
    {
        vol.Optional("model"): str,
        vol.Optional("language"): str,
        vol.Optional("prompt"): str,
        vol.Optional("response_format", default="json"): vol.In(
            RESPONSE_FORMATS, msg=f"must be one of {', '.join(RESPONSE_FORMATS)}"
        ),
        vol.Optional(
            "sample_rate", default=16_000, description="the rate of raw 16-bit PCM (audio/pcm)"
        ): vol.All(
            vol.Coerce(int, msg="must be a whole number of Hz"),
            vol.Range(min=1000, max=384_000, msg="must be between 1000 and 384000 Hz"),
        ),
        vol.Optional("fairlane_class", description="voice, chat or background"): str,
        vol.Optional("priority", description="vLLM's: below 0 voice, 0 chat, above 0 background"): (
            str
        ),
        vol.Optional("user", description="the household member (fairness)"): str,
        vol.Optional("deadline_ms", description="ms until the transcript, 1 to 86400000"): str,
    },
    extra=vol.ALLOW_EXTRA,
)


@dataclass(frozen=True)
class Transcription:
    """One transcription request, read once: all the path below the handler needs."""

    data: bytes
    raw_rate: int | None  # the sample rate of raw PCM; None: an encoded file
    language: str | None
    prompt: str | None
    response_format: str
    priority: Priority
    client: str
    deadline_s: float | None


async def read_transcription(request: web.Request) -> Transcription:
    fields, (data, filename, content_type) = await read_form(request)
    raw = content_type in RAW_PCM_TYPES or filename.endswith((".pcm", ".raw"))
    return Transcription(
        data=data,
        raw_rate=fields["sample_rate"] if raw else None,
        language=fields.get("language"),
        prompt=fields.get("prompt"),
        response_format=fields["response_format"],
        priority=request_class(request, fields, Priority.VOICE),
        client=fields.get("user") or "anonymous",
        deadline_s=request_deadline(request, fields),
    )


@operation(
    "Transcribe one utterance (class voice by default); WAV, FLAC, MP3, OGG or raw 16-bit PCM "
    "(audio/pcm with sample_rate); at most 120 s",
    ok={200: "The transcript (json, text or verbose_json)"},
    errors=(400, 401, 409, 413, 429, 503),
    form=TRANSCRIPTION_FORM,
    file="the audio",
    class_header=True,
)
async def transcriptions(request: web.Request) -> web.StreamResponse:
    """OpenAI's `POST /v1/audio/transcriptions` (multipart), scheduled as `voice` by default."""
    svc = services_of(request)
    speech = enabled(
        svc.speech, "speech-to-text is disabled on this server (stt.enabled: false)", "stt_disabled"
    )
    asked = await read_transcription(request)
    refuse_early(svc, asked.priority, Kind.STT)
    try:
        audio = await asyncio.to_thread(decode_audio, asked.data, asked.raw_rate)
        result = await transcribe(
            svc.device,
            speech.engine,
            svc.telemetry,
            Utterance(audio, asked.language, asked.prompt),
            asked.priority,
            asked.client,
            asked.deadline_s,
        )
    except AudioError as err:
        raise ApiError(400, str(err), param="file", code="bad_audio") from err
    except Refused as err:
        raise refused(err.admission) from err
    except Expired as err:
        raise deadline_passed(str(err)) from err
    except Cancelled as err:
        raise ApiError(409, str(err), code="cancelled") from err
    if asked.response_format == "text":
        return web.Response(text=result.text + "\n")
    if asked.response_format == "json":
        return web.json_response({"text": result.text})
    return web.json_response(
        {
            "task": "transcribe",
            "language": result.language,
            "duration": round(result.duration_s, 3),
            "text": result.text,
            "segments": [
                {"id": 0, "start": 0.0, "end": round(result.duration_s, 3), "text": result.text}
            ],
        }
    )
