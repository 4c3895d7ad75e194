"""A pytest plugin for home-assistant-datasets' `collect` run, loaded by `fairlane bench assist`.

It runs inside the harness's own Python (Home Assistant's), not Fairlane's, and changes three
things, none of them in the harness's code:
- the per-turn time limit (`agent.retryable.TIMEOUT`, 40 s) is FAIRLANE_ASSIST_TIMEOUT: a cold
  turn on a shared 2-core CPU can take longer;
- the agent `fairlane+local` does what an Assist pipeline with "prefer handling commands
  locally" does: Home Assistant's own sentence matching first (with the pipeline's filter for
  an agent that controls the home), the conversation agent for the rest;
- each turn's seconds (the test's call phase: the turn, its retries and the state check) are
  appended to FAIRLANE_ASSIST_TIMES as JSON lines.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from home_assistant_datasets.agent import ConversationAgent, retryable
from homeassistant.components import conversation
from homeassistant.core import Context, HomeAssistant
from homeassistant.helpers import chat_session

retryable.TIMEOUT = float(os.environ.get("FAIRLANE_ASSIST_TIMEOUT", retryable.TIMEOUT))


class LocalFirst(ConversationAgent):
    """Home Assistant's sentence matching first; the wrapped agent where nothing matched."""

    def __init__(self, agent: ConversationAgent, agent_id: str) -> None:
        self._agent = agent
        self._agent_id = agent_id
        self.local = False

    async def async_process(self, hass: HomeAssistant, text: str, *, structure: Any = None) -> str:
        with (
            chat_session.async_get_chat_session(hass) as session,
            conversation.async_get_chat_log(hass, session) as chat_log,
        ):
            user_input = conversation.ConversationInput(
                text=text, context=Context(), conversation_id=session.conversation_id,
                device_id=None, satellite_id=None, language=hass.config.language,
                agent_id=self._agent_id,
            )
            response = await conversation.async_handle_intents(
                hass, user_input, chat_log, intent_filter=_pipeline_filter()
            )
        self.local = response is not None
        if response is not None:
            return str(response.speech.get("plain", {}).get("speech", ""))
        return str(await self._agent.async_process(hass, text, structure=structure))

    def trace_context(self) -> dict[str, Any]:
        context = {} if self.local else self._agent.trace_context()
        return {**context, "handled_locally": self.local}


def _pipeline_filter() -> Any:
    """The Assist pipeline's filter of local matches when the agent controls the home."""
    try:
        from homeassistant.components.assist_pipeline.pipeline import (
            _async_local_fallback_intent_filter,
        )
    except ImportError:
        return None
    return _async_local_fallback_intent_filter


def pytest_sessionstart(session: pytest.Session) -> None:
    """Wrap the harness's agent factory: local-first where the bench asks for it
    (FAIRLANE_ASSIST_LOCAL_FIRST). The harness's own plugin defines its agent fixture after
    this plugin loads, so the factory it calls is wrapped, not the fixture overridden; and only
    now, once Home Assistant's test plugin has started, may the harness's plugin be imported."""
    from home_assistant_datasets.plugins import pytest_agent

    create = pytest_agent.create_default_agent

    def agent(conversation_agent_id: str, rpm: int | None = None) -> ConversationAgent:
        made = create(conversation_agent_id, rpm)
        if os.environ.get("FAIRLANE_ASSIST_LOCAL_FIRST") == "1":
            return LocalFirst(made, conversation_agent_id)
        return made

    pytest_agent.create_default_agent = agent


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call" and (path := os.environ.get("FAIRLANE_ASSIST_TIMES")):
        with open(path, "a") as times:
            times.write(json.dumps({"test": report.nodeid, "seconds": report.duration,
                                    "outcome": report.outcome}) + "\n")
