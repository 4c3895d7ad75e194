"""A Wyoming ASR server (the protocol of Home Assistant's local voice stack) on its own port.

Home Assistant's built-in Wyoming integration talks to it unchanged. A conversation is:

    → describe            ← info (the model, its languages)
    → transcribe          (optional: language)
    → audio-start, audio-chunk…, audio-stop
    ← transcript-start, transcript-chunk, transcript-stop (streaming clients), transcript

Utterances go through the same device loop as HTTP requests, as `voice` work. Wyoming has no
authentication: bind it to a trusted interface only.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
from wyoming.asr import Transcribe, Transcript, TranscriptChunk, TranscriptStart, TranscriptStop
from wyoming.audio import AudioChunk, AudioChunkConverter, AudioStart, AudioStop
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import AsrModel, AsrProgram, Attribution, Describe, Info
from wyoming.server import AsyncEventHandler, AsyncTcpServer

from fairlane import __version__
from fairlane.device import DeviceLoop
from fairlane.engines.stt import SAMPLE_RATE, AudioError, Utterance, WhisperEngine
from fairlane.policy import Priority
from fairlane.speech import Cancelled, Expired, Refused, transcribe
from fairlane.telemetry import Telemetry

_LOGGER = logging.getLogger(__name__)


@dataclass(frozen=True)
class SpeechService:
    device: DeviceLoop
    engine: WhisperEngine
    telemetry: Telemetry
    model_name: str


def describe(service: SpeechService) -> Info:
    attribution = Attribution(name="Fairlane", url="https://github.com/")
    model = AsrModel(
        name=service.model_name,
        description=f"Whisper ({service.model_name}) on CTranslate2, scheduled by Fairlane",
        attribution=Attribution(name="OpenAI Whisper", url="https://github.com/openai/whisper"),
        installed=True,
        languages=service.engine.languages,
        version=__version__,
    )
    program = AsrProgram(
        name="fairlane",
        description="Fairlane speech-to-text",
        attribution=attribution,
        installed=True,
        version=__version__,
        models=[model],
        supports_transcript_streaming=True,
    )
    return Info(asr=[program])


class AsrHandler(AsyncEventHandler):
    """One client connection: collects an utterance, returns its transcript."""

    def __init__(self, service: SpeechService, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.service = service
        self.converter = AudioChunkConverter(rate=SAMPLE_RATE, width=2, channels=1)
        self.audio = bytearray()
        self.language: str | None = None

    async def handle_event(self, event: Event) -> bool:
        if Describe.is_type(event.type):
            await self.write_event(describe(self.service).event())
            return True
        if Transcribe.is_type(event.type):
            self.language = Transcribe.from_event(event).language
            return True
        if AudioStart.is_type(event.type):
            self.audio.clear()
            return True
        if AudioChunk.is_type(event.type):
            self.audio += self.converter.convert(AudioChunk.from_event(event)).audio
            return True
        if AudioStop.is_type(event.type):
            await self._transcribe()
            return False  # one utterance per connection, as Home Assistant uses it
        return True

    async def _transcribe(self) -> None:
        samples = np.frombuffer(bytes(self.audio), dtype="<i2").astype(np.float32) / 32768.0
        utterance = Utterance(samples, self.language)
        try:
            result = await transcribe(
                self.service.device,
                self.service.engine,
                self.service.telemetry,
                utterance,
                Priority.VOICE,
                client="wyoming",
            )
        except (AudioError, Refused, Cancelled, Expired) as err:
            await self.write_event(Error(text=str(err), code=type(err).__name__).event())
            return
        await self.write_event(TranscriptStart(language=result.language).event())
        await self.write_event(TranscriptChunk(text=result.text).event())
        await self.write_event(TranscriptStop().event())
        await self.write_event(Transcript(text=result.text, language=result.language).event())


async def start(service: SpeechService, host: str, port: int) -> AsyncTcpServer:
    """Start serving on host:port (port 0: any free port); returns the running server."""
    server = AsyncTcpServer(host, port)
    await server.start(partial(AsrHandler, service))
    return server


def bound_port(server: AsyncTcpServer) -> int:
    sockets: Any = getattr(server._server, "sockets", None)
    return int(sockets[0].getsockname()[1]) if sockets else server.port
