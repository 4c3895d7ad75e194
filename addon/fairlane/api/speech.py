"""OpenAI transcriptions: decode, queue as voice work, answer in the format asked for."""

from __future__ import annotations

import asyncio

from aiohttp import web

from fairlane.api.common import (
    ApiError,
    deadline_passed,
    read_form,
    refuse_early,
    refused,
    request_class,
    request_deadline,
    services_of,
)
from fairlane.engines.stt import AudioError, Utterance, decode_audio
from fairlane.policy import Kind, Priority
from fairlane.voice.transcription import Cancelled, Expired, Refused, transcribe

# --- speech-to-text ----------------------------------------------------------------------------

RAW_PCM_TYPES = ("audio/pcm", "audio/l16", "audio/x-raw", "audio/raw")
RESPONSE_FORMATS = ("json", "text", "verbose_json")


async def transcriptions(request: web.Request) -> web.StreamResponse:
    """OpenAI's `POST /v1/audio/transcriptions` (multipart), scheduled as `voice` by default."""
    svc = services_of(request)
    if svc.speech is None:
        raise ApiError(
            400,
            "speech-to-text is disabled on this server (stt.enabled: false)",
            code="stt_disabled",
        )
    fields, upload = await read_form(request)
    if upload is None:
        raise ApiError(
            400, "no `file` part: send the audio as multipart form field `file`", param="file"
        )
    data, filename, content_type = upload
    response_format = fields.get("response_format") or "json"
    if response_format not in RESPONSE_FORMATS:
        raise ApiError(
            400,
            f"response_format must be one of {', '.join(RESPONSE_FORMATS)}",
            param="response_format",
        )
    priority = request_class(request, fields, Priority.VOICE)
    refuse_early(svc, priority, Kind.STT)
    raw_rate = None
    if content_type in RAW_PCM_TYPES or filename.endswith((".pcm", ".raw")):
        try:
            raw_rate = int(fields.get("sample_rate") or 16000)
        except ValueError as err:
            raise ApiError(
                400, "sample_rate must be a whole number of Hz", param="sample_rate"
            ) from err
        if not 1000 <= raw_rate <= 384_000:
            raise ApiError(
                400, "sample_rate must be between 1000 and 384000 Hz", param="sample_rate"
            )
    try:
        audio = await asyncio.to_thread(decode_audio, data, raw_rate)
        utterance = Utterance(audio, fields.get("language") or None, fields.get("prompt") or None)
        result = await transcribe(
            svc.device,
            svc.speech.engine,
            svc.telemetry,
            utterance,
            priority,
            fields.get("user") or "anonymous",
            request_deadline(request, fields),
        )
    except AudioError as err:
        raise ApiError(400, str(err), param="file", code="bad_audio") from err
    except Refused as err:
        raise refused(err.admission) from err
    except Expired as err:
        raise deadline_passed(str(err)) from err
    except Cancelled as err:
        raise ApiError(409, str(err), code="cancelled") from err
    if response_format == "text":
        return web.Response(text=result.text + "\n")
    if response_format == "json":
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
