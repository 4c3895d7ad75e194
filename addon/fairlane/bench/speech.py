"""`fairlane bench speech`: the speech lane against faster-whisper called directly.

For each packaged Whisper model: one utterance at a time through the server ÷ the same
utterance through `WhisperModel.transcribe` in this process, configured as the server decodes
(greedy, no timestamps, no temperature fallback: like for like), which is the overhead of HTTP,
the queue and the device loop; four utterances sent together to the server (one batched
step) against four transcribed one after another (what wyoming-faster-whisper does); and the
WER of the server's transcripts on the spoken household commands.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

from fairlane.bench.servers import fairlane_server, post_transcription
from fairlane.engines import models
from fairlane.engines.stt import decode_audio
from fairlane.runtime.metrics import percentile, word_error_rate

MODELS = ("whisper-tiny.en", "whisper-base")
# The server runs one greedy `generate()` without timestamps; `transcribe()` configured the same.
LIKE_THE_SERVER: dict[str, Any] = {
    "beam_size": 1,
    "language": "en",
    "without_timestamps": True,
    "temperature": 0.0,
    "condition_on_previous_text": False,
}


def _together(url: str, files: list[bytes]) -> list[float]:
    """Send the files at the same moment; each one's latency."""
    latency: list[float] = []

    def send(audio: bytes) -> None:
        start = time.perf_counter()
        post_transcription(url, audio, {"language": "en"})
        latency.append(time.perf_counter() - start)

    senders = [threading.Thread(target=send, args=(audio,)) for audio in files]
    for sender in senders:
        sender.start()
    for sender in senders:
        sender.join()
    return latency


def speech(fixtures: Path, threads: int, rounds: int = 3) -> list[dict[str, Any]]:
    from faster_whisper import WhisperModel

    commands: dict[str, str] = json.loads((fixtures / "commands.json").read_text())
    names = sorted(commands)
    files = {name: (fixtures / name).read_bytes() for name in names}
    rows: list[dict[str, Any]] = []
    for model_name in MODELS:
        path = models.resolve_stt(model_name)
        direct_model = WhisperModel(path, device="cpu", compute_type="int8", cpu_threads=threads)
        direct: list[float] = []
        for _ in range(rounds):
            for name in names:
                audio = decode_audio(files[name])
                start = time.perf_counter()
                segments, _ = direct_model.transcribe(audio, **LIKE_THE_SERVER)
                " ".join(s.text for s in segments)
                direct.append(time.perf_counter() - start)
        four = names[:4]
        sequential_start = time.perf_counter()
        for name in four:
            segments, _ = direct_model.transcribe(decode_audio(files[name]), **LIKE_THE_SERVER)
            " ".join(s.text for s in segments)
        sequential_s = time.perf_counter() - sequential_start
        del direct_model

        extra = {"stt": {"model": model_name, "threads": threads}, "wyoming": {"enabled": False}}
        with fairlane_server("fairlane", threads, 8, extra) as server:
            post_transcription(server.url, files[names[0]], {"language": "en"})  # warm-up
            served: list[float] = []
            texts: dict[str, str] = {}
            for _ in range(rounds):
                for name in names:
                    start = time.perf_counter()
                    texts[name] = post_transcription(server.url, files[name], {"language": "en"})[
                        "text"
                    ]
                    served.append(time.perf_counter() - start)
            batch_start = time.perf_counter()
            batch_latency = _together(server.url, [files[n] for n in four])
            batch_s = time.perf_counter() - batch_start
        row: dict[str, Any] = {
            "model": model_name,
            "direct_p50_s": percentile(direct, 50),
            "server_p50_s": percentile(served, 50),
            "overhead_ratio": (percentile(served, 50) or 0) / (percentile(direct, 50) or 1),
            "four_sequential_s": sequential_s,
            "four_together_s": batch_s,
            "four_together_max_latency_s": max(batch_latency),
            "wer": word_error_rate([commands[n] for n in names], [texts[n] for n in names]),
        }
        rows.append(row)
        print(f"  {model_name}: {row}", flush=True)
    print(f"\nspeech lane, {threads} threads, {len(names)} espeak-ng household commands")
    print(
        f"{'model':>16}{'direct p50':>12}{'server p50':>12}{'ratio':>7}"
        f"{'4 one-by-one':>14}{'4 together':>12}{'WER':>7}"
    )
    for row in rows:
        print(
            f"{row['model']:>16}{row['direct_p50_s'] * 1000:>10.0f}ms"
            f"{row['server_p50_s'] * 1000:>10.0f}ms{row['overhead_ratio']:>7.2f}"
            f"{row['four_sequential_s'] * 1000:>12.0f}ms{row['four_together_s'] * 1000:>10.0f}ms"
            f"{row['wer']:>7.3f}"
        )
    return rows
