"""The answer after done actions, in Home Assistant's own words and the conversation's language.

When Home Assistant reports every action of a round done (`action_done`, no target failed),
the model's words add nothing a person needs: the small default model, asked to confirm, wrote
"Mark the kitchen light as off.", listed commands, answered "null" or in Chinese. Home
Assistant has its own response for each intent in each language (the `home-assistant-intents`
data its default agent speaks from: "Turned off the light", "Wyłączono światło", "Added
milk"): it is rendered here, with the call's slots and the matched entity, as the default
agent renders it, and it is the turn's answer. No model round is spent on it, so a spoken
command's reply comes sooner too. An intent with no response in that language, or whose
response cannot be rendered, leaves the answer to the model, as before.

A reply with no words for a person (the model wrote "NULL" after a call failed) is replaced
by Home Assistant's own message for a failure in that language ("An unexpected error
occurred"): honest, and never read aloud as "null".
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from home_assistant_intents import get_intents
from homeassistant.core import HomeAssistant
from homeassistant.exceptions import TemplateError
from homeassistant.helpers import template

_LOGGER = logging.getLogger(__name__)


# Replies that hold no words for a person.
NO_WORDS = frozenset({"", "null", "none", "nil", "undefined", "n/a"})


@functools.cache
def _all_responses(language: str) -> dict[str, Any]:
    """Home Assistant's responses in a language (or its base): `intents`, `errors`."""
    for tag in (language, language.split("-")[0]):
        data = get_intents(tag)
        if data:
            return dict(data.get("responses", {}))
    return {}


def _responses(language: str) -> dict[str, dict[str, str]]:
    """Home Assistant's response templates for each intent in a language."""
    return dict(_all_responses(language).get("intents", {}))


def no_words(reply: str) -> bool:
    """Whether a reply holds nothing a person could use ("NULL", "none", nothing)."""
    return reply.strip().strip(".!\"'`").casefold() in NO_WORDS


async def failure_speech(hass: HomeAssistant, language: str) -> str | None:
    """Home Assistant's own message for a failed request, in the language (None if none)."""
    responses = await hass.async_add_executor_job(_all_responses, language)
    text = (responses.get("errors") or {}).get("handle_error")
    return str(text) if text else None


async def done_speech(
    hass: HomeAssistant, language: str, done: list[tuple[str, dict[str, Any], dict[str, Any]]]
) -> str | None:
    """Home Assistant's response to each done action (intent, arguments, result), joined;
    None where any has none."""
    responses = await hass.async_add_executor_job(_responses, language)
    spoken = []
    for intent_type, args, result in done:
        choices = responses.get(intent_type)
        if not choices:
            return None
        ids = [t.get("id") for t in (result.get("data") or {}).get("success") or ()
               if isinstance(t, dict) and "entity" in (t.get("type") or ())]
        states = [s for s in (hass.states.get(str(i)) for i in ids) if s is not None]
        state = states[0] if states else None
        key = _key(choices, args, state.domain if state else None)
        if key is None:
            return None
        slots = {**args}
        if state is not None:
            slots.setdefault("name", state.name)
        try:
            text = template.Template(choices[key], hass).async_render(
                {
                    "slots": slots,
                    "state": template.TemplateState(hass, state) if state else None,
                    "query": {"matched": [template.TemplateState(hass, s) for s in states],
                              "unmatched": []},
                },
                parse_result=False,
            )
        except TemplateError as err:
            _LOGGER.debug("No answer of Home Assistant's for %s: %s", intent_type, err)
            return None
        if not str(text).strip():
            return None
        spoken.append(" ".join(str(text).split()))
    return " ".join(spoken) if spoken else None


def _key(choices: dict[str, str], args: dict[str, Any], domain: str | None) -> str | None:
    """Which of an intent's responses fits a call: its entity's domain (`lock`, `cover`), a
    slot it set (`brightness`), the default, or the only one there is."""
    if domain is not None and domain in choices:
        return domain
    for slot in args:
        if slot in choices:
            return slot
    if "default" in choices:
        return "default"
    return next(iter(choices)) if len(choices) == 1 else None
