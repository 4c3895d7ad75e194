"""What the device ran while a voice reply was written under background load: a step trace.

Usage: .venv/bin/python scripts/voice-turn-trace.py [REPLY_TOKENS]

An in-process server (default models, 8,192-token context). A voice turn with Home Assistant's
shape (a ~1,750-token system prompt of 40 exposed lights and ten tool schemas, cached after a
warm-up) runs idle, then again while two 1,100-token summaries run as a closed loop and
64-text embedding batches are indexed, all `background`. Prints both turns' times and usage,
then every device step from the loaded turn's arrival: start, duration, predicted duration,
engine, classes, prefill tokens and decodes. Not a benchmark of the voice: a way to see what
fills the gaps between its tokens.
"""

from __future__ import annotations

import json
import sys
import tempfile
import threading
import time
import urllib.request
import uuid

from fairlane import config
from fairlane.server import BackgroundServer

TOKEN = "trace"
NOTE = "The boiler was serviced in March and the filter replaced; the invoice is in the drawer. "
SYSTEM = "You are a voice assistant for Home Assistant.\nAnswer in plain text.\n" + "".join(
    f"- names: Lamp {i}\n  domain: light\n  areas: Room {i}\n" for i in range(40)
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": f"Hass{name}",
            "description": f"Does {name} to a device or an area",
            "parameters": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "area": {"type": "string"},
                    "domain": {"type": "array", "items": {"type": "string"}},
                },
            },
        },
    }
    for name in (
        "TurnOn",
        "TurnOff",
        "Toggle",
        "SetPosition",
        "LightSet",
        "GetState",
        "CancelTimer",
        "StartTimer",
        "MediaPause",
        "ClimateSetTemperature",
    )
]


def post(url: str, path: str, body: dict) -> dict:
    request = urllib.request.Request(
        url + path,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"},
    )
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.loads(response.read())


def voice_turn(url: str, ask: str, tokens: int) -> tuple[float, float, dict]:
    sent = time.monotonic()
    body = {
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": ask}],
        "tools": TOOLS,
        "max_tokens": tokens,
        "fairlane_class": "voice",
        "user": "parent",
    }
    answer = post(url, "/v1/chat/completions", body)
    return time.monotonic() - sent, sent, answer["usage"]


def main() -> None:
    tokens = int(sys.argv[1]) if len(sys.argv) > 1 else 24
    cfg = config.parse(
        {
            "server": {"port": 0, "token": TOKEN, "data_dir": tempfile.mkdtemp()},
            "wyoming": {"enabled": False},
            "llm": {"n_ctx": 8192},
        }
    )
    stop = threading.Event()
    with BackgroundServer(cfg) as server:
        url = server.url

        def summaries() -> None:
            while not stop.is_set():
                prompt = f"{uuid.uuid4().hex} Summarise:\n" + NOTE * 40
                post(
                    url,
                    "/v1/chat/completions",
                    {
                        "messages": [{"role": "user", "content": prompt}],
                        "max_tokens": 64,
                        "fairlane_class": "background",
                        "user": "summaries",
                    },
                )

        def documents() -> None:
            while not stop.is_set():
                texts = [uuid.uuid4().hex + NOTE * 3 for _ in range(64)]
                post(
                    url,
                    "/v1/embeddings",
                    {
                        "input": texts,
                        "model": "x",
                        "fairlane_class": "background",
                        "user": "documents",
                    },
                )

        voice_turn(url, "hello", tokens)  # warm-up: the system prompt is cached from now on
        idle, _, usage = voice_turn(url, "turn on lamp 3", tokens)
        print(f"idle:   {idle:.2f} s, usage {usage}")
        for target in (summaries, summaries, documents):
            threading.Thread(target=target, daemon=True).start()
        time.sleep(5)
        loaded, sent, usage = voice_turn(url, "turn off lamp 5", tokens)
        print(f"loaded: {loaded:.2f} s, usage {usage}")
        print("\n  start  secs   pred  engine classes              prefill decodes")
        for r in [r for r in server.services.device.records if r.end >= sent][:80]:
            classes = ",".join(sorted({p.label for p in r.classes}))
            print(
                f"{r.start - sent:7.2f} {r.end - r.start:5.3f} {r.predicted_s:6.3f}  "
                f"{r.kind.value:6} {classes:20} {r.prefill_tokens:7} {r.decode_seqs:7}"
            )
        stop.set()


if __name__ == "__main__":
    main()
