"""The scheduler's promises on the real server (review of the scheduler, issue 11): a request
that can never fit is refused with a 400 that says why, and voice and chat are answered while
large background work runs; a request with a deadline fails fast instead of waiting on."""

from __future__ import annotations

import threading

import openai
import pytest

from fairlane.policy import Kind, Priority
from fairlane.server import BackgroundServer
from tests.server.conftest import TOKEN, server_config
from tests.server.test_chat_api import http
from tests.server.test_ordering import MANUAL
from tests.server.test_speech import FIXTURES, client


def _prompt(server: BackgroundServer, words: int) -> str:
    return "Summarise this manual for the family:\n" + " ".join((MANUAL * 200).split()[:words])


def _tokens(server: BackgroundServer, text: str) -> int:
    return len(server.services.engine.tokenize(text))


@pytest.mark.model
def test_a_background_prompt_beyond_its_share_is_refused_with_a_reason_and_voice_is_served(
) -> None:
    """The review's stop: a background prompt inside the context but beyond what fits beside
    the prefix cache and the KV watermark. It gets a 400 that says why; a spoken command and
    a chat turn right after it are answered."""
    with BackgroundServer(server_config()) as server:  # n_ctx 4096: 3072 positions shared
        background_share = server.services.device.policy.capacity_tokens(Priority.BACKGROUND)
        assert background_share == 2752
        text = _prompt(server, 2100)
        assert background_share < _tokens(server, text) + 20 < 3072
        status, reply = http(server, "POST", "/v1/chat/completions", {
            "messages": [{"role": "user", "content": text}], "max_tokens": 8,
            "fairlane_class": "background"})
        assert status == 400
        assert "2752" in reply["error"]["message"] and "background" in reply["error"]["message"]
        # The same prompt from a person fits: interactive work may use the whole share.
        status, _ = http(server, "POST", "/v1/chat/completions", {
            "messages": [{"role": "user", "content": text}], "max_tokens": 2})
        assert status == 200
        heard = client(server).audio.transcriptions.create(
            model="whisper", file=(FIXTURES / "command-00.wav").open("rb"))
        assert heard.text
        status, reply = http(server, "POST", "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 3})
        assert status == 200 and reply["choices"][0]["message"]["content"]


@pytest.mark.model
def test_voice_and_chat_go_ahead_of_a_large_background_turn() -> None:
    """A background turn of ~2,000 prompt tokens runs; a spoken command and a chat turn sent
    after its prefill began both finish before it does."""
    with BackgroundServer(server_config()) as server:
        device = server.services.device
        api = openai.OpenAI(base_url=f"{server.url}/v1", api_key=TOKEN, max_retries=0)
        done: dict[str, str] = {}

        def background() -> None:
            reply = api.chat.completions.create(
                model="x", messages=[{"role": "user", "content": _prompt(server, 1500)}],
                max_tokens=4, extra_body={"fairlane_class": "background"})
            done["background"] = reply.id

        thread = threading.Thread(target=background)
        thread.start()
        while not any(Priority.BACKGROUND in r.classes for r in list(device.records)):
            thread.join(timeout=0.01)
        heard = client(server).audio.transcriptions.create(
            model="whisper", file=(FIXTURES / "command-01.wav").open("rb"))
        chat = api.chat.completions.create(
            model="x", messages=[{"role": "user", "content": "Say hello."}], max_tokens=3)
        thread.join(timeout=600)
        records = list(device.records)
        background_end = max(r.end for r in records if done["background"] in r.request_ids)
        chat_end = max(r.end for r in records if chat.id in r.request_ids)
        stt_end = max(r.end for r in records if r.kind is Kind.STT)
        assert heard.text and stt_end < chat_end < background_end


@pytest.mark.model
def test_a_request_that_cannot_meet_its_deadline_fails_fast() -> None:
    with BackgroundServer(server_config()) as server:
        # One millisecond is less than any prefill: refused at once, and retrying may work.
        status, reply = http(server, "POST", "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "Say hello."}], "deadline_ms": 1})
        assert status == 429 and reply["error"]["code"] == "refused"
        assert "1 ms deadline" in reply["error"]["message"]
        status, reply = http(server, "POST", "/v1/chat/completions",
                             {"messages": [{"role": "user", "content": "Say hello."}]},
                             headers={"X-Fairlane-Deadline-Ms": "soon"})
        assert status == 400 and reply["error"]["param"] == "deadline_ms"
        status, reply = http(server, "POST", "/v1/embeddings",
                             {"input": ["a household note"], "deadline_ms": 0.5,
                              "fairlane_class": "chat"})
        assert status == 400 and "deadline_ms" in reply["error"]["message"]
        status, reply = http(server, "POST", "/v1/chat/completions",
                             {"messages": [{"role": "user", "content": "Say hi."}],
                              "max_tokens": 2},
                             headers={"X-Fairlane-Deadline-Ms": "600000"})
        assert status == 200
