"""A Wyoming server (the protocol of Home Assistant's local voice stack) on its own port:
speech-to-text and text-to-speech.

Home Assistant's built-in Wyoming integration talks to it unchanged. The conversations are:

    → describe            ← info (the Whisper model and its languages; the voices)
    → transcribe          (optional: language)
    → audio-start, audio-chunk…, audio-stop
    ← transcript-start, transcript-chunk, transcript-stop (streaming clients), transcript

    → synthesize (text)   ← audio-start, audio-chunk…, audio-stop

    → synthesize-start, synthesize-chunk…, [synthesize (the whole text, ignored)],
      synthesize-stop
    ← audio-start, audio-chunk… (each sentence as soon as it is spoken), audio-stop,
      synthesize-stopped

Recognition is streamed: at the speaker's first pause (0.3 s of quiet after speech) the audio so
far is transcribed as one voice step, while the client is still sending the trailing silence its
own VAD needs to end the utterance; at audio-stop that transcript is used if Silero VAD hears no
speech after it, so the transcript is ready about when the speaker is judged to have stopped.
(Whisper encodes a whole window at once, so there is no partial encoder state to keep: the
pause is where the work can start early.)

Utterances and sentences go through the same device loop as HTTP requests, as `voice` work
(`wyoming.max_class` may lower that). Wyoming has no authentication: bind it to a trusted
interface only. So that no client on that interface can take the device, the server bounds
what one connection may bring: `wyoming.max_connections` at once, an event header of 64 KiB,
its data of 64 KiB, a payload of 1 MiB, audio of a sample rate, width and channel count a
microphone has (checked before any conversion), an utterance of MAX_DECODE_S seconds, and
`wyoming.idle_timeout_s` between events (FIRST_EVENT_S before the first), so that idle
connections cannot hold every slot. Writes are bounded too: a connection queues at most
WRITE_BUFFER_BYTES of output in the server and SEND_BUFFER_BYTES in the kernel, and a client
that reads none of it for `idle_timeout_s` is closed (a client that never reads held its slot
for as long as the synthesis took, and more). Audio of any channel count accepted is mixed
down by averaging its channels, and an utterance's length is counted in its own frames.
Anything malformed or over a bound gets an `error` event, and the connection is closed; every
refusal is logged with its peer (at most once a minute for each kind and address).
`wyoming.clients` lists the addresses that may connect at all.

One connection's state machine (describe, transcribe with its early transcript, synthesize
sentence by sentence) is here; what a connection may bring is `voice.bounds`, the pause rule
`voice.pause`, the work itself `voice.transcription` and `voice.synthesis`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from wyoming.asr import Transcribe, Transcript, TranscriptChunk, TranscriptStart, TranscriptStop
from wyoming.audio import AudioChunk, AudioChunkConverter, AudioStart, AudioStop
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import AsrModel, AsrProgram, Attribution, Describe, Info, TtsProgram, TtsVoice
from wyoming.server import AsyncEventHandler, AsyncTcpServer
from wyoming.tts import (
    Synthesize,
    SynthesizeChunk,
    SynthesizeStart,
    SynthesizeStop,
    SynthesizeStopped,
)

from fairlane import __version__
from fairlane.engines.stt import (
    MAX_DECODE_S,
    SAMPLE_RATE,
    AudioError,
    TranscriptEvent,
    Utterance,
    WhisperEngine,
)
from fairlane.engines.tts import TextError
from fairlane.policy import Priority
from fairlane.runtime.device import Devices
from fairlane.runtime.telemetry import Telemetry
from fairlane.voice.bounds import (
    FIRST_EVENT_S,
    MAX_TEXT_CHARS,
    SEND_BUFFER_BYTES,
    WRITE_BUFFER_BYTES,
    BadEvent,
    Network,
    NotReading,
    Refusals,
    check_format,
    client_allowed,
    mono,
    read_event,
)
from fairlane.voice.pause import PauseDetector, pcm_floats, speech_after
from fairlane.voice.synthesis import SentenceBuffer, VoiceService, sentences_of, speak
from fairlane.voice.transcription import Cancelled, Expired, Refused, transcribe

_LOGGER = logging.getLogger(__name__)


@dataclass(frozen=True)
class SpeechService:
    device: Devices
    engine: WhisperEngine
    telemetry: Telemetry
    model_name: str


@dataclass
class WyomingServices:
    speech: SpeechService | None
    voice: VoiceService | None
    # Transcribe at the speaker's first pause, before the client ends the utterance (below).
    early: bool = True
    max_connections: int = 8
    priority: Priority = Priority.VOICE  # the class of every Wyoming request
    idle_timeout_s: float = 30.0
    clients: tuple[Network, ...] = ()  # empty: any address
    connections: int = 0
    refusals: Refusals = field(default_factory=lambda: Refusals())



SAMPLES_PER_CHUNK = 1024  # audio-chunk size, as Wyoming's own servers send


def describe(services: WyomingServices) -> Info:
    attribution = Attribution(name="Fairlane", url="https://github.com/")
    info = Info()
    if services.speech is not None:
        info.asr = [_asr_program(services.speech, attribution)]
    if services.voice is not None:
        info.tts = [_tts_program(services.voice, attribution)]
    return info


def _tts_program(voice: VoiceService, attribution: Attribution) -> TtsProgram:
    engine = voice.engine
    voices = [
        TtsVoice(
            name=name,
            description=f"{name} (Piper), scheduled by Fairlane",
            attribution=Attribution(name="Piper voices", url="https://github.com/rhasspy/piper"),
            installed=True,
            version=__version__,
            languages=[engine.language],
        )
        for name in voice.voices
    ]
    return TtsProgram(
        name="fairlane-tts",
        description="Fairlane text-to-speech",
        attribution=attribution,
        installed=True,
        version=__version__,
        voices=voices,
        supports_synthesize_streaming=True,
    )


def _asr_program(service: SpeechService, attribution: Attribution) -> AsrProgram:
    model = AsrModel(
        name=service.model_name,
        description=f"Whisper ({service.model_name}) on CTranslate2, scheduled by Fairlane",
        attribution=Attribution(name="OpenAI Whisper", url="https://github.com/openai/whisper"),
        installed=True,
        languages=service.engine.languages,
        version=__version__,
    )
    return AsrProgram(
        name="fairlane",
        description="Fairlane speech-to-text",
        attribution=attribution,
        installed=True,
        version=__version__,
        models=[model],
        supports_transcript_streaming=True,
    )


class WyomingHandler(AsyncEventHandler):
    """One client connection: an utterance to transcribe, or a text to speak."""

    def __init__(self, services: WyomingServices, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.services = services
        self.converter = AudioChunkConverter(rate=SAMPLE_RATE, width=2, channels=1)
        self.audio = bytearray()
        self.language: str | None = None
        self.text: asyncio.Queue[str | None] | None = None  # a streamed synthesis's text
        self.text_chars = 0
        self.speaking: asyncio.Task[None] | None = None
        self.pause = PauseDetector()
        self.early: EarlyTranscript | None = None
        self.seconds = 0.0  # of the utterance so far, counted in its own frames
        self._bound_output()

    def _bound_output(self) -> None:
        """Bound what a client that does not read can make the server hold (see the module)."""
        self.writer.transport.set_write_buffer_limits(high=WRITE_BUFFER_BYTES)
        sock = self.writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)

    async def write_event(self, event: Event) -> None:
        """Send an event; NotReading when the client takes none of the output queued before
        it for `idle_timeout_s`."""
        try:
            async with asyncio.timeout(self.services.idle_timeout_s):
                await super().write_event(event)
        except TimeoutError as err:
            raise NotReading(
                f"the client read nothing for {self.services.idle_timeout_s:g} s"
            ) from err

    async def run(self) -> None:
        """Events until the conversation ends, the client leaves or sends something malformed
        (then it gets an `error` event); the connection is always closed at the end."""
        services = self.services
        if not self._allowed():
            await self._refuse("this address may not use the Wyoming server", "Forbidden")
            await self._close()
            return
        if services.connections >= services.max_connections:
            await self._refuse(
                f"busy: {services.max_connections} Wyoming connections are open", "Busy"
            )
            await self._close()
            return
        services.connections += 1
        wait = min(FIRST_EVENT_S, services.idle_timeout_s)
        try:
            while True:
                try:
                    async with asyncio.timeout(wait):
                        event = await read_event(self.reader)
                except TimeoutError:
                    await self._refuse(f"no event for {wait:g} s: the connection is closed", "Idle")
                    break
                if event is None or not await self.handle_event(event):
                    break
                wait = services.idle_timeout_s
        except NotReading as err:
            self.writer.transport.abort()  # nothing more can be said to it: the slot is freed
            services.refusals.note(self._peer(), "NotReading", str(err))
        except BadEvent as err:
            await self._refuse(str(err), "BadEvent")
        except (KeyError, TypeError, ValueError) as err:  # an event whose fields are wrong
            await self._refuse(f"a malformed event: {err!r}", "BadEvent")
        except Exception as err:  # e.g. audio the converter cannot take: said, not dropped
            _LOGGER.warning("Wyoming connection failed: %r", err)
            await self._refuse(f"the event could not be handled: {err!r}", "BadEvent")
        finally:
            services.connections -= 1
            await self.disconnect()
            await self._close()

    def _allowed(self) -> bool:
        return client_allowed(self.writer.get_extra_info("peername"), self.services.clients)

    def _peer(self) -> str:
        peer = self.writer.get_extra_info("peername")
        return str(peer[0]) if isinstance(peer, tuple) and peer else "unknown"

    async def _refuse(self, text: str, code: str) -> None:
        """Say why the connection ends, and log it (rate-limited) for the operator."""
        self.services.refusals.note(self._peer(), code, text)
        with contextlib.suppress(ConnectionError, RuntimeError, NotReading):
            await self.write_event(Error(text=text, code=code).event())

    async def _close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError):
            await self.writer.wait_closed()

    async def handle_event(self, event: Event) -> bool:
        if Describe.is_type(event.type):
            await self.write_event(describe(self.services).event())
            return True
        if self.services.voice is not None and _is_synthesis(event):
            return await self._synthesis_event(event, self.services.voice)
        if Transcribe.is_type(event.type):
            self.language = Transcribe.from_event(event).language
            return True
        if AudioStart.is_type(event.type):
            start = AudioStart.from_event(event)
            check_format(start.rate, start.width, start.channels)
            self.audio.clear()
            self.seconds = 0.0
            self.pause = PauseDetector()
            return True
        if AudioChunk.is_type(event.type):
            audio = AudioChunk.from_event(event)
            # Checked before converting: resampling from a rate of 1 Hz makes 16,000 samples
            # of every one it is given.
            check_format(audio.rate, audio.width, audio.channels)
            frame = audio.width * audio.channels
            if len(audio.audio) % frame:
                raise BadEvent(f"audio of whole frames ({frame} bytes each)")
            self.seconds += len(audio.audio) // frame / audio.rate
            if self.seconds > MAX_DECODE_S:
                raise BadEvent(f"an utterance longer than {MAX_DECODE_S:.0f} s")
            chunk = self.converter.convert(mono(audio)).audio
            self.audio += chunk
            self._listen(chunk)
            return True
        if AudioStop.is_type(event.type):
            await self._transcribe()
            return False  # one utterance per connection, as Home Assistant uses it
        return True

    async def disconnect(self) -> None:
        """The client went away: its queued sentences and an early transcript are dropped
        (their requests leave the device's queues)."""
        for task in (self.speaking, self.early.task if self.early else None):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        self.early = None

    def _listen(self, chunk: bytes) -> None:
        """Streaming recognition: at the speaker's first pause, transcribe what has come so far
        (one voice step, as any utterance); when speech resumes, that guess is dropped."""
        paused = self.pause.feed(chunk)
        if self.early is not None and self.pause.speaking:
            self.early.task.cancel()  # they went on talking: the guess is stale
            self.early = None
        service = self.services.speech
        if paused and self.early is None and self.services.early and service is not None:
            utterance = Utterance(pcm_floats(bytes(self.audio)), self.language)
            task = asyncio.create_task(_voice(service, utterance, self.services.priority))
            task.add_done_callback(_consume)
            self.early = EarlyTranscript(task, len(self.audio) // 2)

    async def _synthesis_event(self, event: Event, voice: VoiceService) -> bool:
        if SynthesizeStart.is_type(event.type):
            self.text = asyncio.Queue()
            self.speaking = asyncio.create_task(self._speak_stream(voice, self.text))
            self.speaking.add_done_callback(self._unread)
            return True
        if SynthesizeChunk.is_type(event.type):
            if self.text is not None:
                text = SynthesizeChunk.from_event(event).text
                self.text_chars += len(text)
                if self.text_chars > MAX_TEXT_CHARS:
                    raise BadEvent(f"a text longer than {MAX_TEXT_CHARS} characters")
                self.text.put_nowait(text)
            return True
        if SynthesizeStop.is_type(event.type):
            if self.text is not None and self.speaking is not None:
                self.text.put_nowait(None)
                await self.speaking
            await self.write_event(SynthesizeStopped().event())
            return False
        if self.text is not None:
            return True  # the whole text again, for older servers: already being spoken
        text = Synthesize.from_event(event).text
        try:
            sentences = sentences_of(text)
        except TextError as err:
            await self.write_event(Error(text=str(err), code="TextError").event())
            return False
        await self._speak(voice, sentences)
        return False

    def _unread(self, task: asyncio.Task[None]) -> None:
        """A streamed synthesis the client did not read: the connection ends (its reads stop)."""
        if not task.cancelled() and isinstance(task.exception(), NotReading):
            self.services.refusals.note(self._peer(), "NotReading", str(task.exception()))
            self.writer.transport.abort()

    async def _speak_stream(self, voice: VoiceService, text: asyncio.Queue[str | None]) -> None:
        buffer = SentenceBuffer()

        async def sentences() -> AsyncIterator[str]:
            while (chunk := await text.get()) is not None:
                for sentence in buffer.add(chunk):
                    yield sentence
            for sentence in buffer.flush():
                yield sentence

        await self._speak(voice, sentences())

    async def _speak(self, voice: VoiceService, sentences: AsyncIterator[str] | list[str]) -> None:
        rate = voice.engine.sample_rate
        started = False
        spoken = speak(voice, sentences, self.services.priority, client="wyoming")
        try:
            # Closed on the way out, whatever ends it: a client that stops reading leaves
            # nothing queued on the device.
            async with contextlib.aclosing(spoken):
                async for audio in spoken:
                    if not started:
                        await self.write_event(
                            AudioStart(rate=rate, width=2, channels=1).event()
                        )
                        started = True
                    step = SAMPLES_PER_CHUNK * 2
                    for offset in range(0, len(audio.pcm), step):
                        chunk = AudioChunk(
                            rate=rate, width=2, channels=1, audio=audio.pcm[offset : offset + step]
                        )
                        await self.write_event(chunk.event())
        except (TextError, Refused, Cancelled, Expired) as err:
            await self.write_event(Error(text=str(err), code=type(err).__name__).event())
            return
        if not started:
            await self.write_event(AudioStart(rate=rate, width=2, channels=1).event())
        await self.write_event(AudioStop().event())

    async def _transcribe(self) -> None:
        utterance = Utterance(pcm_floats(bytes(self.audio)), self.language)
        service = self.services.speech
        if service is None:
            await self.write_event(
                Error(text="speech-to-text is disabled", code="Disabled").event()
            )
            return
        early, self.early = self.early, None
        try:
            stands = early is not None and not await asyncio.to_thread(
                speech_after, utterance.audio, early.samples
            )
            if early is not None and stands:
                result = await early.task  # nothing said since the pause: the guess stands
            else:
                if early is not None:
                    early.task.cancel()  # a word came after the pause
                result = await _voice(service, utterance, self.services.priority)
        except (AudioError, Refused, Cancelled, Expired) as err:
            await self.write_event(Error(text=str(err), code=type(err).__name__).event())
            return
        await self.write_event(TranscriptStart(language=result.language).event())
        await self.write_event(TranscriptChunk(text=result.text).event())
        await self.write_event(TranscriptStop().event())
        await self.write_event(Transcript(text=result.text, language=result.language).event())


@dataclass(frozen=True)
class EarlyTranscript:
    task: asyncio.Task[TranscriptEvent]
    samples: int  # the audio it covers


async def _voice(
    service: SpeechService, utterance: Utterance, priority: Priority
) -> TranscriptEvent:
    """A Wyoming utterance is work of the client "wyoming" (it has no authentication)."""
    return await transcribe(
        service.device, service.engine, service.telemetry, utterance, priority, "wyoming"
    )


def _consume(task: asyncio.Task[TranscriptEvent]) -> None:
    """An early transcript nobody awaited (speech resumed, or the client left)."""
    if not task.cancelled():
        task.exception()


def _is_synthesis(event: Event) -> bool:
    return any(
        kind.is_type(event.type)
        for kind in (Synthesize, SynthesizeStart, SynthesizeChunk, SynthesizeStop)
    )


async def start(services: WyomingServices, host: str, port: int) -> AsyncTcpServer:
    """Start serving on host:port (port 0: any free port); returns the running server."""
    server = AsyncTcpServer(host, port)
    await server.start(partial(WyomingHandler, services))
    return server


def bound_port(server: AsyncTcpServer) -> int:
    sockets: Any = getattr(server._server, "sockets", None)
    return int(sockets[0].getsockname()[1]) if sockets else server.port
