"""The agent's next spoken turn, begun on the early transcript (a speculative turn).

The speech-to-text entity has the person's words at their first pause, before the pipeline's
VAD declares the end of speech (0.7 s of silence by default, against our 0.3 s pause). Where
the transcript is ready before the stream ends (a server whose Whisper runs on a GPU: tens of
ms), the turn the agent will send is sent then as a guess (`fairlane_speculative`), and the
server begins it; the agent's request a moment later claims it if it is the same turn, and the
reply is already under way. A guess that was wrong costs the server the tokens it made before
the real turn discarded it; nothing of it reaches the person.

A guess is the agent's last opening request (its system prompt, tools and sampling, for a new
conversation) with the new words and the current minute. It is made only where the last
transcript went to this integration's agent (its opening request held those very words), so
a household whose pipeline uses another agent sends none; and only to a server that says it
takes guesses. On a 2-core CPU the transcript comes after the stream ends, so no guess is made.
"""

from __future__ import annotations

import copy
import logging
import re
import time
from typing import Any

from homeassistant.util import dt as dt_util

from .client import FairlaneClient, FairlaneError

_LOGGER = logging.getLogger(__name__)

HEARD_S = 30.0  # a request this long after a transcript may be that transcript's turn
_CLOCK = re.compile(r"\b\d{1,2}:\d{2}\b")
_DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")


class TurnGuess:
    """What the entry's speech-to-text and agent share to begin a turn on the early words."""

    def __init__(self, client: FairlaneClient, enabled: bool) -> None:
        self._client = client
        self.enabled = enabled  # the server takes guesses (`speculative_turns` in /health)
        self._heard: tuple[str, float] | None = None  # the last transcript, and when
        self._opening: tuple[dict[str, Any], str] | None = None  # a request, and its words
        self._sent: str | None = None  # the id of the last guess sent
        self._dropped = False  # dropped while it was being sent

    def heard(self, text: str) -> None:
        """A transcript was handed to the pipeline."""
        self._heard = (text, time.monotonic())

    def opened(self, request: dict[str, Any], words: str) -> None:
        """The agent opens a new conversation with `words`: if they are the last transcript,
        this agent answers this speech-to-text, and its request is the shape to guess."""
        if self._heard is None:
            return
        text, at = self._heard
        if text == words and time.monotonic() - at < HEARD_S:
            self._opening = (copy.deepcopy(request), words)

    def body(self, words: str) -> dict[str, Any] | None:
        """The request the agent would open with for `words` now (None: no shape to guess)."""
        if self._opening is None:
            return None
        request, said = self._opening
        last = request["messages"][-1]
        content = last.get("content")
        if last.get("role") != "user" or not isinstance(content, str) or \
                not content.startswith(said):
            return None
        # The words, then what the agent moved after them (the minute and the date).
        now = dt_util.now()
        rest = _CLOCK.sub(now.strftime("%H:%M"), content[len(said):])
        rest = _DATE.sub(now.strftime("%Y-%m-%d"), rest)
        guess = copy.deepcopy(request)
        guess["messages"][-1]["content"] = words + rest
        return guess

    async def send(self, words: str) -> None:
        """Begin the turn for `words` on the server (a guess: failures are only logged)."""
        if not self.enabled or (body := self.body(words)) is None:
            return
        self._dropped = False
        try:
            self._sent = await self._client.guess(body)
        except FairlaneError as err:
            _LOGGER.debug("The guessed turn was not taken: %s", err)
            return
        if self._dropped:
            await self.drop()

    async def drop(self) -> None:
        """The person went on talking: the guess is wrong, and the server stops it now rather
        than when the real turn comes (on a CPU its prefill holds the device until then)."""
        sent, self._sent = self._sent, None
        self._dropped = sent is None  # still on its way: `send` drops it when it is in
        if sent:
            try:
                await self._client.cancel(sent)
            except FairlaneError as err:  # already claimed, discarded or expired
                _LOGGER.debug("The guess %s was not cancelled: %s", sent, err)
