"""A full disk: uploads get a 507 that says so and store nothing; the indexer is not lost but
retried, `/health` says which part is failing, and everything works again once space returns.

The disk is filled the way SQLite sees it: `PRAGMA max_page_count` at the database's current
size makes every write that needs a new page fail with SQLITE_FULL, the error a full disk
gives."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fairlane.documents.text import chunk
from fairlane.server import BackgroundServer
from tests.server.conftest import server_config, wait_for
from tests.server.test_chat_api import http

NOTE = " ".join(
    f"Entry {i}: the boiler was serviced, the filter changed, the pressure set to 1.5 bar."
    for i in range(300)
)


@pytest.fixture(scope="module")
def server() -> Iterator[BackgroundServer]:
    with BackgroundServer(server_config()) as running:
        yield running


def _disk(server: BackgroundServer, full: bool) -> None:
    store = server.services.documents
    assert store is not None
    with store._lock:
        pages = store._db.execute("PRAGMA page_count").fetchone()[0]
        store._db.execute(f"PRAGMA max_page_count = {pages if full else 1_073_741_823}")


def test_an_upload_to_a_full_disk_is_a_507_and_stores_nothing(server: BackgroundServer) -> None:
    _disk(server, full=True)
    try:
        status, reply = http(server, "POST", "/v1/documents", {"text": NOTE, "title": "Boiler"})
    finally:
        _disk(server, full=False)
    assert status == 507, reply
    assert reply["error"]["code"] == "insufficient_storage"
    assert "disk is full" in reply["error"]["message"]
    assert http(server, "GET", "/v1/documents")[1]["data"] == []
    # Space is back: the same upload is stored (the failed transaction left nothing open).
    status, reply = http(server, "POST", "/v1/documents", {"text": NOTE, "title": "Boiler"})
    assert status == 202, reply


def test_the_indexer_is_retried_and_health_says_so_until_space_returns(
        server: BackgroundServer) -> None:
    svc = server.services
    assert svc.documents is not None and svc.embedder is not None
    wait_for(lambda: http(server, "GET", "/health")[1]["components"]["indexer"]["state"] == "ok")
    # A document stored while there was space; its vectors come when the indexer wakes.
    text = NOTE.replace("boiler", "water heater")
    document_id, _ = svc.documents.add(
        text, chunk(svc.embedder, text), "Water heater", None, [], "text/plain"
    )
    _disk(server, full=True)
    try:
        server.loop.call_soon_threadsafe(svc.index_wakeup.set)
        health = wait_for(lambda: (h := http(server, "GET", "/health")[1])["status"] ==
                           "degraded" and h)
        indexer = health["components"]["indexer"]
        assert indexer["state"] == "retrying" and indexer["error"] == "the disk is full"
        # Its retries fail too, and it never says it is well in between: reading what is
        # pending works on a full disk, which once reset the count to 0 (and /health to ok)
        # before every retry.
        wait_for(lambda: http(server, "GET", "/health")[1]["components"]["indexer"][
            "failures"] >= 2)
    finally:
        _disk(server, full=False)
    # The next try succeeds: the document is indexed and the server is healthy again.
    wait_for(lambda: http(server, "GET", f"/v1/documents/{document_id}")[1]["status"] ==
              "indexed")
    health = http(server, "GET", "/health")[1]
    assert health["status"] == "ok" and health["components"]["indexer"]["failures"] == 0


def test_a_long_document_is_chunked_in_one_pass(server: BackgroundServer) -> None:
    """The tokenizer's offsets are read once per document: read per chunk (each read copies
    them all), accepting a 1 MB document took 281 s."""
    embedder = server.services.embedder
    assert embedder is not None
    reads = 0

    class Counted:
        def __init__(self, encoding: object) -> None:
            self.encoding = encoding

        def __getattr__(self, name: str) -> object:
            nonlocal reads
            reads += name in ("offsets", "ids")
            return getattr(self.encoding, name)

    class Tokenizer:
        def __init__(self, inner: object) -> None:
            self.inner = inner

        def encode(self, *args: object, **kwargs: object) -> Counted:
            return Counted(self.inner.encode(*args, **kwargs))  # type: ignore[attr-defined]

    real = embedder.tokenizer_full
    embedder.tokenizer_full = Tokenizer(real)
    try:
        chunks = chunk(embedder, NOTE * 4)
    finally:
        embedder.tokenizer_full = real
    assert len(chunks) > 10
    assert reads == 2  # the ids and the offsets, once each
