"""Pulls the server runs: a model named in the config that is not here yet, and those asked
for over HTTP (`POST /v1/models/pull`). Each runs on a thread of its own while the server
serves on, shows its bytes, rate and time left (`/health`, `GET /v1/models/pull/{id}`), may be
cancelled, and is durable: the pulls asked for are written to the data directory before the
answer, and those not finished go on when the server starts again (from the bytes they had).
A pulled model is served after a restart: the LLM engine is not swapped under running
requests, and the log and /health say plainly that a restart is due."""

from __future__ import annotations

import json
import logging
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fairlane.engines import catalogue, pull
from fairlane.engines.catalogue import HubFile
from fairlane.engines.models import DEFAULT_LLM, ModelError

_LOGGER = logging.getLogger(__name__)


class Cancelled(Exception):
    """A pull cancelled by its client: it stops at its next piece (its bytes are kept)."""


@dataclass
class BackgroundPull:
    """One pull the server runs: its progress, then done, failed or cancelled."""

    model: str
    hub_file: HubFile
    id: str = field(default_factory=lambda: f"pull-{uuid.uuid4().hex[:12]}")
    state: str = "pulling"  # then "done" (a restart serves it), "failed" or "cancelled"
    progress: pull.Progress | None = None
    error: str | None = None
    on_end: Any = None  # called with the pull when it ends (the jobs' record)
    _cancel: threading.Event = field(default_factory=threading.Event, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="fairlane-pull", daemon=True)
        self._thread.start()

    def cancel(self) -> None:
        self._cancel.set()

    def _run(self) -> None:
        try:
            path = pull.pull(self.hub_file, progress=self._note)
        except Cancelled:
            self.state = "cancelled"
            self._ended()
            return
        except ModelError as err:
            self.state, self.error = "failed", str(err)
            _LOGGER.error("Pulling %s failed: %s", self.model, err)
            self._ended()
            return
        except Exception as err:  # the hub's own errors (HTTP, connection): said, not lost
            self.state, self.error = "failed", f"{type(err).__name__}: {err}"
            _LOGGER.error("Pulling %s failed: %r", self.model, err)
            self._ended()
            return
        self.state = "done"
        self._ended()
        _LOGGER.warning("Pulled %s to %s: restart the server to serve it (it serves %s until "
                        "then)", self.model, path, DEFAULT_LLM)

    def _note(self, progress: pull.Progress) -> None:
        self.progress = progress
        if self._cancel.is_set():
            raise Cancelled(self.model)

    def _ended(self) -> None:
        if self.on_end is not None:
            self.on_end(self)

    def as_dict(self) -> dict[str, Any]:
        done = self.progress
        return {
            "id": self.id, "object": "model.pull",
            "model": self.model, "file": self.hub_file.label, "state": self.state,
            "bytes_done": done.done if done else 0, "bytes_total": done.total if done else None,
            "rate_bytes_s": round(done.rate) if done else 0,
            "eta_s": round(done.eta_s) if done and done.eta_s is not None else None,
            "restart_needed": self.state == "done", "error": self.error,
        }


def llm_to_load(configured: str) -> tuple[str, BackgroundPull | None]:
    """The LLM to load now (a path or a packaged name), and the pull to start when the
    configured model is a catalogue name or a hub reference not pulled yet."""
    if not catalogue.is_reference(configured):
        return configured, None
    found = catalogue.reference(configured)
    assert isinstance(found, HubFile)
    if found.file is not None and (here := pull.destination(found)).exists():
        return str(here), None
    _LOGGER.warning("%s is not here yet: serving %s while it is pulled", configured, DEFAULT_LLM)
    return DEFAULT_LLM, BackgroundPull(configured, found)


class PullJobs:
    """The server's pulls, and their record in the data directory (`pulls.json`: the models
    asked for and not yet done, written before a pull is acknowledged)."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / "pulls.json"
        self.pulls: list[BackgroundPull] = []
        self._lock = threading.Lock()

    def start(self, model: str) -> BackgroundPull:
        """The pull of this model: one already running for its file, or a new one, recorded
        and started. ModelError for a model that is no reference."""
        found = catalogue.reference(model)
        if not isinstance(found, HubFile):
            raise ModelError(f"{model!r} is packaged: it comes with Fairlane, nothing to pull")
        with self._lock:
            for running in self.pulls:
                if running.hub_file == found and running.state == "pulling":
                    return running
            job = BackgroundPull(model, found, on_end=self._ended)
            self.pulls.append(job)
            self._save()
        job.start()
        return job

    def adopt(self, job: BackgroundPull) -> None:
        """A pull started elsewhere (the config's), listed and recorded with the others."""
        with self._lock:
            job.on_end = self._ended
            self.pulls.append(job)
            self._save()

    def resume(self) -> None:
        """Start again every recorded pull that had not finished (a restart)."""
        try:
            models = json.loads(self.path.read_text()) if self.path.exists() else []
        except (OSError, ValueError) as err:
            _LOGGER.warning("The record of pulls %s cannot be read: %s", self.path, err)
            return
        for model in models:
            try:
                self.start(str(model))
            except ModelError as err:
                _LOGGER.warning("A recorded pull of %s is not resumed: %s", model, err)

    def find(self, job_id: str) -> BackgroundPull | None:
        return next((job for job in self.pulls if job.id == job_id), None)

    def _ended(self, job: BackgroundPull) -> None:
        with self._lock:
            self._save()

    def _save(self) -> None:
        waiting = sorted({job.model for job in self.pulls if job.state == "pulling"})
        temporary = self.path.with_suffix(".tmp")
        temporary.write_text(json.dumps(waiting))
        temporary.replace(self.path)
