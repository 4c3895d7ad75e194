"""Pulling a model from a Hugging Face hub: resumed, verified, atomic, one at a time per file.

`pull` fetches one GGUF file with huggingface_hub (its HEAD for the size and the sha256 the hub
keeps as the file's ETag, its `http_get` with Range to go on from what an earlier try left),
into `<models>/hub/OWNER/REPO/FILE`:
- before a byte comes: refused with the numbers when the disk cannot hold it, or when the memory
  it will run in cannot (a GGUF needs about its own size, plus the context);
- resumed: the partial file is Fairlane's (`.pull/FILE.<sha256>.partial`, kept across
  restarts: huggingface_hub's own download starts a new temporary file in every process), and
  the rest is asked for by Range, after a dropped connection (huggingface_hub retries) or a
  restart of the server or the machine;
- verified: the whole file's sha256 against the hub's; a file that differs is deleted and the
  pull fails saying so (it starts from nothing the next time);
- atomic: the file appears at its path only whole and verified;
- shared: a second pull of the same file waits for the first (a lock file) and gets its result.
The hub is `HF_ENDPOINT` (or huggingface.co); the tests use a local stand-in.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fairlane.engines.catalogue import HubFile, memory_gb
from fairlane.engines.models import ModelError, cache_dir, file_sha256

OVERHEAD_GB = 0.5  # the context and the runtime beside a model's weights, roughly
FREE_DISK_MARGIN = 1.05  # a pull leaves this much more than the file free on its disk


class PullError(ModelError):
    """A pull that cannot or did not succeed; the message says why, with the numbers."""


@dataclass
class Progress:
    """What a pull has done so far (read by the jobs, the CLI and /health)."""

    label: str
    total: int | None = None
    done: int = 0
    started: float = field(default_factory=time.monotonic)
    resumed_from: int = 0

    @property
    def rate(self) -> float:
        """Bytes a second since this try started."""
        elapsed = time.monotonic() - self.started
        return (self.done - self.resumed_from) / elapsed if elapsed > 0 else 0.0

    @property
    def eta_s(self) -> float | None:
        if self.total is None or self.rate <= 0:
            return None
        return (self.total - self.done) / self.rate


def destination(hub_file: HubFile, models: Path | None = None) -> Path:
    assert hub_file.file is not None
    return (models or cache_dir()) / "hub" / hub_file.repo / hub_file.file


def pull(
    hub_file: HubFile,
    progress: Callable[[Progress], None] | None = None,
    models: Path | None = None,
    endpoint: str | None = None,
    memory_available_gb: float | None = None,
) -> Path:
    """The file, pulled (or already here, verified); PullError when it cannot be."""
    from huggingface_hub import HfApi, get_hf_file_metadata, hf_hub_url
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import build_hf_headers  # type: ignore[attr-defined]

    endpoint = endpoint or os.environ.get("HF_ENDPOINT") or None
    if hub_file.file is None:
        hub_file = _by_quant(HfApi(endpoint=endpoint), hub_file)
    target = destination(hub_file, models)
    target.parent.mkdir(parents=True, exist_ok=True)
    with _only_one(target):
        meta = get_hf_file_metadata(
            hf_hub_url(hub_file.repo, hub_file.file or "", revision=hub_file.revision,
                       endpoint=endpoint)
        )
        sha256 = _sha256_of(meta.etag)
        if target.exists() and (sha256 is None or file_sha256(target) == sha256):
            return target
        size = int(meta.size or 0)
        staging = target.parent / ".pull"
        _check_room(size, staging, memory_available_gb)
        state = Progress(hub_file.label, size or None)
        path = _partial(staging, hub_file, sha256 or meta.etag or "")
        done = path.stat().st_size if path.exists() else 0
        if size and done > size:  # not this file's bytes: start over
            path.unlink()
            done = 0
        with path.open("r+b" if done else "wb") as partial:
            partial.seek(done)
            http_get(meta.location, partial, resume_size=done, headers=build_hf_headers(),
                     expected_size=size or None, tqdm_class=_reporter(state, progress))
        if sha256 is not None and file_sha256(path) != sha256:
            path.unlink()
            raise PullError(
                f"{hub_file.label}: the file's sha256 is not the hub's ({sha256[:12]}…); it "
                "was deleted, and a new pull starts from the beginning"
            )
        os.replace(path, target)  # atomic: the same filesystem
        state.done = size
        if progress is not None:
            progress(state)
        return target


def remove(hub_file: HubFile, models: Path | None = None) -> bool:
    """Delete a pulled file and whatever a pull of it left; whether there was one."""
    target = destination(hub_file, models)
    existed = target.exists()
    target.unlink(missing_ok=True)
    for partial in (target.parent / ".pull").glob(f"{target.name}.*.partial"):
        partial.unlink()
    return existed


def pulled(models: Path | None = None) -> list[tuple[str, int]]:
    """The pulled files (`OWNER/REPO/FILE`, bytes)."""
    hub = (models or cache_dir()) / "hub"
    return sorted(
        (str(path.relative_to(hub)), path.stat().st_size)
        for path in hub.glob("*/*/**/*.gguf") if ".pull" not in path.parts
    ) if hub.exists() else []


def _by_quant(api: Any, hub_file: HubFile) -> HubFile:
    """The repository's one GGUF file whose name holds the quantisation."""
    try:
        files = api.list_repo_files(hub_file.repo, revision=hub_file.revision)
    except Exception as err:  # huggingface_hub raises its own HTTP errors
        raise PullError(f"{hub_file.repo}: the repository cannot be read: {err}") from err
    quant = (hub_file.quant or "").casefold()
    matches = [f for f in files if f.endswith(".gguf") and quant in f.casefold()]
    if len(matches) != 1:
        raise PullError(
            f"{hub_file.label}: {len(matches)} GGUF files match ({', '.join(matches) or 'none'});"
            " name the file with hf:OWNER/REPO/FILE.gguf"
        )
    return HubFile(hub_file.repo, matches[0], revision=hub_file.revision)


def _check_room(size: int, staging: Path, memory_available_gb: float | None) -> None:
    staging.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(staging).free
    if size and free < size * FREE_DISK_MARGIN:
        raise PullError(
            f"the model has {size / 1e9:.2f} GB and its disk {free / 1e9:.2f} GB free "
            f"({staging}); free some space or set FAIRLANE_MODEL_DIR to a larger disk"
        )
    available = memory_available_gb if memory_available_gb is not None else memory_gb(
        "MemAvailable")
    needs = size / 1024**3 + OVERHEAD_GB
    if size and needs > available:
        raise PullError(
            f"the model needs about {needs:.1f} GB of memory to run and {available:.1f} GB is "
            "available; choose a smaller one (`fairlane models list`)"
        )


def _partial(staging: Path, hub_file: HubFile, version: str) -> Path:
    """Where a file's download is kept until it is whole: one per version of the file."""
    name = Path(hub_file.file or "").name
    return staging / f"{name}.{version.strip(chr(34))[:64]}.partial"


def _sha256_of(etag: str | None) -> str | None:
    """The hub's ETag of a large (LFS) file is its sha256; a small file's is not."""
    if etag and len(etag) == 64 and all(c in "0123456789abcdef" for c in etag.lower()):
        return etag.lower()
    return None


@contextmanager
def _only_one(target: Path) -> Iterator[None]:
    """One pull of a file at a time, across processes: the second waits for the first."""
    with open(target.with_name(target.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _reporter(state: Progress, report: Callable[[Progress], None] | None) -> Any:
    """A tqdm class huggingface_hub reports its download's bytes to."""
    from tqdm.auto import tqdm

    class Reporter(tqdm):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)
            if kwargs.get("total"):
                state.total = int(kwargs["total"])
            state.done = state.resumed_from = int(kwargs.get("initial") or 0)  # a resume

        def update(self, n: float | None = 1) -> bool | None:
            state.done += int(n or 0)
            if report is not None:
                report(state)
            return None

    return Reporter
