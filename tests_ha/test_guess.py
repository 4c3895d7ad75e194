"""The shape of a guessed turn: this agent's opening request, the new words, the minute now."""

from __future__ import annotations

from typing import Any, cast

from freezegun.api import FrozenDateTimeFactory
from homeassistant.util import dt as dt_util

from custom_components.fairlane.client import FairlaneClient
from custom_components.fairlane.guess import TurnGuess

OPENING = {
    "user": "home-assistant",
    "tools": [{"type": "function", "function": {"name": "HassTurnOn"}}],
    "messages": [
        {"role": "system", "content": "You are a voice assistant for Home Assistant."},
        {"role": "user",
         "content": "turn on the lamp\n\n(Current time is 09:15. Today's date is 2026-12-05.)"},
    ],
}


def _guess() -> TurnGuess:
    return TurnGuess(cast(FairlaneClient, None), enabled=True)  # `body` sends nothing


def _words(body: dict[str, Any] | None) -> str | None:
    return None if body is None else str(body["messages"][-1]["content"])


def test_a_turn_is_guessed_only_after_this_agent_took_the_transcript() -> None:
    guess = _guess()
    guess.opened(OPENING, "turn on the lamp")
    assert guess.body("close the blinds") is None  # no transcript heard: another pipeline's
    guess.heard("what time is it")
    guess.opened(OPENING, "turn on the lamp")  # typed, not the transcript
    assert guess.body("close the blinds") is None
    guess.heard("turn on the lamp")
    guess.opened(OPENING, "turn on the lamp")
    assert guess.body("close the blinds") is not None


def test_the_guess_has_the_new_words_and_the_minute_now(freezer: FrozenDateTimeFactory) -> None:
    freezer.move_to("2026-12-06 18:42:51+00:00")
    guess = _guess()
    guess.heard("turn on the lamp")
    guess.opened(OPENING, "turn on the lamp")
    body = guess.body("close the blinds")
    now = dt_util.now()
    assert _words(body) == (
        f"close the blinds\n\n(Current time is {now:%H:%M}. Today's date is {now:%Y-%m-%d}.)"
    )
    assert body is not None and body["tools"] == OPENING["tools"]
    assert body["messages"][0] == OPENING["messages"][0] and body["user"] == "home-assistant"
    assert _words(OPENING) is not None and "09:15" in str(_words(OPENING))  # not changed
