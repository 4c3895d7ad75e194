"""A stand-in for a priority-scheduling engine (vLLM, SGLang) that records what it was sent:
an OpenAI-compatible `/v1/chat/completions` that streams a short fixed reply. Only for what a
real engine cannot show here (neither runs on this CPU): which `priority` field each request
carried. Everything else about the remote lane is tested against llama.cpp's own server."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

from aiohttp import web


class RecordingEngine:
    """Started in a thread of its own; `bodies`: every request's JSON, in arrival order."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self.port = 0

    def __enter__(self) -> RecordingEngine:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        runner = web.AppRunner(app)
        self._loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(runner.cleanup())

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        self.headers.append(dict(request.headers))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for piece, finish in (("Done", None), (".", "stop")):
            chunk = {"object": "chat.completion.chunk", "model": "standin",
                     "choices": [{"index": 0, "delta": {"content": piece},
                                  "finish_reason": finish}]}
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        return response
