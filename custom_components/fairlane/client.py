"""An async client for the Fairlane server's HTTP API; HTTP errors are mapped here, once."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from yarl import URL

from .const import MODEL_TIMEOUT, REQUEST_TIMEOUT


class FairlaneError(Exception):
    """The server could not do what was asked."""


class FairlaneConnectionError(FairlaneError):
    """The server is unreachable, timed out or answered with a server error."""


class FairlaneAuthError(FairlaneError):
    """The server refused the token."""


class FairlaneProtocolError(FairlaneConnectionError):
    """The server answered with something that is not the Fairlane API's shape."""


class FairlaneRequestError(FairlaneError):
    """The server refused the request (4xx); the message is the server's own."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class ServerInfo:
    """What `/health` says about the server."""

    version: str
    policy: str
    llm_model: str
    stt_model: str | None
    wyoming_port: int | None
    tts_voice: str | None = None
    # A UUID kept in the server's data directory (older servers publish none).
    instance_id: str | None = None
    features: tuple[str, ...] = ()  # what it takes beyond the OpenAI API (older servers: none)

    @classmethod
    def from_health(cls, body: Any) -> ServerInfo:
        if not isinstance(body, Mapping) or not isinstance(body.get("models"), Mapping):
            raise FairlaneProtocolError("the answer to /health is not a Fairlane server's")
        models = body["models"]

        def text(value: Any) -> str | None:
            return str(value) if isinstance(value, str | int) and value != "" else None

        port = body.get("wyoming_port")
        features = body.get("features")
        return cls(
            version=str(body.get("version", "0")),
            policy=str(body.get("policy", "")),
            llm_model=text(models.get("llm")) or "",
            stt_model=text(models.get("stt")),
            wyoming_port=port if isinstance(port, int) else None,
            tts_voice=text(models.get("tts")),
            instance_id=text(body.get("instance_id")),
            features=tuple(f for f in features if isinstance(f, str))
            if isinstance(features, list)
            else (),
        )


def parse_host(text: str) -> tuple[str, int | None]:
    """A host as people paste it (`nas.local`, `192.168.1.5:8844`, `http://nas.local:8844/`,
    `[fd00::5]`) → the host name and the port it named, if any. ValueError if it is not one."""
    text = text.strip()
    try:
        url = URL(text if "://" in text else f"http://{text}")
        host = url.host
        if url.scheme != "http" or not host or url.path not in ("", "/") or url.query_string:
            raise ValueError(text)
        URL.build(scheme="http", host=host)  # refuses what is not a host name or address
    except (ValueError, TypeError) as err:
        raise ValueError(f"not a host name or address: {text!r}") from err
    return host, url.explicit_port


class FairlaneClient:
    """One Fairlane server: host, port and bearer token over Home Assistant's shared session."""

    def __init__(
        self, session: aiohttp.ClientSession, host: str, port: int, token: str | None
    ) -> None:
        self._session = session
        self.base = URL.build(scheme="http", host=host, port=port)
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}

    # --- server state ---------------------------------------------------------------------

    async def health(self) -> ServerInfo:
        """`/health` needs no token: it proves the server is there."""
        return ServerInfo.from_health(await self._json("GET", "/health"))

    async def stats(self) -> dict[str, Any]:
        """`/v1/stats`: per-class latencies, queues, device use; needs the token."""
        return await self._json("GET", "/v1/stats")

    # --- model work -----------------------------------------------------------------------

    async def chat_stream(self, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """Stream a chat completion: yields each OpenAI `chat.completion.chunk` object.

        The server sends server-sent events:
            data: {"choices": [{"index": 0, "delta": {"content": "Pa"}, ...}], ...}
            data: {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], ...}
            data: [DONE]
        """
        timeout = aiohttp.ClientTimeout(total=MODEL_TIMEOUT, sock_read=MODEL_TIMEOUT)
        try:
            async with self._session.post(
                self.base / "v1/chat/completions",
                json={**body, "stream": True},
                headers=self._headers,
                timeout=timeout,
            ) as response:
                await _raise_for_status(response)
                async for raw in response.content:
                    line = raw.decode().strip()
                    if not line.startswith("data:"):
                        continue
                    data = line.removeprefix("data:").strip()
                    if data == "[DONE]":
                        return
                    try:
                        chunk = json.loads(data)
                    except ValueError as err:
                        raise FairlaneProtocolError(f"malformed stream data: {data[:80]}") from err
                    if not isinstance(chunk, dict):
                        raise FairlaneProtocolError(f"malformed stream data: {data[:80]}")
                    if "error" in chunk:
                        error = chunk["error"]
                        message = error.get("message") if isinstance(error, dict) else error
                        raise FairlaneError(str(message or "the stream failed"))
                    yield chunk
        except (aiohttp.ClientError, TimeoutError) as err:
            raise FairlaneConnectionError(f"chat stream failed: {err}") from err

    async def guess(self, body: dict[str, Any]) -> str:
        """Begin a chat turn on a guess of it (`fairlane_speculative`): the server holds its
        tokens for the same turn sent for real. Returns the guess's id."""
        body = {**body, "stream": False, "fairlane_speculative": True}
        answer = await self._json("POST", "/v1/chat/completions", json=body)
        return str(answer.get("id", ""))

    async def cancel(self, completion_id: str) -> None:
        """Cancel a running completion or a held guess (its KV is freed)."""
        await self._json("POST", f"/v1/chat/completions/{completion_id}/cancel")

    async def transcribe(
        self,
        audio: bytes,
        *,
        language: str | None,
        sample_rate: int = 16000,
        fairlane_class: str = "voice",
        user: str | None = None,
    ) -> str:
        """Transcribe a WAV file (starts with RIFF) or raw 16-bit mono PCM at `sample_rate`."""
        form = aiohttp.FormData()
        if audio.startswith(b"RIFF"):
            form.add_field("file", audio, filename="audio.wav", content_type="audio/wav")
        else:
            form.add_field("file", audio, filename="audio.pcm", content_type="audio/pcm")
            form.add_field("sample_rate", str(sample_rate))
        if language:
            form.add_field("language", language)
        if user:
            form.add_field("user", user)
        form.add_field("fairlane_class", fairlane_class)
        body = await self._json(
            "POST", "/v1/audio/transcriptions", data=form, timeout=MODEL_TIMEOUT
        )
        if not isinstance(body.get("text"), str):
            raise FairlaneProtocolError("the transcription has no text")
        return str(body["text"])

    # --- documents and summaries ----------------------------------------------------------

    async def speak(
        self, text: str, *, voice: str | None = None, fairlane_class: str = "voice"
    ) -> bytes:
        """The text spoken by the server's voice, as a WAV file."""
        body: dict[str, Any] = {
            "input": text,
            "response_format": "wav",
            "fairlane_class": fairlane_class,
        }
        if voice:
            body["voice"] = voice
        try:
            async with self._session.post(
                self.base / "v1/audio/speech",
                json=body,
                headers=self._headers,
                timeout=aiohttp.ClientTimeout(total=MODEL_TIMEOUT),
            ) as response:
                await _raise_for_status(response)
                return await response.read()
        except (aiohttp.ClientError, TimeoutError) as err:
            raise FairlaneConnectionError(f"speech failed: {err}") from err

    async def add_document(
        self, data: bytes, filename: str, content_type: str, source: str | None = None
    ) -> dict[str, Any]:
        """Upload one file; the server stores it before answering and indexes it later."""
        form = aiohttp.FormData()
        form.add_field("file", data, filename=filename, content_type=content_type)
        form.add_field("content_type", content_type)
        if source:
            form.add_field("source", source)
        return await self._json("POST", "/v1/documents", data=form, timeout=MODEL_TIMEOUT)

    async def documents(self) -> list[dict[str, Any]]:
        """Every stored document with its indexing status."""
        return _list_of_dicts(await self._json("GET", "/v1/documents"), "documents")

    async def search(self, query: str, top_k: int, fairlane_class: str) -> list[dict[str, Any]]:
        """The passages that best answer `query`: document_id, title, seq, score, text."""
        body = {"query": query, "top_k": top_k, "fairlane_class": fairlane_class}
        answer = await self._json("POST", "/v1/documents/search", json=body, timeout=MODEL_TIMEOUT)
        return _list_of_dicts(answer, "search results")

    async def add_summary(self, body: dict[str, Any]) -> dict[str, Any]:
        return await self._json("POST", "/v1/summaries", json=body)

    async def summary(self, summary_id: str) -> dict[str, Any]:
        return await self._json("GET", f"/v1/summaries/{summary_id}")

    # --- models -----------------------------------------------------------------------------

    async def catalogue(self) -> list[dict[str, Any]]:
        """The server's model catalogue: each with `here` (pulled) and `fits` (this machine)."""
        return _list_of_dicts(await self._json("GET", "/v1/models/catalogue"), "models")

    async def pull(self, model: str) -> dict[str, Any]:
        """Start (or join) the server's pull of a model: the job."""
        return await self._json("POST", "/v1/models/pull", json={"model": model})

    async def pull_status(self, job_id: str) -> dict[str, Any]:
        return await self._json("GET", f"/v1/models/pull/{job_id}")

    # --- the one place HTTP turns into exceptions ------------------------------------------

    async def _json(
        self, method: str, path: str, *, timeout: float = REQUEST_TIMEOUT, **kwargs: Any
    ) -> dict[str, Any]:
        try:
            async with self._session.request(
                method,
                self.base.join(URL(path)),
                headers=self._headers,
                timeout=aiohttp.ClientTimeout(total=timeout),
                **kwargs,
            ) as response:
                await _raise_for_status(response)
                result = await response.json()
        except (aiohttp.ClientError, TimeoutError) as err:
            raise FairlaneConnectionError(f"{method} {path} failed: {err}") from err
        except ValueError as err:  # a body that is not JSON
            raise FairlaneProtocolError(f"{method} {path}: the answer is not JSON") from err
        if not isinstance(result, dict):
            raise FairlaneProtocolError(f"{method} {path}: the answer is not a JSON object")
        return result


def _list_of_dicts(answer: dict[str, Any], what: str) -> list[dict[str, Any]]:
    data = answer.get("data")
    if not isinstance(data, list) or not all(isinstance(item, dict) for item in data):
        raise FairlaneProtocolError(f"the server's {what} are not a list of objects")
    return data


async def _raise_for_status(response: aiohttp.ClientResponse) -> None:
    if response.status < 400:
        return
    try:
        message = (await response.json())["error"]["message"]
    except (aiohttp.ContentTypeError, json.JSONDecodeError, KeyError, TypeError):
        message = (await response.text())[:200] or response.reason or "error"
    if response.status in (401, 403):
        raise FairlaneAuthError(message)
    if response.status >= 500:
        raise FairlaneConnectionError(f"server error {response.status}: {message}")
    raise FairlaneRequestError(response.status, message)
