"""Actions: index household documents, search them, summarise a document or a text."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any, cast

import voluptuous as vol
from homeassistant.config_entries import ConfigEntryState
from homeassistant.core import HomeAssistant, ServiceCall, ServiceResponse, SupportsResponse
from homeassistant.exceptions import HomeAssistantError, ServiceValidationError
from homeassistant.helpers import config_validation as cv
from homeassistant.util.json import JsonValueType

from .client import FairlaneClient, FairlaneError, FairlaneRequestError
from .const import CLASSES, DOCUMENT_TYPES, DOMAIN, EVENT_SUMMARY_DONE

_LOGGER = logging.getLogger(__name__)

ATTR_CONFIG_ENTRY = "config_entry_id"
SUMMARY_POLL_S = 2.0
MAX_FILES = 10_000

INDEX_SCHEMA = vol.Schema(
    {
        vol.Optional(ATTR_CONFIG_ENTRY): cv.string,
        vol.Required("path"): cv.string,
    }
)
SEARCH_SCHEMA = vol.Schema(
    {
        vol.Optional(ATTR_CONFIG_ENTRY): cv.string,
        vol.Required("query"): vol.All(cv.string, vol.Length(min=1)),
        vol.Optional("top_k", default=5): vol.All(vol.Coerce(int), vol.Range(min=1, max=50)),
        vol.Optional("class", default="chat"): vol.In(CLASSES),
    }
)
SUMMARIZE_SCHEMA = vol.All(
    vol.Schema(
        {
            vol.Optional(ATTR_CONFIG_ENTRY): cv.string,
            vol.Exclusive("document_id", "source"): cv.string,
            vol.Exclusive("text", "source"): vol.All(cv.string, vol.Length(min=1)),
            vol.Optional("style", default="short"): vol.In(["short", "bullets"]),
            vol.Optional("max_words", default=80): vol.All(
                vol.Coerce(int), vol.Range(min=10, max=400)
            ),
        }
    ),
    cv.has_at_least_one_key("document_id", "text"),
)


def async_setup_services(hass: HomeAssistant) -> None:
    """Register the actions (once, in `async_setup`)."""
    hass.services.async_register(
        DOMAIN,
        "index_documents",
        _index_documents,
        schema=INDEX_SCHEMA,
        supports_response=SupportsResponse.OPTIONAL,
    )
    hass.services.async_register(
        DOMAIN,
        "search_documents",
        _search_documents,
        schema=SEARCH_SCHEMA,
        supports_response=SupportsResponse.ONLY,
    )
    hass.services.async_register(
        DOMAIN,
        "summarize",
        _summarize,
        schema=SUMMARIZE_SCHEMA,
        supports_response=SupportsResponse.OPTIONAL,
    )


def _client(call: ServiceCall) -> FairlaneClient:
    """The client of the entry the call names, or of the only loaded entry."""
    entries = [
        entry
        for entry in call.hass.config_entries.async_entries(DOMAIN)
        if entry.state is ConfigEntryState.LOADED
    ]
    if (wanted := call.data.get(ATTR_CONFIG_ENTRY)) is not None:
        entries = [entry for entry in entries if entry.entry_id == wanted]
    if len(entries) != 1:
        raise ServiceValidationError(
            translation_domain=DOMAIN,
            translation_key="no_entry" if not entries else "which_entry",
        )
    client: FairlaneClient = entries[0].runtime_data.client
    return client


def _files(root: Path) -> list[Path]:
    """The documents under `root` (a file or a folder, walked), in a stable order."""
    if root.is_file():
        return [root]
    if not root.is_dir():
        raise FileNotFoundError(root)
    found = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in DOCUMENT_TYPES)
    return found[:MAX_FILES]


async def _index_documents(call: ServiceCall) -> ServiceResponse:
    """Send each supported file under the path; the server stores it before answering."""
    hass = call.hass
    client = _client(call)
    path = call.data["path"]
    if not hass.config.is_allowed_path(path):
        raise ServiceValidationError(
            translation_domain=DOMAIN,
            translation_key="path_not_allowed",
            translation_placeholders={"path": path},
        )
    try:
        files = await hass.async_add_executor_job(_files, Path(path))
    except FileNotFoundError as err:
        raise ServiceValidationError(
            translation_domain=DOMAIN,
            translation_key="path_not_found",
            translation_placeholders={"path": path},
        ) from err
    added: list[JsonValueType] = []
    refused: list[JsonValueType] = []
    unchanged = 0
    for file in files:
        content_type = DOCUMENT_TYPES.get(file.suffix.lower(), "text/plain")
        data = await hass.async_add_executor_job(file.read_bytes)
        try:
            document = await client.add_document(data, file.name, content_type, source=str(file))
        except FairlaneRequestError as err:  # this file is bad; the others may be fine
            refused.append({"path": str(file), "error": str(err)})
            continue
        except FairlaneError as err:
            raise _error(err) from err
        if document.get("unchanged"):
            unchanged += 1
        else:
            added.append(document["id"])
    if refused:
        _LOGGER.warning("The server refused %d file(s): %s", len(refused), refused)
    return {"added": added, "unchanged": unchanged, "refused": refused}


async def _search_documents(call: ServiceCall) -> ServiceResponse:
    client = _client(call)
    try:
        hits = await client.search(call.data["query"], call.data["top_k"], call.data["class"])
    except FairlaneError as err:
        raise _error(err) from err
    return {"results": cast(list[JsonValueType], hits)}


async def _summarize(call: ServiceCall) -> ServiceResponse:
    """Start a summary job; `fairlane_summary_done` fires when its result is stored."""
    client = _client(call)
    body = {k: v for k, v in call.data.items() if k != ATTR_CONFIG_ENTRY}
    try:
        job = await client.add_summary(body)
    except FairlaneError as err:
        raise _error(err) from err
    call.hass.async_create_background_task(
        _announce_summary(call.hass, client, job["id"]), f"{DOMAIN} summary {job['id']}"
    )
    return {"id": job["id"], "status": job["status"]}


async def _announce_summary(hass: HomeAssistant, client: FairlaneClient, summary_id: str) -> None:
    """Wait for the job (durable on the server, so a restart there only delays it)."""
    while True:
        await asyncio.sleep(SUMMARY_POLL_S)
        try:
            summary = await client.summary(summary_id)
        except FairlaneRequestError:
            _LOGGER.warning("Summary %s is gone from the server", summary_id)
            return
        except FairlaneError:
            continue  # unreachable for now; the job is stored there
        if summary["status"] in ("done", "failed"):
            break
    event: dict[str, Any] = {
        "id": summary_id,
        "document_id": summary.get("document_id"),
        "status": summary["status"],
        "summary": summary.get("result"),
        "error": summary.get("error"),
    }
    hass.bus.async_fire(EVENT_SUMMARY_DONE, event)


def _error(err: FairlaneError) -> HomeAssistantError:
    if isinstance(err, FairlaneRequestError):
        return ServiceValidationError(
            translation_domain=DOMAIN,
            translation_key="request_refused",
            translation_placeholders={"error": str(err)},
        )
    return HomeAssistantError(
        translation_domain=DOMAIN,
        translation_key="cannot_connect",
        translation_placeholders={"error": str(err)},
    )
