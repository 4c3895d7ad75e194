"""The scheduler review's scenario on `fairlane serve` with the default config: one large
background prompt, then 8 s later a spoken command and a chat turn; once with a prompt beyond
what a background request may hold (~5,650 tokens: a 400 that says why), once with one that
fits (~5,000 tokens: it runs while voice and chat are answered).

    .venv/bin/python scripts/large-background-scenario.py [FAIRLANE] [WAV]
"""

import json
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

URL = "http://127.0.0.1:8855"
TOKEN = "scenario"
MANUAL = (
    "The dishwasher has three programmes. Eco washes at 45 degrees and takes three hours; "
    "Quick washes at 55 degrees in forty minutes; Intensive reaches 70 degrees for pans. "
)


def post(path, body, headers=None, raw=None, ctype="application/json"):
    data = raw if raw is not None else json.dumps(body).encode()
    req = urllib.request.Request(URL + path, data=data, method="POST")
    req.add_header("Authorization", f"Bearer {TOKEN}")
    req.add_header("Content-Type", ctype)
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            out = r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        out = e.code, json.loads(e.read())
    return out + (time.monotonic() - t0,)


def wav_form(path):
    b = uuid.uuid4().hex
    body = (
        (
            f'--{b}\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
            f"Content-Type: audio/wav\r\n\r\n"
        ).encode()
        + Path(path).read_bytes()
        + f"\r\n--{b}--\r\n".encode()
    )
    return body, f"multipart/form-data; boundary={b}"


def prompt(words):
    return f"[{uuid.uuid4().hex}] Summarise:\n" + " ".join((MANUAL * 400).split()[:words])


FAIRLANE = sys.argv[1] if len(sys.argv) > 1 else ".venv/bin/fairlane"
WAV = sys.argv[2] if len(sys.argv) > 2 else "tests/fixtures/speech/command-00.wav"
DATA = tempfile.mkdtemp(prefix="fairlane-scenario-")
server = subprocess.Popen(
    [
        FAIRLANE,
        "serve",
        "--port",
        "8855",
        "--token",
        TOKEN,
        "--set",
        "wyoming.enabled=false",
        "--set",
        f"server.data_dir={DATA}",
    ],
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
)
try:
    for _ in range(300):
        try:
            urllib.request.urlopen(URL + "/health", timeout=1)
            break
        except Exception:
            time.sleep(0.5)
    for words, label in ((3820, "~5,650 tokens"), (3350, "~5,000 tokens")):
        results: dict[str, tuple] = {}
        body = {
            "messages": [{"role": "user", "content": prompt(words)}],
            "max_tokens": 32,
            "fairlane_class": "background",
        }

        def background(body: dict = body, results: dict = results) -> None:
            results["background"] = post("/v1/chat/completions", body)

        th = threading.Thread(target=background)
        th.start()
        time.sleep(8)
        form, ctype = wav_form(WAV)
        results["voice"] = post("/v1/audio/transcriptions", None, raw=form, ctype=ctype)
        results["chat"] = post(
            "/v1/chat/completions",
            {
                "messages": [{"role": "user", "content": f"[{uuid.uuid4().hex}] Say hello."}],
                "max_tokens": 8,
            },
        )
        th.join()
        print(label)
        for k in ("background", "voice", "chat"):
            status, body, secs = results[k]
            msg = (
                body.get("error", {}).get("message")
                if status != 200
                else (body.get("text") or body["choices"][0]["message"]["content"])
            )
            print(f"  {k}: HTTP {status} in {secs:.2f} s: {str(msg)[:160]}")
finally:
    server.terminate()
    server.wait(30)
