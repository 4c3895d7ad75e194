"""Speech synthesis through the device loop: shared by the HTTP API, Wyoming and the benchmarks.

Text comes in whole (`/v1/audio/speech`) or as a stream (Home Assistant's pipeline streams the
agent's reply; Wyoming's `synthesize-chunk`). `SentenceBuffer` cuts it into sentences as soon as
each is complete, and `speak` queues every sentence as one `tts` request of the caller's class,
keeping at most `window` of them queued or running per stream: the first sentence is spoken
while the LLM is still writing the second, and a long text cannot fill the voice queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import uuid
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Any

from fairlane.engines.tts import (
    MAX_INPUT_CHARS,
    AudioEvent,
    PiperVoice,
    TextError,
    normalize,
    split_sentences,
)
from fairlane.policy import Kind, Priority, Request
from fairlane.runtime.device import Devices
from fairlane.runtime.telemetry import Telemetry
from fairlane.voice.transcription import Cancelled, Expired, Refused

# A sentence is complete at . ! ? ; : followed by white space, or at a line break.
_BOUNDARY = re.compile(r"[.!?;:][\"')\]]*\s|\n")


@dataclass(frozen=True)
class VoiceService:
    device: Devices
    engine: PiperVoice
    telemetry: Telemetry

    @property
    def voices(self) -> list[str]:
        return self.engine.voices

    def check_voice(self, voice: str | None) -> None:
        """Refuse a voice this server does not have (OpenAI's names map to the default)."""
        if voice and voice not in self.voices and voice not in OPENAI_VOICES:
            raise TextError(f"unknown voice {voice!r}; this server has {', '.join(self.voices)}")


# OpenAI's voice names: clients send one of them; all are spoken by the server's voice.
OPENAI_VOICES = frozenset(
    [
        "alloy",
        "ash",
        "ballad",
        "coral",
        "echo",
        "fable",
        "nova",
        "onyx",
        "sage",
        "shimmer",
        "verse",
        "marin",
        "cedar",
    ]
)


class SentenceBuffer:
    """Streamed text in, complete sentences out (normalised and cut to a bounded length)."""

    def __init__(self, limit: int = MAX_INPUT_CHARS * 64) -> None:
        self.text = ""
        self.limit = limit
        self.seen = 0

    def add(self, chunk: str) -> list[str]:
        self.seen += len(chunk)
        if self.seen > self.limit:
            raise TextError(f"more than {self.limit} characters of text in one stream")
        self.text += chunk
        end = 0
        for match in _BOUNDARY.finditer(self.text):
            end = match.end()
        if not end:
            return []
        complete, self.text = self.text[:end], self.text[end:]
        return split_sentences(normalize(complete))

    def flush(self) -> list[str]:
        rest, self.text = self.text, ""
        return split_sentences(normalize(rest))


def sentences_of(text: str) -> list[str]:
    """A whole text's sentences; refuses text with nothing to say or too much of it."""
    if len(text) > MAX_INPUT_CHARS:
        raise TextError(f"input is {len(text)} characters; the limit is {MAX_INPUT_CHARS}")
    sentences = split_sentences(normalize(text))
    if not sentences:
        raise TextError("input has no words to speak")
    return sentences


async def _iterate(sentences: Iterable[str]) -> AsyncIterator[str]:
    for sentence in sentences:
        yield sentence


async def speak(
    service: VoiceService,
    sentences: AsyncIterable[str] | Iterable[str],
    priority: Priority = Priority.VOICE,
    client: str = "anonymous",
    deadline_s: float | None = None,
    window: int = 2,
    speed: float = 1.0,
) -> AsyncGenerator[AudioEvent]:
    """Each sentence's audio, in order, as soon as it is synthesised.

    Raises TextError for text the voice cannot take, Refused when admission control refuses a
    sentence, Expired when one waits past its deadline, Cancelled when it is dropped.
    """
    source = sentences if isinstance(sentences, AsyncIterable) else _iterate(sentences)
    loop = asyncio.get_running_loop()
    slots = asyncio.Semaphore(window)
    order: asyncio.Queue[asyncio.Future[Any] | BaseException | None] = asyncio.Queue()
    live: dict[str, asyncio.Future[Any]] = {}
    started = service.device.clock()
    record = service.telemetry.begin(Kind.TTS, priority, client, 0, started)

    def submit(sentence: str) -> asyncio.Future[Any]:
        speech = service.engine.prepare(sentence, speed)
        done: asyncio.Future[Any] = loop.create_future()
        request_id = f"tts-{uuid.uuid4().hex}"

        def sink(event: Any) -> None:
            loop.call_soon_threadsafe(_resolve, done, event)

        request = Request(
            request_id,
            Kind.TTS,
            priority,
            client,
            0.0,
            prompt_tokens=speech.phonemes,
            deadline_s=deadline_s,
        )
        admission = service.device.submit(
            request, lambda: service.engine.add(request_id, speech), sink
        )
        if not admission.accepted:
            service.telemetry.refuse(priority)
            raise Refused(admission)
        live[request_id] = done
        return done

    async def produce() -> None:
        try:
            async for sentence in source:
                await slots.acquire()
                order.put_nowait(submit(sentence))
            order.put_nowait(None)
        except Exception as err:  # handed to the consumer, which raises it in order
            order.put_nowait(err)

    producer = asyncio.create_task(produce())
    outcome = "cancelled"
    try:
        while (item := await order.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            event = await item
            slots.release()
            if not isinstance(event, AudioEvent):
                reason = str(event.finish_reason)
                if reason.startswith("deadline"):
                    raise Expired(reason)
                raise Cancelled(f"speech synthesis {reason}")
            live.pop(event.request_id, None)
            service.telemetry.token(record, service.device.clock())
            yield event
        outcome = "finished"
    finally:
        producer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await producer
        for request_id in live:  # the caller went away, or a sentence failed
            service.device.cancel(request_id)
        service.telemetry.finish(record, service.device.clock(), outcome=outcome)


def _resolve(future: asyncio.Future[Any], event: Any) -> None:
    if not future.done():
        future.set_result(event)
