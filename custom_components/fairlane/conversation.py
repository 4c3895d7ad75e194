"""The conversation agent: Assist's chat and voice turns, streamed, with Assist's tools."""

from __future__ import annotations

from typing import Literal

from homeassistant.components import conversation
from homeassistant.components.conversation.models import AbstractConversationAgent
from homeassistant.config_entries import ConfigSubentry
from homeassistant.const import CONF_LLM_HASS_API, MATCH_ALL
from homeassistant.core import HomeAssistant
from homeassistant.helpers.entity_platform import AddConfigEntryEntitiesCallback

from .answers import failure_speech, no_words
from .const import CLASS_AUTO, CONF_CHAT_CLASS, CONF_PROMPT, DOMAIN, SUBENTRY_CONVERSATION
from .coordinator import FairlaneConfigEntry
from .entity import FairlaneLLMEntity

PARALLEL_UPDATES = 0


async def async_setup_entry(
    hass: HomeAssistant,
    entry: FairlaneConfigEntry,
    async_add_entities: AddConfigEntryEntitiesCallback,
) -> None:
    """One agent per conversation subentry, each on its own device."""
    for subentry in entry.subentries.values():
        if subentry.subentry_type == SUBENTRY_CONVERSATION:
            async_add_entities(
                [FairlaneConversationEntity(entry, subentry)],
                config_subentry_id=subentry.subentry_id,
            )


class FairlaneConversationEntity(
    conversation.ConversationEntity, AbstractConversationAgent, FairlaneLLMEntity
):
    """Fairlane as an Assist conversation agent."""

    _attr_name = None
    _attr_supports_streaming = True

    def __init__(self, entry: FairlaneConfigEntry, subentry: ConfigSubentry) -> None:
        super().__init__(entry, subentry)
        if subentry.data.get(CONF_LLM_HASS_API):
            self._attr_supported_features = conversation.ConversationEntityFeature.CONTROL

    @property
    def supported_languages(self) -> list[str] | Literal["*"]:
        return MATCH_ALL

    async def async_added_to_hass(self) -> None:
        """Also reachable by the entry's id, as the agent was before subentries (pipelines
        saved then name it so); as core's own agents do."""
        await super().async_added_to_hass()
        conversation.async_set_agent(self.hass, self.entry, self)

    async def async_will_remove_from_hass(self) -> None:
        conversation.async_unset_agent(self.hass, self.entry)
        await super().async_will_remove_from_hass()


    async def _async_handle_message(
        self, user_input: conversation.ConversationInput, chat_log: conversation.ChatLog
    ) -> conversation.ConversationResult:
        options = self.subentry.data
        try:
            await chat_log.async_provide_llm_data(
                user_input.as_llm_context(DOMAIN),
                options.get(CONF_LLM_HASS_API),
                options.get(CONF_PROMPT),
                user_input.extra_system_prompt,
            )
        except conversation.ConverseError as err:
            return err.as_conversation_result()
        await self._async_handle_chat_log(
            chat_log,
            fairlane_class=turn_class(user_input, options.get(CONF_CHAT_CLASS, CLASS_AUTO)),
            user=user_input.context.user_id or user_input.satellite_id or user_input.device_id,
            language=user_input.language,
        )
        result = conversation.async_get_result_from_chat_log(user_input, chat_log)
        speech = result.response.speech.get("plain", {}).get("speech", "")
        if no_words(str(speech)) and (
            failed := await failure_speech(self.hass, user_input.language)
        ):
            result.response.async_set_speech(failed)
        return result


def turn_class(user_input: conversation.ConversationInput, configured: str) -> str:
    """`voice` when a voice device (a satellite) is speaking, `chat` when someone types.

    A turn from a satellite or a device is spoken: someone stands in the room waiting for the
    reply, so it goes in the strictest lane. A configured class overrides this.
    """
    if configured != CLASS_AUTO:
        return configured
    return "voice" if user_input.satellite_id or user_input.device_id else "chat"
