"""A local stand-in for a Hugging Face hub: the endpoints huggingface_hub reads to find and
download a file, over real HTTP on 127.0.0.1 (`HF_ENDPOINT` or `endpoint=` points at it).

- `HEAD|GET /{owner}/{repo}/resolve/{revision}/{path}`: the file, with the headers the hub
  sends (X-Repo-Commit, ETag and X-Linked-Etag holding the sha256 of a large file,
  X-Linked-Size, Accept-Ranges) and Range requests answered 206;
- `GET /api/models/{owner}/{repo}/tree/{revision}`: the repository's files.

Faults a test can ask for: `cut_after` (the next download sends that many bytes of the body
and drops the connection), `corrupt` (the body differs from the sha256 the headers give),
`slow` (the body in 64 KiB pieces 20 ms apart, so a test can stop a pull half-way).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class Hub:
    """The files the stand-in serves, by repository, and what it was asked."""

    files: dict[str, dict[str, Path]] = field(default_factory=dict)  # repo -> path -> file
    cut_after: int | None = None
    corrupt: bool = False
    slow: bool = False
    downloads: list[tuple[str, str | None]] = field(default_factory=list)  # (path, Range)
    _server: ThreadingHTTPServer | None = None

    def add(self, repo: str, name: str, path: Path) -> str:
        """Serve a file; returns its sha256."""
        self.files.setdefault(repo, {})[name] = path
        return hashlib.sha256(path.read_bytes()).hexdigest()

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> Hub:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_HEAD(self) -> None:
                self._file(body=False)

            def do_GET(self) -> None:
                if match := re.match(r"^/api/models/([^/]+/[^/]+)/tree/[^/?]+", self.path):
                    listing = [{"type": "file", "path": name, "size": path.stat().st_size,
                                "oid": "0" * 40}
                               for name, path in hub.files.get(match[1], {}).items()]
                    self._send(200, json.dumps(listing).encode(),
                               {"Content-Type": "application/json"})
                    return
                self._file(body=True)

            def _file(self, body: bool) -> None:
                match = re.match(r"^/([^/]+/[^/]+)/resolve/[^/]+/(.+?)(\?.*)?$", self.path)
                path = hub.files.get(match[1], {}).get(match[2]) if match else None
                if path is None:
                    self._send(404, b"Entry not found", {"X-Error-Code": "EntryNotFound"})
                    return
                data = path.read_bytes()
                sha = hashlib.sha256(data).hexdigest()
                if hub.corrupt:
                    data = bytes(b ^ 0xFF for b in data[:64]) + data[64:]
                headers = {"X-Repo-Commit": COMMIT, "ETag": f'"{sha}"',
                           "X-Linked-Etag": f'"{sha}"', "X-Linked-Size": str(len(data)),
                           "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
                start = 0
                wanted = self.headers.get("Range")
                if wanted and (r := re.match(r"bytes=(\d+)-", wanted)):
                    start = int(r[1])
                if not body:
                    self._send(200, b"", {**headers, "Content-Length": str(len(data))},
                               write=False)
                    return
                hub.downloads.append((match[2], wanted))  # type: ignore[index]
                status = 206 if start else 200
                if start:
                    headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
                part = data[start:]
                self.send_response(status)
                for key, value in {**headers, "Content-Length": str(len(part))}.items():
                    self.send_header(key, value)
                self.end_headers()
                if hub.cut_after is not None:
                    cut, hub.cut_after = hub.cut_after, None
                    self.wfile.write(part[:cut])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                if hub.slow:
                    for at in range(0, len(part), 65536):
                        self.wfile.write(part[at : at + 65536])
                        self.wfile.flush()
                        time.sleep(0.02)
                    return
                self.wfile.write(part)

            def _send(self, status: int, data: bytes, headers: dict[str, str],
                      write: bool = True) -> None:
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                if "Content-Length" not in headers:
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if write:
                    self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.shutdown()
        self._server.server_close()
