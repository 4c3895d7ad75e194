"""The AI task entity: generate text or structured data with the household's model."""

from __future__ import annotations

import json
import logging

from homeassistant.components import ai_task, conversation
from homeassistant.core import HomeAssistant
from homeassistant.exceptions import HomeAssistantError
from homeassistant.helpers.entity_platform import AddConfigEntryEntitiesCallback
from homeassistant.helpers.script import script_stack_cv

from .const import CLASS_AUTO, CONF_AI_TASK_CLASS, DOMAIN, SUBENTRY_AI_TASK
from .coordinator import FairlaneConfigEntry
from .entity import FairlaneLLMEntity

_LOGGER = logging.getLogger(__name__)
PARALLEL_UPDATES = 0


async def async_setup_entry(
    hass: HomeAssistant,
    entry: FairlaneConfigEntry,
    async_add_entities: AddConfigEntryEntitiesCallback,
) -> None:
    for subentry in entry.subentries.values():
        if subentry.subentry_type == SUBENTRY_AI_TASK:
            async_add_entities(
                [FairlaneTaskEntity(entry, subentry)], config_subentry_id=subentry.subentry_id
            )


class FairlaneTaskEntity(ai_task.AITaskEntity, FairlaneLLMEntity):
    """Generate data; `structure` is enforced by the server's JSON-schema constrained output."""

    _attr_name = None
    # Attachments: text and PDF files, which the server reads; images are refused by name.
    _attr_supported_features = (
        ai_task.AITaskEntityFeature.GENERATE_DATA
        | ai_task.AITaskEntityFeature.SUPPORT_ATTACHMENTS
    )

    async def _async_generate_data(
        self, task: ai_task.GenDataTask, chat_log: conversation.ChatLog
    ) -> ai_task.GenDataTaskResult:
        await self._async_handle_chat_log(
            chat_log,
            fairlane_class=task_class(self.subentry.data.get(CONF_AI_TASK_CLASS, CLASS_AUTO)),
            user=None,
            structure=task.structure,
        )
        last = chat_log.content[-1]
        if not isinstance(last, conversation.AssistantContent):
            raise HomeAssistantError(translation_domain=DOMAIN, translation_key="no_answer")
        text = last.content or ""
        if task.structure is None:
            return ai_task.GenDataTaskResult(conversation_id=chat_log.conversation_id, data=text)
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            _LOGGER.error("The model's structured answer is not JSON: %s", text)
            raise HomeAssistantError(
                translation_domain=DOMAIN, translation_key="bad_structure"
            ) from err
        return ai_task.GenDataTaskResult(conversation_id=chat_log.conversation_id, data=data)


def task_class(configured: str) -> str:
    """`background` when an automation or script asked (no one waits on it), else `chat`.

    HA runs an automation's or script's actions with its script stack in a context variable,
    which the action call (and so this task) inherits.
    """
    if configured != CLASS_AUTO:
        return configured
    return "background" if script_stack_cv.get() else "chat"
