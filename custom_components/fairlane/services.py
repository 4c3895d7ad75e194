"""Actions: index household documents, search them, summarise a document or a text."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any, cast

from homeassistant.config_entries import ConfigEntryState
from homeassistant.core import HomeAssistant, ServiceCall, ServiceResponse, SupportsResponse
from homeassistant.exceptions import HomeAssistantError, ServiceValidationError
from homeassistant.helpers import config_validation as cv
from homeassistant.util.json import JsonValueType

from .client import FairlaneClient, FairlaneError, FairlaneRequestError
from .const import (
    CLASSES,
    DOCUMENT_TYPES,
    DOMAIN,
    EVENT_SUMMARY_DONE,
    SUMMARY_DEADLINE_S,
    SUMMARY_POLL_S,
)
from .coordinator import FairlaneConfigEntry
from .schema import vol

_LOGGER = logging.getLogger(__name__)

ATTR_CONFIG_ENTRY = "config_entry_id"
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


def _entry(call: ServiceCall) -> FairlaneConfigEntry:
    """The loaded entry the call names, or the only loaded entry."""
    entries: list[FairlaneConfigEntry] = [
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
    return entries[0]


def _client(call: ServiceCall) -> FairlaneClient:
    client: FairlaneClient = _entry(call).runtime_data.client
    return client


class PathNotAllowed(Exception):
    """The path asked for is outside the folders Home Assistant may read."""


def _files(hass: HomeAssistant, path: str) -> tuple[list[Path], list[str]]:
    """The documents under `path` (a file, or a folder walked in a stable order) that Home
    Assistant may read, and the ones it may not: each file is checked where it really is, so a
    link inside an allowed folder to a file outside it is refused. Blocking: in the executor."""
    if not hass.config.is_allowed_path(path):
        raise PathNotAllowed(path)
    root = Path(path)
    if root.is_file():
        found = [root]
    elif root.is_dir():
        found = sorted(
            p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in DOCUMENT_TYPES
        )
    else:
        raise FileNotFoundError(path)
    allowed: list[Path] = []
    outside: list[str] = []
    for file in found[:MAX_FILES]:
        if hass.config.is_allowed_path(str(file.resolve())):
            allowed.append(file)
        else:
            outside.append(str(file))
    return allowed, outside


async def _index_documents(call: ServiceCall) -> ServiceResponse:
    """Send each supported file under the path; the server stores it before answering."""
    hass = call.hass
    client = _client(call)
    path = call.data["path"]
    try:
        files, outside = await hass.async_add_executor_job(_files, hass, path)
    except PathNotAllowed as err:
        raise ServiceValidationError(
            translation_domain=DOMAIN,
            translation_key="path_not_allowed",
            translation_placeholders={"path": path},
        ) from err
    except FileNotFoundError as err:
        raise ServiceValidationError(
            translation_domain=DOMAIN,
            translation_key="path_not_found",
            translation_placeholders={"path": path},
        ) from err
    added: list[JsonValueType] = []
    refused: list[JsonValueType] = [
        {"path": file, "error": "it links to a file outside the allowed folders"}
        for file in outside
    ]
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
            added.append(document.get("id"))
    if refused:
        _LOGGER.warning("%d file(s) were not indexed: %s", len(refused), refused)
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
    entry = _entry(call)
    client: FairlaneClient = entry.runtime_data.client
    body = {k: v for k, v in call.data.items() if k != ATTR_CONFIG_ENTRY}
    try:
        job = await client.add_summary(body)
    except FairlaneError as err:
        raise _error(err) from err
    # The entry's task: unloading the entry (or stopping Home Assistant) ends the wait.
    entry.async_create_background_task(
        call.hass,
        _announce_summary(call.hass, client, job["id"]),
        f"{DOMAIN} summary {job['id']}",
    )
    return {"id": job["id"], "status": job["status"]}


async def _announce_summary(hass: HomeAssistant, client: FairlaneClient, summary_id: str) -> None:
    """Wait for the job (durable on the server, so a restart there only delays it), until
    `SUMMARY_DEADLINE_S`; then the event says Home Assistant stopped waiting."""
    summary: dict[str, Any] = {"status": "pending"}
    deadline = hass.loop.time() + SUMMARY_DEADLINE_S
    while hass.loop.time() < deadline:
        await asyncio.sleep(SUMMARY_POLL_S)
        try:
            summary = await client.summary(summary_id)
        except FairlaneRequestError:
            _LOGGER.warning("Summary %s is gone from the server", summary_id)
            return
        except FairlaneError:
            continue  # unreachable for now; the job is stored there
        if summary.get("status") in ("done", "failed"):
            break
    else:
        summary = {
            "status": "timeout",
            "error": f"no result after {SUMMARY_DEADLINE_S / 60:.0f} minutes; the job stays on "
            "the server",
        }
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
