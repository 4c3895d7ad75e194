"""The household document index: durable in SQLite before it is acknowledged, indexed once.

A document and all its chunks are written in one transaction (WAL, synchronous=FULL) before the
HTTP request is answered. Indexing is the state in the database: a chunk without a vector is
work to do. The indexer embeds such chunks through the device loop as `background` work and
writes each vector with `UPDATE … WHERE vector IS NULL`, so after a crash (even kill -9) every
acknowledged document is indexed exactly once: nothing is lost and no chunk is duplicated.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

SCHEMA = """
CREATE TABLE IF NOT EXISTS documents (
    id TEXT PRIMARY KEY,
    sha256 TEXT NOT NULL UNIQUE,
    title TEXT NOT NULL,
    source TEXT,
    tags TEXT NOT NULL,
    content_type TEXT NOT NULL,
    created_at REAL NOT NULL,
    chunks_total INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS chunks (
    id INTEGER PRIMARY KEY,
    document_id TEXT NOT NULL REFERENCES documents(id) ON DELETE CASCADE,
    seq INTEGER NOT NULL,
    text TEXT NOT NULL,
    tokens TEXT NOT NULL,
    vector BLOB,
    indexed_at REAL,
    UNIQUE (document_id, seq)
);
CREATE INDEX IF NOT EXISTS chunks_todo ON chunks (vector) WHERE vector IS NULL;
CREATE TABLE IF NOT EXISTS summaries (
    id TEXT PRIMARY KEY,
    document_id TEXT,
    text TEXT NOT NULL,
    style TEXT NOT NULL,
    max_words INTEGER NOT NULL,
    status TEXT NOT NULL,          -- pending, done, failed
    result TEXT,
    error TEXT,
    created_at REAL NOT NULL,
    finished_at REAL
);
"""


@dataclass(frozen=True)
class Hit:
    document_id: str
    title: str
    seq: int
    score: float
    text: str


class DocumentStore:
    """SQLite storage and the in-memory search matrix of indexed chunks."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("PRAGMA foreign_keys=ON")
        self._db.executescript(SCHEMA)
        self._lock = threading.Lock()
        self._ids: list[tuple[str, int]] = []
        self._matrix = np.zeros((0, 0), dtype=np.float32)
        self._load_index()

    def close(self) -> None:
        self._db.close()

    # --- writes ------------------------------------------------------------------------------

    def add(
        self,
        text: str,
        chunks: list[tuple[str, list[int]]],
        title: str,
        source: str | None,
        tags: list[str],
        content_type: str,
    ) -> tuple[str, bool]:
        """Store a document and its chunks in one transaction; (id, created)."""
        digest = hashlib.sha256(text.encode()).hexdigest()
        with self._lock:
            row = self._db.execute(
                "SELECT id FROM documents WHERE sha256 = ?", (digest,)
            ).fetchone()
            if row is not None:
                return str(row[0]), False  # unchanged: nothing to embed again
            document_id = f"doc-{uuid.uuid4().hex[:16]}"
            with self._transaction():
                self._db.execute(
                    "INSERT INTO documents VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        document_id,
                        digest,
                        title,
                        source,
                        json.dumps(tags),
                        content_type,
                        time.time(),
                        len(chunks),
                    ),
                )
                self._db.executemany(
                    "INSERT INTO chunks (document_id, seq, text, tokens) VALUES (?, ?, ?, ?)",
                    [
                        (document_id, seq, chunk, json.dumps(tokens))
                        for seq, (chunk, tokens) in enumerate(chunks)
                    ],
                )
            return document_id, True

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        """BEGIN … COMMIT, rolled back on any failure (a full disk included): a transaction
        left open would make every later write on this connection fail too."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
            self._db.execute("COMMIT")
        except BaseException:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            raise

    def delete(self, document_id: str) -> bool:
        with self._lock, self._transaction():
            cursor = self._db.execute("DELETE FROM documents WHERE id = ?", (document_id,))
            self._db.execute("DELETE FROM chunks WHERE document_id = ?", (document_id,))
            keep = [i for i, (doc, _) in enumerate(self._ids) if doc != document_id]
            self._ids = [self._ids[i] for i in keep]
            self._matrix = self._matrix[keep] if len(self._matrix) else self._matrix
            return cursor.rowcount > 0

    def pending(self, limit: int) -> list[tuple[int, str, list[int]]]:
        """Chunks still without a vector, oldest documents first: (chunk id, document, tokens)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT c.id, c.document_id, c.tokens FROM chunks c "
                "JOIN documents d ON d.id = c.document_id "
                "WHERE c.vector IS NULL ORDER BY d.created_at, c.seq LIMIT ?",
                (limit,),
            ).fetchall()
        return [(int(r[0]), str(r[1]), json.loads(r[2])) for r in rows]

    def store_vectors(self, items: list[tuple[int, np.ndarray]]) -> None:
        """Write vectors once (a chunk that already has one keeps it) and index them."""
        now = time.time()
        with self._lock:
            written = []
            with self._transaction():
                for chunk_id, vector in items:
                    cursor = self._db.execute(
                        "UPDATE chunks SET vector = ?, indexed_at = ? "
                        "WHERE id = ? AND vector IS NULL",
                        (vector.astype(np.float32).tobytes(), now, chunk_id),
                    )
                    if cursor.rowcount:
                        written.append(chunk_id)
            if written:
                rows = self._db.execute(
                    f"SELECT document_id, seq, vector FROM chunks WHERE id IN "
                    f"({','.join('?' * len(written))})",
                    written,
                ).fetchall()
                self._append(
                    [(str(r[0]), int(r[1])) for r in rows],
                    np.stack([np.frombuffer(r[2], dtype=np.float32) for r in rows]),
                )

    def _load_index(self) -> None:
        rows = self._db.execute(
            "SELECT document_id, seq, vector FROM chunks WHERE vector IS NOT NULL"
        ).fetchall()
        if rows:
            self._append(
                [(str(r[0]), int(r[1])) for r in rows],
                np.stack([np.frombuffer(r[2], dtype=np.float32) for r in rows]),
            )

    def _append(self, ids: list[tuple[str, int]], vectors: np.ndarray) -> None:
        self._ids.extend(ids)
        self._matrix = vectors if self._matrix.size == 0 else np.vstack([self._matrix, vectors])

    # --- summaries -------------------------------------------------------------------------

    def document_text(self, document_id: str) -> str | None:
        """The document's text, joined from its chunks (overlaps included once is not needed)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT text FROM chunks WHERE document_id = ? ORDER BY seq", (document_id,)
            ).fetchall()
        return "\n".join(str(r[0]) for r in rows) if rows else None

    def add_summary(self, text: str, document_id: str | None, style: str, max_words: int) -> str:
        """Store a summary job durably; it runs in the background lane."""
        summary_id = f"sum-{uuid.uuid4().hex[:16]}"
        with self._lock:
            self._db.execute(
                "INSERT INTO summaries (id, document_id, text, style, max_words, status, "
                "created_at) VALUES (?, ?, ?, ?, ?, 'pending', ?)",
                (summary_id, document_id, text, style, max_words, time.time()),
            )
        return summary_id

    def pending_summaries(self) -> list[dict[str, Any]]:
        with self._lock:
            rows = self._db.execute(
                "SELECT id, text, style, max_words FROM summaries WHERE status = 'pending' "
                "ORDER BY created_at"
            ).fetchall()
        return [{"id": r[0], "text": r[1], "style": r[2], "max_words": r[3]} for r in rows]

    def finish_summary(self, summary_id: str, result: str | None, error: str | None) -> None:
        with self._lock:
            self._db.execute(
                "UPDATE summaries SET status = ?, result = ?, error = ?, finished_at = ? "
                "WHERE id = ?",
                ("done" if error is None else "failed", result, error, time.time(), summary_id),
            )

    def summaries(self, summary_id: str | None = None) -> list[dict[str, Any]]:
        query = (
            "SELECT id, document_id, style, max_words, status, result, error, created_at, "
            "finished_at FROM summaries"
        )
        args: tuple[Any, ...] = ()
        if summary_id is not None:
            query += " WHERE id = ?"
            args = (summary_id,)
        with self._lock:
            rows = self._db.execute(query + " ORDER BY created_at", args).fetchall()
        keys = (
            "id",
            "document_id",
            "style",
            "max_words",
            "status",
            "result",
            "error",
            "created_at",
            "finished_at",
        )
        return [dict(zip(keys, r, strict=True)) for r in rows]

    # --- reads -------------------------------------------------------------------------------

    def search(self, query: np.ndarray, top_k: int) -> list[Hit]:
        """Brute force over the in-memory matrix: household scale fits in memory."""
        with self._lock:
            if not self._ids:
                return []
            scores = self._matrix @ query.astype(np.float32)
            best = np.argsort(-scores)[:top_k]
            picked = [(self._ids[i], float(scores[i])) for i in best]
        hits = []
        for (document_id, seq), score in picked:
            row = self._db.execute(
                "SELECT d.title, c.text FROM chunks c JOIN documents d ON d.id = c.document_id "
                "WHERE c.document_id = ? AND c.seq = ?",
                (document_id, seq),
            ).fetchone()
            if row is not None:
                hits.append(Hit(document_id, str(row[0]), seq, round(score, 4), str(row[1])))
        return hits

    def documents(self, document_id: str | None = None) -> list[dict[str, Any]]:
        query = (
            "SELECT d.id, d.title, d.source, d.tags, d.content_type, d.created_at, "
            "d.chunks_total, COUNT(c.vector), MIN(c.indexed_at), MAX(c.indexed_at) "
            "FROM documents d LEFT JOIN chunks c ON c.document_id = d.id "
        )
        args: tuple[Any, ...] = ()
        if document_id is not None:
            query += "WHERE d.id = ? "
            args = (document_id,)
        query += "GROUP BY d.id ORDER BY d.created_at"
        with self._lock:
            rows = self._db.execute(query, args).fetchall()
        return [
            {
                "id": r[0],
                "title": r[1],
                "source": r[2],
                "tags": json.loads(r[3]),
                "content_type": r[4],
                "created_at": r[5],
                "chunks_total": r[6],
                "chunks_done": r[7],
                "status": "indexed" if r[7] == r[6] else "indexing",
                "first_indexed_at": r[8],
                "last_indexed_at": r[9],
            }
            for r in rows
        ]


def progress(
    documents: list[dict[str, Any]], started: float, clock: Callable[[], float] = time.time
) -> dict[str, Any]:
    """Indexing progress over documents: counts, rate and ETA."""
    total = sum(d["chunks_total"] for d in documents)
    done = sum(d["chunks_done"] for d in documents)
    elapsed = max(clock() - started, 1e-6)
    recent = [d for d in documents if d["last_indexed_at"] and d["last_indexed_at"] >= started]
    rate = sum(d["chunks_done"] for d in recent) / elapsed if recent else 0.0
    return {
        "documents_total": len(documents),
        "documents_done": sum(1 for d in documents if d["status"] == "indexed"),
        "chunks_total": total,
        "chunks_done": done,
        "chunks_per_s": round(rate, 2),
        "eta_s": round((total - done) / rate, 1) if rate > 0 and done < total else 0.0,
    }
