"""One transcription through the device loop: shared by the HTTP API and the Wyoming server."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from fairlane.engines.stt import TranscriptEvent, Utterance, WhisperEngine
from fairlane.policy import Admission, Kind, Priority, Request
from fairlane.runtime.device import Devices
from fairlane.runtime.telemetry import Telemetry


class Refused(Exception):
    """Admission control said no (queue full, deadline); the reason is for the person."""

    def __init__(self, admission: Admission) -> None:
        super().__init__(admission.reason)
        self.admission = admission


class Expired(Exception):
    """The transcription waited past its deadline (rule 9) and was dropped."""


class Cancelled(Exception):
    """The transcription was cancelled before it ran."""


async def transcribe(
    device: Devices,
    engine: WhisperEngine,
    telemetry: Telemetry,
    utterance: Utterance,
    priority: Priority = Priority.VOICE,
    client: str = "anonymous",
    deadline_s: float | None = None,
) -> TranscriptEvent:
    """Queue an utterance as one STT request and wait for its transcript.

    Raises AudioError (from the engine) for audio it cannot take, Refused when admission
    control refuses the request.
    """
    loop = asyncio.get_running_loop()
    done: asyncio.Future[Any] = loop.create_future()
    request_id = f"stt-{uuid.uuid4().hex}"

    def deliver(event: Any) -> None:
        if not done.done():
            done.set_result(event)

    def sink(event: Any) -> None:
        loop.call_soon_threadsafe(deliver, event)

    request = Request(
        request_id,
        Kind.STT,
        priority,
        client,
        0.0,
        audio_s=utterance.duration_s,
        deadline_s=deadline_s,
    )
    admission = device.submit(request, lambda: engine.add(request_id, utterance), sink)
    if not admission.accepted:
        telemetry.refuse(priority)
        raise Refused(admission)
    record = telemetry.begin(Kind.STT, priority, client, 0, request.arrival)
    try:
        event = await done
    finally:
        if not done.done():  # the caller went away
            device.cancel(request_id)
            telemetry.finish(record, device.clock(), outcome="cancelled")
    if not isinstance(event, TranscriptEvent):
        telemetry.finish(record, device.clock(), outcome="cancelled")
        if str(event.finish_reason).startswith("deadline"):
            raise Expired(event.finish_reason)
        raise Cancelled(f"transcription {event.finish_reason}")
    finished_at = device.clock()
    telemetry.finish(record, finished_at)
    telemetry.speech(priority, finished_at - request.arrival, utterance.duration_s)
    return event
