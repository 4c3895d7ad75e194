"""The document actions against the real server: index a folder, search it, summarise."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import voluptuous as vol
from homeassistant.core import HomeAssistant
from homeassistant.exceptions import ServiceValidationError
from pytest_homeassistant_custom_component.common import MockConfigEntry, async_capture_events

from custom_components.fairlane.const import DOMAIN, EVENT_SUMMARY_DONE

NOTES = {
    "boiler.md": "# Boiler\nThe boiler is serviced every October by Hughes Heating. "
    "The pressure gauge should read between 1 and 1.5 bar.",
    "bins.txt": "Bin collection: the green recycling bin goes out on Tuesday evenings, "
    "the black bin every other Friday.",
    "wifi.html": "<html><body><h1>Guest wifi</h1><p>The guest network is called Meadow "
    "and the password is on the fridge.</p></body></html>",
}


@pytest.fixture
def documents(hass: HomeAssistant, tmp_path: Path) -> Path:
    folder = tmp_path / "documents"
    (folder / "house").mkdir(parents=True)
    for name, text in NOTES.items():
        (folder / "house" / name).write_text(text)
    (folder / "house" / "photo.jpg").write_bytes(b"\xff\xd8 not a document")
    (folder / "broken.pdf").write_bytes(b"%PDF-1.4 this is not really a pdf")
    hass.config.allowlist_external_dirs = {str(tmp_path)}
    return folder


async def _indexed(hass: HomeAssistant, entry: MockConfigEntry, ids: list[str]) -> None:
    """Wait until the server has embedded every chunk of these documents."""
    client = entry.runtime_data.client
    for _ in range(600):
        documents = await client.documents()
        status = {d["id"]: d["status"] for d in documents}
        if all(status.get(i) == "indexed" for i in ids):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"not indexed: {status}")


async def test_index_a_folder_then_search_it(
    hass: HomeAssistant, entry: MockConfigEntry, documents: Path
) -> None:
    result = await hass.services.async_call(
        DOMAIN, "index_documents", {"path": str(documents)}, blocking=True, return_response=True
    )
    assert result is not None
    assert len(result["added"]) == 3  # the notes; the photo is not a document type
    assert [r["path"] for r in result["refused"]] == [str(documents / "broken.pdf")]
    assert "PDF" in result["refused"][0]["error"]

    # The same folder again: stored already, nothing is embedded twice.
    again = await hass.services.async_call(
        DOMAIN, "index_documents", {"path": str(documents)}, blocking=True, return_response=True
    )
    assert again is not None and again["added"] == [] and again["unchanged"] == 3

    await _indexed(hass, entry, result["added"])
    found = await hass.services.async_call(
        DOMAIN,
        "search_documents",
        {"query": "When does the recycling go out?", "top_k": 2},
        blocking=True,
        return_response=True,
    )
    assert found is not None
    assert "Tuesday" in found["results"][0]["text"]


async def test_paths_outside_the_allowlist_are_refused(
    hass: HomeAssistant, entry: MockConfigEntry, documents: Path
) -> None:
    with pytest.raises(ServiceValidationError, match="not in a folder"):
        await hass.services.async_call(
            DOMAIN, "index_documents", {"path": "/etc"}, blocking=True, return_response=True
        )
    with pytest.raises(ServiceValidationError, match="does not exist"):
        await hass.services.async_call(
            DOMAIN, "index_documents", {"path": str(documents / "missing")}, blocking=True,
            return_response=True,
        )


async def test_a_link_to_a_file_outside_the_allowed_folders_is_not_sent(
    hass: HomeAssistant, entry: MockConfigEntry, tmp_path: Path
) -> None:
    """The folder is allowed, but a link in it leads out of it: that file is not read."""
    allowed, secret = tmp_path / "allowed", tmp_path / "private" / "passwords.txt"
    allowed.mkdir()
    secret.parent.mkdir()
    secret.write_text("The safe code is 4711.")
    (allowed / "notes.txt").write_text("The plumber comes on Monday.")
    (allowed / "passwords.txt").symlink_to(secret)
    hass.config.allowlist_external_dirs = {str(allowed)}
    result = await hass.services.async_call(
        DOMAIN, "index_documents", {"path": str(allowed)}, blocking=True, return_response=True
    )
    assert result is not None
    assert len(result["added"]) + result["unchanged"] == 1
    assert result["refused"] == [{"path": str(allowed / "passwords.txt"),
                                  "error": "it links to a file outside the allowed folders"}]
    documents = await entry.runtime_data.client.documents()
    # The listing's fields, not its text: an id or a timestamp may hold the digits 4711.
    assert not any(d.get("source") == str(allowed / "passwords.txt")
                   or "passwords" in str(d.get("title")) or "4711" in str(d.get("title"))
                   for d in documents)


async def test_summarize_fires_an_event_with_the_stored_result(
    hass: HomeAssistant, entry: MockConfigEntry
) -> None:
    events = async_capture_events(hass, EVENT_SUMMARY_DONE)
    job = await hass.services.async_call(
        DOMAIN,
        "summarize",
        {"text": NOTES["boiler.md"] + " " + NOTES["bins.txt"], "max_words": 30},
        blocking=True,
        return_response=True,
    )
    assert job is not None and job["status"] == "pending"
    for _ in range(300):
        if events:
            break
        await asyncio.sleep(0.2)
    [event] = events
    assert event.data["id"] == job["id"] and event.data["status"] == "done"
    assert event.data["summary"] and len(event.data["summary"].split()) >= 3


async def test_bad_summary_requests_are_refused_before_the_server(
    hass: HomeAssistant, entry: MockConfigEntry
) -> None:
    with pytest.raises(vol.Invalid):
        await hass.services.async_call(DOMAIN, "summarize", {}, blocking=True)
    with pytest.raises(ServiceValidationError, match="refused the request"):
        await hass.services.async_call(
            DOMAIN, "summarize", {"document_id": "no-such-document"}, blocking=True
        )
