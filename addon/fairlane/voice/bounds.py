"""What one Wyoming connection may bring (fairlane.voice.wyoming serves it): who may connect,
each event's size, audio of a format a microphone has, and how a refusal is logged.

The wyoming package's own reader drops a malformed or oversized event silently and leaves the
client waiting; `read_event` says what was wrong (BadEvent), and the connection is closed.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import time
from typing import Any

import numpy as np
from wyoming.audio import AudioChunk
from wyoming.event import Event

# Refusals are the Wyoming server's to log: under its name, where a user looks for them.
_LOGGER = logging.getLogger("fairlane.voice.wyoming")

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def networks(texts: tuple[str, ...]) -> tuple[Network, ...]:
    return tuple(ipaddress.ip_network(text, strict=False) for text in texts)


def client_allowed(peer: Any, clients: tuple[Network, ...]) -> bool:
    """Whether a connection from `peer` (a socket's peername) may use the server."""
    if not clients:
        return True
    try:
        address = ipaddress.ip_address(peer[0])
    except (TypeError, IndexError, ValueError):
        return False
    return any(address in network for network in clients)


def beyond_loopback(host: str) -> bool:
    """Whether a server bound to `host` can be reached from other machines."""
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host != "localhost"  # a name, or "" / "0.0.0.0"-like: assume it is reachable


class BadEvent(Exception):
    """A client sent something that is not a Wyoming event, or one over a bound."""


class NotReading(Exception):
    """A client left the server's output unread for longer than the idle timeout."""


MAX_LINE_BYTES = 64 * 1024  # asyncio's StreamReader refuses longer header lines
MAX_DATA_BYTES = 64 * 1024
MAX_PAYLOAD_BYTES = 1024 * 1024
WRITE_BUFFER_BYTES = 64 * 1024  # output queued in the server before a write waits
SEND_BUFFER_BYTES = 256 * 1024  # the kernel's share (SO_SNDBUF; Linux autotunes to MBs)
REFUSAL_LOG_S = 60.0  # each kind of refusal from one address is logged at most this often
MAX_TEXT_CHARS = 100_000  # a streamed synthesis's text
RATES = range(8_000, 96_001)  # the sample rates of real microphones, in Hz
WIDTHS = (1, 2, 4)  # bytes per sample
MAX_CHANNELS = 8
FIRST_EVENT_S = 5.0  # a real client speaks at once (describe, transcribe, synthesize…)


async def read_event(reader: asyncio.StreamReader) -> Event | None:
    """The next event, None at the end of the stream; BadEvent for anything malformed or over
    a bound (the library's own reader drops those silently and leaves the client waiting)."""
    try:
        line = await reader.readline()
    except ValueError as err:  # longer than the reader's limit
        raise BadEvent(f"an event header longer than {MAX_LINE_BYTES} bytes") from err
    if not line:
        return None
    try:
        header = json.loads(line)
    except ValueError as err:
        raise BadEvent("an event header that is not JSON") from err
    if not isinstance(header, dict) or not isinstance(header.get("type"), str):
        raise BadEvent("an event header without a type")
    data = header.get("data") or {}
    if not isinstance(data, dict):
        raise BadEvent("event data that is not an object")
    try:
        more = _length(header, "data_length", MAX_DATA_BYTES)
        if more:
            extra = json.loads(await reader.readexactly(more))
            if not isinstance(extra, dict):
                raise BadEvent("event data that is not an object")
            data.update(extra)
        size = _length(header, "payload_length", MAX_PAYLOAD_BYTES)
        payload = await reader.readexactly(size) if size else None
    except asyncio.IncompleteReadError:
        return None  # the client went away mid-event
    except ValueError as err:
        raise BadEvent("event data that is not JSON") from err
    return Event(type=header["type"], data=data, payload=payload)


def _length(header: dict[str, Any], key: str, limit: int) -> int:
    value = header.get(key)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= limit:
        raise BadEvent(f"{key} must be a whole number of bytes up to {limit}")
    return value


SAMPLE_TYPES: dict[int, Any] = {1: np.int8, 2: np.dtype("<i2"), 4: np.dtype("<i4")}  # audioop's


def mono(chunk: AudioChunk) -> AudioChunk:
    """The chunk with its channels averaged into one, at its own rate and width. (audioop's
    tomono, which the converter uses, reads any count as two channels: 4- and 8-channel
    microphones were transcribed as noise.)"""
    if chunk.channels == 1:
        return chunk
    samples = np.frombuffer(chunk.audio, SAMPLE_TYPES[chunk.width])
    frames = samples.reshape(-1, chunk.channels).mean(axis=1, dtype=np.float64)
    audio = np.round(frames).astype(SAMPLE_TYPES[chunk.width]).tobytes()
    return AudioChunk(chunk.rate, chunk.width, 1, audio, timestamp=chunk.timestamp)


class Refusals:
    """Refused connections in the log, each kind from each address at most once a minute (a
    flood from one satellite is one line a minute, with how many were refused since)."""

    def __init__(self, every_s: float = REFUSAL_LOG_S) -> None:
        self.every_s = every_s
        self._last: dict[tuple[str, str], float] = {}
        self._since: dict[tuple[str, str], int] = {}

    def note(self, peer: str, code: str, text: str) -> None:
        key = (peer, code)
        now = time.monotonic()
        if now - self._last.get(key, -self.every_s) < self.every_s:
            self._since[key] = self._since.get(key, 0) + 1
            return
        more = self._since.pop(key, 0)
        self._last[key] = now
        _LOGGER.warning(
            "Wyoming refused %s (%s): %s%s", peer, code, text,
            f" ({more} more since the last line)" if more else "",
        )
        if len(self._last) > 4096:  # many addresses: forget the oldest
            oldest = min(self._last, key=self._last.__getitem__)
            self._last.pop(oldest)
            self._since.pop(oldest, None)


def check_format(rate: Any, width: Any, channels: Any) -> None:
    """BadEvent unless the audio's format is one a microphone has."""
    if not (isinstance(rate, int) and rate in RATES):
        raise BadEvent(f"a sample rate of {RATES.start}-{RATES.stop - 1} Hz, not {rate!r}")
    if width not in WIDTHS:
        raise BadEvent(f"a sample width of 1, 2 or 4 bytes, not {width!r}")
    if not (isinstance(channels, int) and 1 <= channels <= MAX_CHANNELS):
        raise BadEvent(f"1-{MAX_CHANNELS} channels, not {channels!r}")
