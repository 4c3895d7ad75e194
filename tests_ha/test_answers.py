"""A done action's answer in Home Assistant's own words and the conversation's language."""

from __future__ import annotations

from typing import Any

from homeassistant.core import HomeAssistant

from custom_components.fairlane.answers import done_speech, failure_speech, no_words
from tests_ha.conftest import add_kitchen_light


def _done(entity_id: str) -> dict[str, Any]:
    """An intent's result as Home Assistant returns it for a done action."""
    return {"response_type": "action_done", "data": {
        "targets": [], "failed": [],
        "success": [{"name": "Kitchen light", "type": "entity", "id": entity_id}]}}


async def test_each_language_gets_home_assistant_s_own_words(hass: HomeAssistant) -> None:
    light = await add_kitchen_light(hass)
    done = [("HassTurnOff", {"name": "Kitchen light"}, _done(light))]
    assert await done_speech(hass, "en", done) == "Turned off the light"
    # Polish: "Wyłączono światło" (2026.2's `light` response) or "Wyłączono Kitchen light"
    # (2026.11's data, which has only the default).
    assert (await done_speech(hass, "pl", done) or "").startswith("Wyłączono")
    assert await done_speech(hass, "de-CH", done)  # the base language's
    added = [("HassListAddItem", {"item": "milk", "name": "Shopping"}, {"data": {}})]
    assert await done_speech(hass, "en", added) == "Added milk"  # its only response


async def test_no_response_leaves_the_answer_to_the_model(hass: HomeAssistant) -> None:
    light = await add_kitchen_light(hass)
    assert await done_speech(hass, "xx", [("HassTurnOn", {}, _done(light))]) is None
    assert await done_speech(hass, "en", [("MyOwnIntent", {}, _done(light))]) is None


async def test_a_reply_without_words_becomes_home_assistant_s_failure_message(
    hass: HomeAssistant,
) -> None:
    """After a failed call the default model answered "NULL", which the voice read out."""
    assert no_words("NULL") and no_words(" none. ") and no_words("")
    assert not no_words("Turned on the light") and not no_words("Nothing is on")
    assert await failure_speech(hass, "en") == "An unexpected error occurred"
    assert await failure_speech(hass, "pl") not in (None, "An unexpected error occurred")
    assert await failure_speech(hass, "xx") is None
