"""What two oversized inputs cost the server in memory: its peak RSS (VmHWM) before and after.

1. 300 MB of audio over Wyoming in one utterance (1 MiB chunks).
2. A 2 MB WAV upload whose header declares 100 Hz (2.8 hours of audio; resampled to 16 kHz
   before the length check, it was 640 MB of float samples and more in between).

Starts `fairlane serve` on the default configuration with a temporary data directory (with
PYTHONPATH set, another checkout's server), prints one JSON line.

    .venv/bin/python scripts/memory-check.py
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import sys
import tempfile
import time
import urllib.error
import urllib.request
import wave
from pathlib import Path

from fairlane.bench.servers import ServerProcess, free_port


def status_mb(pid: int, key: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return round(int(line.split()[1]) / 1024, 1)
    raise KeyError(key)


def wav_upload(url: str) -> int:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(100)
        wav.writeframes(b"\1\0" * 1_000_000)
    boundary = "memory-check"
    body = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
        "Content-Type: audio/wav\r\n\r\n"
    ).encode() + buffer.getvalue() + f"\r\n--{boundary}--\r\n".encode()
    request = urllib.request.Request(
        f"{url}/v1/audio/transcriptions",
        data=body,
        method="POST",
        headers={"Content-Type": f"multipart/form-data; boundary={boundary}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=600) as response:
            return int(response.status)
    except urllib.error.HTTPError as err:
        return int(err.code)


async def wyoming_flood(port: int, megabytes: int) -> str:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    audio = {"rate": 16000, "width": 2, "channels": 1}
    writer.write(json.dumps({"type": "audio-start", "data": audio}).encode() + b"\n")
    chunk = b"\0" * (1024 * 1024)
    header = json.dumps(
        {"type": "audio-chunk", "data": audio, "payload_length": len(chunk)}
    ).encode()
    outcome = "all sent"
    try:
        for _ in range(megabytes):
            writer.write(header + b"\n" + chunk)
            await writer.drain()
        writer.write(json.dumps({"type": "audio-stop"}).encode() + b"\n")
        await writer.drain()
        async with asyncio.timeout(120):
            line = await reader.readline()
        outcome = f"all sent; first reply: {line[:80]!r}"
    except (ConnectionError, TimeoutError) as err:
        outcome = f"closed by the server ({type(err).__name__})"
        try:
            async with asyncio.timeout(5):
                line = await reader.readline()
            outcome += f"; reply: {line[:80]!r}"
        except (ConnectionError, TimeoutError):
            pass
    with contextlib.suppress(ConnectionError):
        writer.close()
        await writer.wait_closed()
    return outcome


def main() -> None:
    port, wyoming = free_port(), free_port()
    data_dir = tempfile.mkdtemp(prefix="fairlane-memory-")
    argv = [sys.executable, "-m", "fairlane", "serve", "--port", str(port)]
    argv += ["--set", f"server.data_dir={data_dir}", "--set", f"wyoming.port={wyoming}"]
    with ServerProcess(argv, port, env={**os.environ}) as server:
        pid = server.process.pid
        time.sleep(2)
        figures: dict[str, object] = {"rss_idle_mb": status_mb(pid, "VmRSS")}
        figures["peak_before_mb"] = status_mb(pid, "VmHWM")
        figures["wyoming_300mb"] = asyncio.run(wyoming_flood(wyoming, 300))
        time.sleep(1)
        figures["peak_after_wyoming_mb"] = status_mb(pid, "VmHWM")
        figures["wav_100hz_status"] = wav_upload(server.url)
        figures["peak_after_wav_mb"] = status_mb(pid, "VmHWM")
        figures["rss_end_mb"] = status_mb(pid, "VmRSS")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
