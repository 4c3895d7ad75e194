"""Speculative chat turns on the real default model: the same turn claims the guess, any other
turn discards it, its KV is freed and its tokens reach no one."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from fairlane.config import ClientToken
from fairlane.policy import Kind
from fairlane.server import BackgroundServer
from tests.server.conftest import server_config, wait_for
from tests.server.test_chat_api import client, http

# A turn long enough to be still running when the next request comes.
COUNTING = [{"role": "user",
             "content": "Count from one to two hundred in words, separated by commas."}]
QUESTION = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]


# Two more tokens beside the server's own (which Home Assistant holds): a guest and a tablet.
GUEST, TABLET = "guest-token-123", "tablet-token-456"


@pytest.fixture(scope="module")
def server() -> Iterator[BackgroundServer]:
    cfg = server_config()
    clients = (ClientToken("guest", GUEST), ClientToken("tablet", TABLET))
    with BackgroundServer(replace(cfg, server=replace(cfg.server, clients=clients))) as running:
        yield running


def turn(messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"messages": messages, "temperature": 0, "max_tokens": 200, "user": "kitchen", **extra}


def guess(server: BackgroundServer, body: dict[str, Any]) -> str:
    status, answer = http(server, "POST", "/v1/chat/completions",
                          {**body, "fairlane_speculative": True})
    assert status == 202, answer
    assert answer["object"] == "chat.completion.guess" and answer["expires_in_s"] > 0
    return str(answer["id"])


def speculation(server: BackgroundServer) -> dict[str, int]:
    status, stats = http(server, "GET", "/v1/stats")
    assert status == 200
    return dict(stats["speculation"])


def prompts_seen(server: BackgroundServer) -> int:
    """Prompt tokens of the chat requests served since the start (not a sliding window)."""
    status, stats = http(server, "GET", "/v1/stats")
    assert status == 200
    return int(stats["classes"]["chat"]["prefix_cache"]["prompt_tokens"])


def generating(server: BackgroundServer, request_id: str) -> bool:
    """The guess's sequence holds KV and has sampled a token (it is running)."""
    seq = server.services.engine.sequences.get(request_id)
    return seq is not None and seq.seq_id is not None and seq.generated > 0


def gone(server: BackgroundServer, request_id: str) -> bool:
    """The sequence has left the engine and the scheduler: no cells, no blocks, no slot."""
    policy = server.services.device.loop_for(Kind.LLM).policy
    return (
        request_id not in server.services.engine.sequences
        and request_id not in policy.kv.held
        and request_id not in policy.running
    )


@pytest.fixture
def short_expiry(server: BackgroundServer) -> Iterator[None]:
    held = server.services.speculation
    assert held is not None
    before, held.ttl_s = held.ttl_s, 0.5
    yield
    held.ttl_s = before


def test_the_same_turn_claims_the_guess(server: BackgroundServer) -> None:
    body = turn(QUESTION, max_tokens=8)
    before = speculation(server)
    guess_id = guess(server, body)
    status, reply = http(server, "POST", "/v1/chat/completions", body)
    assert status == 200, reply
    assert reply["id"] == guess_id  # the guess's tokens are this reply
    assert "Paris" in reply["choices"][0]["message"]["content"]
    after = speculation(server)
    assert after["claimed"] == before["claimed"] + 1
    assert after["discarded"] == before["discarded"] and after["held"] == 0


def test_a_streamed_turn_claims_a_guess_still_running(server: BackgroundServer) -> None:
    body = turn(COUNTING, max_tokens=40)
    guess_id = guess(server, body)
    wait_for(lambda: generating(server, guess_id))
    stream = client(server).chat.completions.create(
        model="x", messages=body["messages"], temperature=0, max_tokens=40, user="kitchen",
        stream=True, stream_options={"include_usage": True},
    )
    ids, usage = set(), None
    for chunk in stream:
        ids.add(chunk.id)
        usage = chunk.usage or usage
    assert ids == {guess_id}
    assert usage is not None and usage.completion_tokens == 40  # every token, none lost


def test_another_turn_discards_the_guess(server: BackgroundServer) -> None:
    """The person said something else: the guess's sequence leaves with its KV, the turn that
    came gets its own reply, and nothing the guess made reaches a client."""
    wrong = turn(COUNTING)
    before = speculation(server)
    seen = prompts_seen(server)
    guess_id = guess(server, wrong)
    wait_for(lambda: generating(server, guess_id))
    status, reply = http(server, "POST", "/v1/chat/completions", turn(QUESTION, max_tokens=8))
    assert status == 200 and reply["id"] != guess_id
    assert "Paris" in reply["choices"][0]["message"]["content"]
    wait_for(lambda: gone(server, guess_id))
    after = speculation(server)
    assert after["discarded"] == before["discarded"] + 1 and after["held"] == 0
    # The guessed turn asked for now is run afresh: the discarded tokens are no one's reply.
    status, again = http(server, "POST", "/v1/chat/completions", {**wrong, "max_tokens": 4})
    assert status == 200 and again["id"] != guess_id
    # The guess is no one's request: the server saw the two turns' prompts, not its.
    asked = reply["usage"]["prompt_tokens"] + again["usage"]["prompt_tokens"]
    assert prompts_seen(server) == seen + asked


def test_a_guess_is_only_for_its_own_client(server: BackgroundServer) -> None:
    body = turn(QUESTION, max_tokens=8)
    guess_id = guess(server, body)
    status, reply = http(server, "POST", "/v1/chat/completions", {**body, "user": "bedroom"})
    assert status == 200 and reply["id"] != guess_id
    status, reply = http(server, "POST", "/v1/chat/completions", body)
    assert reply["id"] == guess_id  # still held for the kitchen


def test_a_newer_guess_replaces_the_older(server: BackgroundServer) -> None:
    before = speculation(server)
    first = guess(server, turn(COUNTING))
    wait_for(lambda: generating(server, first))
    second = guess(server, turn(QUESTION, max_tokens=8))
    wait_for(lambda: gone(server, first))
    after = speculation(server)
    assert after["discarded"] == before["discarded"] + 1 and after["held"] == 1
    status, reply = http(server, "POST", "/v1/chat/completions", turn(QUESTION, max_tokens=8))
    assert status == 200 and reply["id"] == second


@pytest.mark.usefixtures("short_expiry")
def test_an_unclaimed_guess_expires(server: BackgroundServer) -> None:
    before = speculation(server)
    guess_id = guess(server, turn(COUNTING))
    wait_for(lambda: speculation(server)["expired"] == before["expired"] + 1)
    wait_for(lambda: gone(server, guess_id))
    status, reply = http(server, "POST", "/v1/chat/completions", turn(COUNTING, max_tokens=4))
    assert status == 200 and reply["id"] != guess_id


def test_a_cancelled_guess_is_not_claimed(server: BackgroundServer) -> None:
    body = turn(COUNTING)
    guess_id = guess(server, body)
    status, answer = http(server, "POST", f"/v1/chat/completions/{guess_id}/cancel")
    assert status == 200 and answer["cancelled"] is True
    wait_for(lambda: gone(server, guess_id))
    status, reply = http(server, "POST", "/v1/chat/completions", {**body, "max_tokens": 4})
    assert status == 200 and reply["id"] != guess_id
    status, _ = http(server, "POST", f"/v1/chat/completions/{guess_id}/cancel")
    assert status == 404


def test_a_guess_must_say_true_or_false(server: BackgroundServer) -> None:
    status, answer = http(server, "POST", "/v1/chat/completions",
                          {**turn(QUESTION), "fairlane_speculative": "yes"})
    assert status == 400 and "fairlane_speculative" in answer["error"]["message"]


# --- a guess belongs to the token that made it (review 39cbe61, finding 5) -------------------


def test_another_token_naming_the_same_user_cannot_claim_the_guess(
    server: BackgroundServer,
) -> None:
    body = turn(QUESTION, max_tokens=8, user="home-assistant")
    before = speculation(server)
    guess_id = guess(server, body)
    status, reply = http(server, "POST", "/v1/chat/completions", body, token=GUEST)
    assert status == 200 and reply["id"] != guess_id  # its own turn, not Home Assistant's
    assert speculation(server)["held"] == before["held"] + 1  # nor was the guess discarded
    status, reply = http(server, "POST", "/v1/chat/completions", body)
    assert status == 200 and reply["id"] == guess_id


def test_another_tokens_turn_does_not_discard_the_guess(server: BackgroundServer) -> None:
    body = turn(QUESTION, max_tokens=8, user="home-assistant")
    before = speculation(server)
    guess_id = guess(server, body)
    other = turn(COUNTING, max_tokens=4, user="home-assistant")
    status, _ = http(server, "POST", "/v1/chat/completions", other, token=GUEST)
    assert status == 200
    status, _ = http(server, "POST", f"/v1/chat/completions/{guess_id}/cancel", token=GUEST)
    assert status == 404  # another token's guess: not the guest's to cancel
    assert speculation(server)["discarded"] == before["discarded"]
    status, reply = http(server, "POST", "/v1/chat/completions", body)
    assert status == 200 and reply["id"] == guess_id


def test_another_tokens_guesses_do_not_evict_the_guess(server: BackgroundServer) -> None:
    body = turn(QUESTION, max_tokens=8, user="home-assistant")
    held = server.services.speculation
    assert held is not None
    guess_id = guess(server, body)
    for person in range(held.limit + 2):
        status, _ = http(server, "POST", "/v1/chat/completions",
                         {**turn(QUESTION, max_tokens=1, user=f"guest-{person}"),
                          "fairlane_speculative": True}, token=TABLET)
        assert status == 202
    assert speculation(server)["held"] == held.limit + 1  # the tablet's newest, and HA's
    status, reply = http(server, "POST", "/v1/chat/completions", body)
    assert status == 200 and reply["id"] == guess_id
    for person in range(held.limit + 2):  # the tablet's guesses go
        http(server, "POST", "/v1/chat/completions",
             turn(QUESTION, max_tokens=1, user=f"guest-{person}"), token=TABLET)
