"""Write the spoken household commands used by the speech tests (espeak-ng, 16 kHz mono WAV).

Usage: .venv/bin/python scripts/make-speech-fixtures.py   (needs Debian's espeak-ng)
The files are committed so the tests need no speech synthesizer.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import wave
from pathlib import Path

import numpy as np

from fairlane.engines.stt import decode_audio

COMMANDS = [
    "turn on the kitchen lights",
    "turn off the living room lamp",
    "set the thermostat to 21 degrees",
    "what is the weather tomorrow",
    "start the dishwasher",
    "lock the front door",
    "set a timer for 10 minutes",
    "play some music in the bedroom",
    "open the garage door",
    "dim the hallway lights to 50 percent",
]
OUT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "speech"


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    index = {}
    for number, text in enumerate(COMMANDS):
        with tempfile.NamedTemporaryFile(suffix=".wav") as raw:
            subprocess.run(["espeak-ng", "-v", "en-us", "-s", "150", "-w", raw.name, text],
                           check=True)
            audio = decode_audio(Path(raw.name).read_bytes())
        name = f"command-{number:02d}.wav"
        with wave.open(str(OUT / name), "wb") as wav:
            wav.setnchannels(1)
            wav.setsampwidth(2)
            wav.setframerate(16000)
            wav.writeframes((np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes())
        index[name] = text
    (OUT / "commands.json").write_text(json.dumps(index, indent=2) + "\n")


if __name__ == "__main__":
    main()
