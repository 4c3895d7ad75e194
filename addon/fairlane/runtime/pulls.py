"""A model named in the config that is not here yet: pulled in the background while the server
serves the embedded default, shown in /health, and served after a restart (the LLM engine is
not swapped under running requests: the log and /health say plainly that a restart is due)."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any

from fairlane.engines import catalogue, pull
from fairlane.engines.catalogue import HubFile
from fairlane.engines.models import DEFAULT_LLM, ModelError

_LOGGER = logging.getLogger(__name__)


@dataclass
class BackgroundPull:
    """One pull the server runs for its own config: its progress, then done or failed."""

    model: str
    hub_file: HubFile
    state: str = "pulling"  # then "done" (a restart serves it) or "failed"
    progress: pull.Progress | None = None
    error: str | None = None
    _thread: threading.Thread | None = field(default=None, repr=False)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="fairlane-pull", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            path = pull.pull(self.hub_file, progress=self._note)
        except ModelError as err:
            self.state, self.error = "failed", str(err)
            _LOGGER.error("Pulling %s failed: %s", self.model, err)
            return
        except Exception as err:  # the hub's own errors (HTTP, connection): said, not lost
            self.state, self.error = "failed", f"{type(err).__name__}: {err}"
            _LOGGER.error("Pulling %s failed: %r", self.model, err)
            return
        self.state = "done"
        _LOGGER.warning("Pulled %s to %s: restart the server to serve it (it serves %s until "
                        "then)", self.model, path, DEFAULT_LLM)

    def _note(self, progress: pull.Progress) -> None:
        self.progress = progress

    def as_dict(self) -> dict[str, Any]:
        done = self.progress
        return {
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
