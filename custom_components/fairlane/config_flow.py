"""Set up a Fairlane server: by hand, from the add-on's discovery, and again on a new token."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import voluptuous as vol
from homeassistant.config_entries import (
    ConfigEntry,
    ConfigFlow,
    ConfigFlowResult,
    OptionsFlowWithReload,
)
from homeassistant.const import CONF_HOST, CONF_LLM_HASS_API, CONF_PORT, CONF_TOKEN
from homeassistant.core import callback
from homeassistant.helpers import llm
from homeassistant.helpers.aiohttp_client import async_get_clientsession
from homeassistant.helpers.selector import (
    NumberSelector,
    NumberSelectorConfig,
    NumberSelectorMode,
    SelectOptionDict,
    SelectSelector,
    SelectSelectorConfig,
    SelectSelectorMode,
    TemplateSelector,
    TextSelector,
    TextSelectorConfig,
    TextSelectorType,
)
from homeassistant.helpers.service_info.hassio import HassioServiceInfo

from .client import FairlaneAuthError, FairlaneClient, FairlaneError, ServerInfo
from .const import (
    CLASS_AUTO,
    CLASSES,
    CONF_AI_TASK_CLASS,
    CONF_CHAT_CLASS,
    CONF_MAX_HISTORY,
    CONF_MAX_TOKENS,
    CONF_PROMPT,
    CONF_TEMPERATURE,
    DEFAULT_MAX_HISTORY,
    DEFAULT_MAX_TOKENS,
    DEFAULT_NAME,
    DEFAULT_PORT,
    DEFAULT_TEMPERATURE,
    DOMAIN,
)

_LOGGER = logging.getLogger(__name__)

TOKEN_SELECTOR = TextSelector(TextSelectorConfig(type=TextSelectorType.PASSWORD))


def _server_schema(host: str = "", port: int = DEFAULT_PORT) -> vol.Schema:
    return vol.Schema(
        {
            vol.Required(CONF_HOST, default=host): str,
            vol.Required(CONF_PORT, default=port): vol.All(vol.Coerce(int), vol.Range(1, 65535)),
            vol.Optional(CONF_TOKEN): TOKEN_SELECTOR,
        }
    )


# A new entry talks to Assist: the household's devices are what it is for.
DEFAULT_OPTIONS: dict[str, Any] = {
    CONF_LLM_HASS_API: [llm.LLM_API_ASSIST],
    CONF_PROMPT: llm.DEFAULT_INSTRUCTIONS_PROMPT,
}


class FairlaneConfigFlow(ConfigFlow, domain=DOMAIN):
    """Host, port and token, tested before anything is stored."""

    VERSION = 1

    def __init__(self) -> None:
        self._discovered: dict[str, Any] = {}

    async def _validate(self, data: Mapping[str, Any]) -> tuple[ServerInfo | None, dict[str, str]]:
        """`/health` proves the server is there; `/v1/stats` proves the token."""
        session = async_get_clientsession(self.hass)
        client = FairlaneClient(session, data[CONF_HOST], data[CONF_PORT], data.get(CONF_TOKEN))
        try:
            info = await client.health()
            await client.stats()
        except FairlaneAuthError:
            return None, {"base": "invalid_auth"}
        except FairlaneError:
            return None, {"base": "cannot_connect"}
        except Exception:
            _LOGGER.exception("Unexpected error while checking the server")
            return None, {"base": "unknown"}
        return info, {}

    async def async_step_user(self, user_input: dict[str, Any] | None = None) -> ConfigFlowResult:
        errors: dict[str, str] = {}
        if user_input is not None:
            self._async_abort_entries_match(
                {CONF_HOST: user_input[CONF_HOST], CONF_PORT: user_input[CONF_PORT]}
            )
            _, errors = await self._validate(user_input)
            if not errors:
                return self.async_create_entry(
                    title=f"{DEFAULT_NAME} ({user_input[CONF_HOST]})",
                    data=user_input,
                    options=DEFAULT_OPTIONS,
                )
        return self.async_show_form(
            step_id="user",
            data_schema=self.add_suggested_values_to_schema(_server_schema(), user_input or {}),
            errors=errors,
        )

    async def async_step_hassio(self, discovery_info: HassioServiceInfo) -> ConfigFlowResult:
        """The add-on announced itself (host, port and the token it generated)."""
        config = discovery_info.config
        self._discovered = {
            CONF_HOST: config["host"],
            CONF_PORT: int(config["port"]),
            CONF_TOKEN: config.get("token"),
        }
        await self.async_set_unique_id(discovery_info.uuid)
        self._abort_if_unique_id_configured(updates=self._discovered)
        self.context["title_placeholders"] = {"name": discovery_info.name}
        return await self.async_step_hassio_confirm()

    async def async_step_hassio_confirm(
        self, user_input: dict[str, Any] | None = None
    ) -> ConfigFlowResult:
        errors: dict[str, str] = {}
        if user_input is not None:
            _, errors = await self._validate(self._discovered)
            if not errors:
                return self.async_create_entry(
                    title=f"{DEFAULT_NAME} (add-on)", data=self._discovered, options=DEFAULT_OPTIONS
                )
        return self.async_show_form(step_id="hassio_confirm", errors=errors)

    async def async_step_reauth(self, entry_data: Mapping[str, Any]) -> ConfigFlowResult:
        return await self.async_step_reauth_confirm()

    async def async_step_reauth_confirm(
        self, user_input: dict[str, Any] | None = None
    ) -> ConfigFlowResult:
        """The server refused the token: ask for the new one."""
        entry = self._get_reauth_entry()
        errors: dict[str, str] = {}
        if user_input is not None:
            data = {**entry.data, CONF_TOKEN: user_input[CONF_TOKEN]}
            _, errors = await self._validate(data)
            if not errors:
                return self.async_update_reload_and_abort(entry, data=data)
        return self.async_show_form(
            step_id="reauth_confirm",
            data_schema=vol.Schema({vol.Required(CONF_TOKEN): TOKEN_SELECTOR}),
            description_placeholders={"host": entry.data[CONF_HOST]},
            errors=errors,
        )

    async def async_step_reconfigure(
        self, user_input: dict[str, Any] | None = None
    ) -> ConfigFlowResult:
        entry = self._get_reconfigure_entry()
        errors: dict[str, str] = {}
        if user_input is not None:
            _, errors = await self._validate(user_input)
            if not errors:
                return self.async_update_reload_and_abort(entry, data=user_input)
        schema = _server_schema(entry.data[CONF_HOST], entry.data[CONF_PORT])
        return self.async_show_form(
            step_id="reconfigure",
            data_schema=self.add_suggested_values_to_schema(schema, user_input or entry.data),
            errors=errors,
        )

    @staticmethod
    @callback
    def async_get_options_flow(config_entry: ConfigEntry) -> FairlaneOptionsFlow:
        return FairlaneOptionsFlow()


class FairlaneOptionsFlow(OptionsFlowWithReload):
    """The conversation agent and the AI task: prompt, Assist APIs, history, classes."""

    async def async_step_init(self, user_input: dict[str, Any] | None = None) -> ConfigFlowResult:
        if user_input is not None:
            if not user_input.get(CONF_LLM_HASS_API):
                user_input.pop(CONF_LLM_HASS_API, None)
            return self.async_create_entry(data=user_input)
        apis = [
            SelectOptionDict(label=api.name, value=api.id) for api in llm.async_get_apis(self.hass)
        ]
        classes = [CLASS_AUTO, *CLASSES]
        schema = vol.Schema(
            {
                vol.Optional(CONF_PROMPT): TemplateSelector(),
                vol.Optional(CONF_LLM_HASS_API): SelectSelector(
                    SelectSelectorConfig(options=apis, multiple=True)
                ),
                vol.Optional(CONF_MAX_HISTORY, default=DEFAULT_MAX_HISTORY): NumberSelector(
                    NumberSelectorConfig(min=0, max=100, mode=NumberSelectorMode.BOX)
                ),
                vol.Optional(CONF_MAX_TOKENS, default=DEFAULT_MAX_TOKENS): NumberSelector(
                    NumberSelectorConfig(min=16, max=4096, mode=NumberSelectorMode.BOX)
                ),
                vol.Optional(CONF_TEMPERATURE, default=DEFAULT_TEMPERATURE): NumberSelector(
                    NumberSelectorConfig(min=0, max=2, step=0.05, mode=NumberSelectorMode.BOX)
                ),
                vol.Optional(CONF_CHAT_CLASS, default=CLASS_AUTO): SelectSelector(
                    SelectSelectorConfig(
                        options=classes, mode=SelectSelectorMode.DROPDOWN, translation_key="lane"
                    )
                ),
                vol.Optional(CONF_AI_TASK_CLASS, default=CLASS_AUTO): SelectSelector(
                    SelectSelectorConfig(
                        options=classes, mode=SelectSelectorMode.DROPDOWN, translation_key="lane"
                    )
                ),
            }
        )
        return self.async_show_form(
            step_id="init",
            data_schema=self.add_suggested_values_to_schema(schema, self.config_entry.options),
        )
