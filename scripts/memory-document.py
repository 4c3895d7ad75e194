"""What a large document costs the server in memory: RSS idle, at each indexing poll, and
after three 1 MB documents (review 39cbe61, finding 9: ~890 MB kept after the first).

Starts `fairlane serve` (speech and Wyoming off, a fresh data directory) on port 18777; extra
arguments go to it. Usage: .venv/bin/python scripts/memory-document.py
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Any

PORT = 18777
WORDS = ["the", "boiler", "manual", "says", "to", "check", "the", "pressure", "gauge", "weekly",
         "and", "bleed", "radiators", "in", "autumn"]


def main() -> int:
    data_dir = tempfile.mkdtemp(prefix="fairlane-memory-")
    server = subprocess.Popen(
        [sys.executable, "-m", "fairlane", "serve", "--port", str(PORT),
         "--set", f"server.data_dir={data_dir}", "--set", "stt.enabled=false",
         "--set", "tts.enabled=false", "--set", "wyoming.enabled=false", *sys.argv[1:]],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def rss() -> int:
        with open(f"/proc/{server.pid}/status") as status:
            return next(int(line.split()[1]) // 1024 for line in status
                        if line.startswith("VmRSS"))

    def call(path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        request = urllib.request.Request(
            f"http://127.0.0.1:{PORT}{path}", json.dumps(body).encode() if body else None,
            {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=600) as response:
            return dict(json.loads(response.read()))

    try:
        for _ in range(300):
            try:
                call("/health")
                break
            except OSError:
                time.sleep(1)
        time.sleep(3)
        print(f"idle: {rss()} MB", flush=True)
        random.seed(1)
        for n in range(3):
            text = " ".join(random.choice(WORDS) for _ in range(180_000))[:1_000_000]
            start = time.monotonic()
            document = call("/v1/documents", {"text": text, "title": f"manual {n}"})
            print(f"document {n + 1} accepted: {rss()} MB", flush=True)
            while True:
                time.sleep(2)
                found = call(f"/v1/documents/{document['id']}")
                print(f"  {time.monotonic() - start:4.0f} s: {rss()} MB, "
                      f"{found['chunks_done']}/{found['chunks_total']} chunks", flush=True)
                if found["chunks_done"] == found["chunks_total"]:
                    break
            time.sleep(5)
            print(f"document {n + 1} indexed, 5 s later: {rss()} MB", flush=True)
    finally:
        server.terminate()
        server.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
