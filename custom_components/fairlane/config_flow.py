"""Set up a Fairlane server (by hand, from the add-on's discovery, again on a new token or a
new address) and its subentries: conversation agents, the AI task, speech-to-text and the
voice.

A server is known by the instance id it publishes in `/health`, not by its address: that id
is the entry's unique id, so the same server is never set up twice, a reconfigure cannot point
an entry at another server, and the add-on's discovery only ever updates the add-on's entry.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from homeassistant.config_entries import (
    SOURCE_RECONFIGURE,
    SOURCE_USER,
    ConfigEntry,
    ConfigEntryState,
    ConfigFlow,
    ConfigFlowResult,
    ConfigSubentryData,
    ConfigSubentryFlow,
    SubentryFlowResult,
)
from homeassistant.const import CONF_HOST, CONF_LLM_HASS_API, CONF_NAME, CONF_PORT, CONF_TOKEN
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

from . import default_subentries
from .client import FairlaneAuthError, FairlaneClient, FairlaneError, ServerInfo, parse_host
from .const import (
    CLASS_AUTO,
    CLASSES,
    CONF_ADDON_SLUG,
    CONF_AI_TASK_CLASS,
    CONF_CHAT_CLASS,
    CONF_MAX_HISTORY,
    CONF_MAX_TOKENS,
    CONF_PROMPT,
    CONF_TEMPERATURE,
    DEFAULT_AI_TASK_NAME,
    DEFAULT_CONVERSATION_NAME,
    DEFAULT_MAX_HISTORY,
    DEFAULT_MAX_TOKENS,
    DEFAULT_NAME,
    DEFAULT_PORT,
    DEFAULT_STT_NAME,
    DEFAULT_TEMPERATURE,
    DEFAULT_TTS_NAME,
    DOMAIN,
    SUBENTRY_AI_TASK,
    SUBENTRY_CONVERSATION,
    SUBENTRY_STT,
    SUBENTRY_TTS,
)
from .coordinator import FairlaneConfigEntry
from .schema import vol

_LOGGER = logging.getLogger(__name__)
CONF_PULL_MODEL = "pull_model"  # a reconfigure field, not kept: the model to pull
PULL_POLL_S = 1.0

TOKEN_SELECTOR = TextSelector(TextSelectorConfig(type=TextSelectorType.PASSWORD))


def _server_schema(host: str = "", port: int = DEFAULT_PORT) -> vol.Schema:
    return vol.Schema(
        {
            vol.Required(CONF_HOST, default=host): str,
            vol.Required(CONF_PORT, default=port): vol.All(vol.Coerce(int), vol.Range(1, 65535)),
            vol.Optional(CONF_TOKEN): TOKEN_SELECTOR,
        }
    )


# A new agent talks to Assist: the household's devices are what it is for.
DEFAULT_AGENT_OPTIONS: dict[str, Any] = {
    CONF_LLM_HASS_API: [llm.LLM_API_ASSIST],
    CONF_PROMPT: llm.DEFAULT_INSTRUCTIONS_PROMPT,
}


class FairlaneConfigFlow(ConfigFlow, domain=DOMAIN):
    """Host, port and token, tested before anything is stored."""

    VERSION = 2
    MINOR_VERSION = 1

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

    async def _server_form(
        self, user_input: dict[str, Any] | None
    ) -> tuple[dict[str, Any] | None, ServerInfo | None, dict[str, str]]:
        """Read and check the host form: the data to store and the server, or the errors."""
        if user_input is None:
            return None, None, {}
        try:
            host, port = parse_host(user_input[CONF_HOST])
        except ValueError:
            return None, None, {CONF_HOST: "invalid_host"}
        data = {**user_input, CONF_HOST: host, CONF_PORT: port or user_input[CONF_PORT]}
        info, errors = await self._validate(data)
        return (data, info, errors) if not errors else (None, None, errors)

    async def async_step_user(self, user_input: dict[str, Any] | None = None) -> ConfigFlowResult:
        data, info, errors = await self._server_form(user_input)
        if data is not None and info is not None:
            if info.instance_id:
                await self.async_set_unique_id(info.instance_id)
                # The same server at a new address: that entry follows it.
                self._follow_server({CONF_HOST: data[CONF_HOST], CONF_PORT: data[CONF_PORT]})
            self._async_abort_entries_match(
                {CONF_HOST: data[CONF_HOST], CONF_PORT: data[CONF_PORT]}
            )
            return self._create(f"{DEFAULT_NAME} ({data[CONF_HOST]})", data, info)
        return self.async_show_form(
            step_id="user",
            data_schema=self.add_suggested_values_to_schema(_server_schema(), user_input or {}),
            errors=errors,
        )

    # A loaded entry reloads itself when its data changes (its update listener, which also
    # reloads it for subentry changes); Home Assistant 2026.12 refuses a flow that reloads such
    # an entry as well. An entry that is not loaded has no listener: the flow reloads it.

    def _follow_server(self, updates: dict[str, Any]) -> None:
        """Abort when this server has an entry, moving that entry to `updates` (its address
        and token) first."""
        known = (
            self.hass.config_entries.async_entry_for_domain_unique_id(DOMAIN, self.unique_id)
            if self.unique_id
            else None
        )
        reload_here = known is not None and not known.update_listeners
        self._abort_if_unique_id_configured(updates=updates, reload_on_update=reload_here)

    def _update_and_abort(self, entry: ConfigEntry, data: dict[str, Any]) -> ConfigFlowResult:
        """Store the entry's new data and reload it (reauth, reconfigure)."""
        listened = bool(entry.update_listeners)
        if not self.hass.config_entries.async_update_entry(entry, data=data) or not listened:
            # Unchanged, or not loaded: no listener will reload it.
            self.hass.config_entries.async_schedule_reload(entry.entry_id)
        reconfigure = self.source == SOURCE_RECONFIGURE
        return self.async_abort(
            reason="reconfigure_successful" if reconfigure else "reauth_successful"
        )

    def _create(self, title: str, data: dict[str, Any], info: ServerInfo) -> ConfigFlowResult:
        """The entry with a conversation agent (with Assist), the AI task and, where the server
        has them, speech-to-text and the voice."""
        subentries = [
            ConfigSubentryData(data=options, subentry_type=kind, title=name, unique_id=None)
            for kind, name, options in default_subentries(
                DEFAULT_AGENT_OPTIONS,
                stt=info.stt_model is not None,
                tts=info.tts_voice is not None,
            )
        ]
        return self.async_create_entry(title=title, data=data, subentries=subentries)

    async def async_step_hassio(self, discovery_info: HassioServiceInfo) -> ConfigFlowResult:
        """The add-on announced itself (host, port and the token it generated)."""
        config = discovery_info.config
        self._discovered = {
            CONF_HOST: config["host"],
            CONF_PORT: int(config["port"]),
            CONF_TOKEN: config.get("token"),
            CONF_ADDON_SLUG: discovery_info.slug,
        }
        client = FairlaneClient(
            async_get_clientsession(self.hass),
            self._discovered[CONF_HOST],
            self._discovered[CONF_PORT],
            self._discovered[CONF_TOKEN],
        )
        try:
            info = await client.health()
        except FairlaneError:
            return self.async_abort(reason="cannot_connect")
        # Known by the server's id: only the add-on's own entry is updated, never an entry
        # that was reconfigured to another server.
        await self.async_set_unique_id(info.instance_id or discovery_info.uuid)
        self._follow_server(self._discovered)
        # An entry at this very address that has no id yet (from before servers had one; it
        # takes the id when it next loads) is this server too: no second entry for it.
        self._async_abort_entries_match(
            {CONF_HOST: self._discovered[CONF_HOST], CONF_PORT: self._discovered[CONF_PORT]}
        )
        self.context["title_placeholders"] = {"name": discovery_info.name}
        return await self.async_step_hassio_confirm()

    async def async_step_hassio_confirm(
        self, user_input: dict[str, Any] | None = None
    ) -> ConfigFlowResult:
        errors: dict[str, str] = {}
        if user_input is not None:
            info, errors = await self._validate(self._discovered)
            if info is not None:
                return self._create(f"{DEFAULT_NAME} (add-on)", self._discovered, info)
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
            info, errors = await self._validate(data)
            if info is not None:
                await self._same_server(info)
                return self._update_and_abort(entry, data)
        return self.async_show_form(
            step_id="reauth_confirm",
            data_schema=vol.Schema({vol.Required(CONF_TOKEN): TOKEN_SELECTOR}),
            description_placeholders={"host": entry.data[CONF_HOST]},
            errors=errors,
        )

    async def async_step_reconfigure(
        self, user_input: dict[str, Any] | None = None
    ) -> ConfigFlowResult:
        """A new address or token for the same server (another server is refused)."""
        entry = self._get_reconfigure_entry()
        data, info, errors = await self._server_form(user_input)
        if data is not None and info is not None:
            await self._same_server(info)
            return self._update_and_abort(entry, {**entry.data, **data})
        schema = _server_schema(entry.data[CONF_HOST], entry.data[CONF_PORT])
        return self.async_show_form(
            step_id="reconfigure",
            data_schema=self.add_suggested_values_to_schema(schema, user_input or entry.data),
            errors=errors,
        )

    async def _same_server(self, info: ServerInfo) -> None:
        """Abort when the server found is not the entry's (an entry without an id yet, from
        before servers had one, takes this one's)."""
        entry = (
            self._get_reauth_entry() if self.source == "reauth" else self._get_reconfigure_entry()
        )
        if info.instance_id is None or entry.unique_id is None:
            return
        await self.async_set_unique_id(info.instance_id)
        self._abort_if_unique_id_mismatch(reason="wrong_server")

    @classmethod
    @callback
    def async_get_supported_subentry_types(
        cls, config_entry: FairlaneConfigEntry
    ) -> dict[str, type[ConfigSubentryFlow]]:
        return {
            SUBENTRY_CONVERSATION: ConversationFlow,
            SUBENTRY_AI_TASK: AITaskFlow,
            SUBENTRY_STT: SpeechToTextFlow,
            SUBENTRY_TTS: TextToSpeechFlow,
        }


# --- subentries ------------------------------------------------------------------------------


def _lane_selector() -> SelectSelector:
    return SelectSelector(
        SelectSelectorConfig(
            options=[CLASS_AUTO, *CLASSES],
            mode=SelectSelectorMode.DROPDOWN,
            translation_key="lane",
        )
    )


def _reply_fields() -> dict[vol.Marker, Any]:
    return {
        vol.Optional(CONF_MAX_TOKENS, default=DEFAULT_MAX_TOKENS): NumberSelector(
            NumberSelectorConfig(min=16, max=4096, mode=NumberSelectorMode.BOX)
        ),
        vol.Optional(CONF_TEMPERATURE, default=DEFAULT_TEMPERATURE): NumberSelector(
            NumberSelectorConfig(min=0, max=2, step=0.05, mode=NumberSelectorMode.BOX)
        ),
    }


class _FairlaneSubentryFlow(ConfigSubentryFlow):
    """Add or change one subentry: a name (when new) and the settings of its kind."""

    default_title = DEFAULT_NAME
    # Speech-to-text and the voice are the server's: one of each is all there is to have.
    single = False
    # The `ServerInfo` field the server must have for this kind (its STT model, its voice).
    server_part: str | None = None

    def _fields(self) -> dict[vol.Marker, Any]:
        return {}

    def _clean(self, user_input: dict[str, Any]) -> dict[str, Any]:
        return user_input

    def _available(self) -> str | None:
        """Why this kind cannot be added to this server now, or None."""
        entry: FairlaneConfigEntry = self._get_entry()
        if entry.state is not ConfigEntryState.LOADED:
            return "entry_not_loaded"
        if self.server_part and not getattr(entry.runtime_data.info, self.server_part):
            return f"no_{self._subentry_type}"  # the server runs without it
        if (
            self.single
            and self.source == SOURCE_USER
            and any(sub.subentry_type == self._subentry_type for sub in entry.subentries.values())
        ):
            return "already_configured"
        return None

    async def async_step_user(self, user_input: dict[str, Any] | None = None) -> SubentryFlowResult:
        if (reason := self._available()) is not None:
            return self.async_abort(reason=reason)
        if user_input is not None:
            title = user_input.pop(CONF_NAME)
            return self.async_create_entry(title=title, data=self._clean(user_input))
        schema = vol.Schema(
            {vol.Required(CONF_NAME, default=self.default_title): str, **self._fields()}
        )
        return self.async_show_form(step_id="user", data_schema=schema)

    async def async_step_reconfigure(
        self, user_input: dict[str, Any] | None = None
    ) -> SubentryFlowResult:
        subentry = self._get_reconfigure_subentry()
        if user_input is not None:
            return self.async_update_and_abort(
                self._get_entry(), subentry, data=self._clean(user_input)
            )
        schema = self.add_suggested_values_to_schema(vol.Schema(self._fields()), subentry.data)
        return self.async_show_form(step_id="reconfigure", data_schema=schema)


class ConversationFlow(_FairlaneSubentryFlow):
    """A conversation agent: its prompt, the LLM APIs it may use, history, reply, lane; and,
    when reconfigured, a model of the server's catalogue to pull onto it, with the pull's
    progress shown (the server pulls; the flow only watches)."""

    default_title = DEFAULT_CONVERSATION_NAME
    _choices: list[SelectOptionDict] | None = None
    _model: str = ""
    _kept: dict[str, Any] | None = None  # the settings given with the model, saved after
    _pull: asyncio.Task[None] | None = None
    _pull_error: str = ""

    async def async_step_reconfigure(
        self, user_input: dict[str, Any] | None = None
    ) -> SubentryFlowResult:
        if user_input is not None and (model := user_input.pop(CONF_PULL_MODEL, None)):
            self._model, self._kept = str(model), user_input
            return await self.async_step_pull()
        if user_input is None:
            self._choices = await self._pull_choices()
        return await super().async_step_reconfigure(user_input)

    async def async_step_pull(self, user_input: dict[str, Any] | None = None) -> SubentryFlowResult:
        if self._pull is None:
            self._pull = self.hass.async_create_task(self._pulling(self._model))
        if not self._pull.done():
            return self.async_show_progress(
                step_id="pull", progress_action="pull", progress_task=self._pull,
                description_placeholders={"model": self._model},
            )
        if (err := self._pull.exception()) is not None:
            self._pull_error = str(err)
            return self.async_show_progress_done(next_step_id="pull_failed")
        return self.async_show_progress_done(next_step_id="pull_done")

    async def async_step_pull_done(
        self, user_input: dict[str, Any] | None = None
    ) -> SubentryFlowResult:
        if user_input is not None:
            return self.async_update_and_abort(
                self._get_entry(), self._get_reconfigure_subentry(),
                data=self._clean(self._kept or {}),
            )
        return self.async_show_form(
            step_id="pull_done", description_placeholders={"model": self._model}
        )

    async def async_step_pull_failed(
        self, user_input: dict[str, Any] | None = None
    ) -> SubentryFlowResult:
        return self.async_abort(
            reason="pull_failed", description_placeholders={"error": self._pull_error}
        )

    async def _pulling(self, model: str) -> None:
        """Start the server's pull and follow it to its end, the flow's bar with it."""
        client = self._get_entry().runtime_data.client
        job = await client.pull(model)
        while job.get("state") == "pulling":
            if total := job.get("bytes_total"):
                self.async_update_progress(min(1.0, float(job.get("bytes_done", 0)) / total))
            await asyncio.sleep(PULL_POLL_S)
            job = await client.pull_status(str(job["id"]))
        if job.get("state") != "done":
            raise FairlaneError(str(job.get("error") or f"the pull was {job.get('state')}"))

    async def _pull_choices(self) -> list[SelectOptionDict]:
        """The catalogue's conversation models not on the server, those that fit first."""
        entry: FairlaneConfigEntry = self._get_entry()
        if entry.state is not ConfigEntryState.LOADED:
            return []
        try:
            models = await entry.runtime_data.client.catalogue()
        except FairlaneError as err:
            _LOGGER.debug("No catalogue from the server: %s", err)
            return []
        offered = [m for m in models if m.get("role") == "conversation" and not m.get("here")]
        offered.sort(key=lambda m: not m.get("fits"))
        return [
            SelectOptionDict(
                value=str(m["id"]),
                label=f"{m['id']} ({float(m.get('size_mb') or 0) / 1000:.1f} GB"
                + ("" if m.get("fits") else ", larger than this server's machine") + ")",
            )
            for m in offered
        ]

    def _fields(self) -> dict[vol.Marker, Any]:
        apis = [
            SelectOptionDict(label=api.name, value=api.id) for api in llm.async_get_apis(self.hass)
        ]
        return {
            vol.Optional(CONF_PROMPT, default=llm.DEFAULT_INSTRUCTIONS_PROMPT): TemplateSelector(),
            vol.Optional(CONF_LLM_HASS_API): SelectSelector(
                SelectSelectorConfig(options=apis, multiple=True)
            ),
            vol.Optional(CONF_MAX_HISTORY, default=DEFAULT_MAX_HISTORY): NumberSelector(
                NumberSelectorConfig(min=0, max=100, mode=NumberSelectorMode.BOX)
            ),
            **_reply_fields(),
            vol.Optional(CONF_CHAT_CLASS, default=CLASS_AUTO): _lane_selector(),
            **(
                {vol.Optional(CONF_PULL_MODEL): SelectSelector(
                    SelectSelectorConfig(options=self._choices, mode=SelectSelectorMode.DROPDOWN)
                )}
                if self._choices
                else {}
            ),
        }

    def _clean(self, user_input: dict[str, Any]) -> dict[str, Any]:
        """No API selected: the agent only talks (the key is left out, as core's agents do)."""
        if not user_input.get(CONF_LLM_HASS_API):
            user_input.pop(CONF_LLM_HASS_API, None)
        return user_input


class AITaskFlow(_FairlaneSubentryFlow):
    default_title = DEFAULT_AI_TASK_NAME

    def _fields(self) -> dict[vol.Marker, Any]:
        return {
            **_reply_fields(),
            vol.Optional(CONF_AI_TASK_CLASS, default=CLASS_AUTO): _lane_selector(),
        }


class SpeechToTextFlow(_FairlaneSubentryFlow):
    default_title = DEFAULT_STT_NAME
    single = True
    server_part = "stt_model"


class TextToSpeechFlow(_FairlaneSubentryFlow):
    default_title = DEFAULT_TTS_NAME
    single = True
    server_part = "tts_voice"
