"""Pulling a model from a hub, against a local stand-in for it (tests/hub/standin.py): the
catalogue's references, a pull verified and atomic, resumed after a dropped connection and
after the puller was killed, a corrupted file refused, no room refused with the numbers, two
pulls of one file made one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from fairlane.engines import catalogue, pull
from fairlane.engines.catalogue import HubFile
from tests.hub.standin import Hub
from tests.server.conftest import wait_for

REPO = "household/tiny-GGUF"
NAME = "tiny-Q4_K_M.gguf"
# Larger than huggingface_hub's read (10 MB): what it has written is what a resume keeps.
SIZE = 24 * 1024 * 1024


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[Hub]:
    model = tmp_path / "served.gguf"
    model.write_bytes(os.urandom(SIZE))
    with Hub() as running:
        running.add(REPO, NAME, model)
        running.add(REPO, "tiny-Q8_0.gguf", model)
        yield running


def _pull(hub: Hub, tmp_path: Path, **kwargs: object) -> Path:
    return pull.pull(HubFile(REPO, NAME), models=tmp_path / "models", endpoint=hub.url,
                     **kwargs)  # type: ignore[arg-type]


def test_every_catalogue_model_is_a_reference_and_every_tier_has_a_model() -> None:
    for entry in catalogue.load():
        if entry.role == "conversation":
            assert catalogue.reference(entry.name)  # a hub file, or the packaged model
    for tier in catalogue.TIERS:
        for role in catalogue.ROLES:
            assert catalogue.recommended(role, tier), (role, tier)
    assert catalogue.reference("hf:a/b/c.gguf") == HubFile("a/b", "c.gguf")
    assert catalogue.reference("a/b:Q4_K_M") == HubFile("a/b", None, "Q4_K_M")
    with pytest.raises(pull.ModelError, match="not a catalogue model"):
        catalogue.reference("llama")


def test_a_pull_arrives_verified_with_its_progress(hub: Hub, tmp_path: Path) -> None:
    seen: list[tuple[int, int | None]] = []
    path = _pull(hub, tmp_path, progress=lambda p: seen.append((p.done, p.total)))
    assert path == tmp_path / "models" / "hub" / REPO / NAME
    assert path.read_bytes() == next(iter(hub.files[REPO].values())).read_bytes()
    assert seen[-1] == (SIZE, SIZE) and len(seen) > 1
    assert _pull(hub, tmp_path) == path  # already here: verified, not fetched again
    assert len(hub.downloads) == 1
    assert pull.pulled(tmp_path / "models") == [(f"{REPO}/{NAME}", SIZE)]
    assert pull.remove(HubFile(REPO, NAME), tmp_path / "models")
    assert not path.exists()


def test_a_quantisation_names_the_repository_s_file(hub: Hub, tmp_path: Path) -> None:
    path = pull.pull(HubFile(REPO, None, "q8_0"), models=tmp_path, endpoint=hub.url)
    assert path.name == "tiny-Q8_0.gguf"
    with pytest.raises(pull.PullError, match="2 GGUF files match"):
        pull.pull(HubFile(REPO, None, "tiny"), models=tmp_path, endpoint=hub.url)


def test_a_dropped_connection_is_resumed_where_it_stopped(hub: Hub, tmp_path: Path) -> None:
    hub.cut_after = SIZE // 2
    path = _pull(hub, tmp_path)
    assert path.stat().st_size == SIZE
    assert [r for _, r in hub.downloads][-1] is not None  # the rest, by Range
    assert hub.downloads[-1][1] != "bytes=0-"


def test_a_pull_killed_half_way_goes_on_from_its_bytes(hub: Hub, tmp_path: Path) -> None:
    hub.slow = True
    script = (
        "from pathlib import Path; from fairlane.engines import pull; from fairlane.engines."
        "catalogue import HubFile\n"
        f"pull.pull(HubFile({REPO!r}, {NAME!r}), models=Path({str(tmp_path / 'models')!r}), "
        f"endpoint={hub.url!r})\n"
    )
    child = subprocess.Popen([sys.executable, "-c", script])
    staging = tmp_path / "models" / "hub" / REPO / ".pull"

    def written() -> int:
        return sum(p.stat().st_size for p in staging.glob("*.partial")) if staging.exists() else 0

    wait_for(lambda: written() > SIZE // 4)  # its bytes on disk
    os.kill(child.pid, signal.SIGKILL)  # no cleanup: as a power cut
    child.wait()
    kept = written()
    hub.slow = False
    seen: list[int] = []
    path = _pull(hub, tmp_path, progress=lambda p: seen.append(p.resumed_from))
    assert path.stat().st_size == SIZE
    assert hub.downloads[-1][1] == f"bytes={kept}-"  # asked for the rest
    assert seen and seen[0] == kept
    assert not list(staging.glob("*.partial"))  # moved into place


def test_a_corrupted_file_is_refused_and_deleted(hub: Hub, tmp_path: Path) -> None:
    hub.corrupt = True
    with pytest.raises(pull.PullError, match="sha256 is not the hub's"):
        _pull(hub, tmp_path)
    assert not (tmp_path / "models" / "hub" / REPO / NAME).exists()
    hub.corrupt = False
    assert _pull(hub, tmp_path).stat().st_size == SIZE  # the next pull starts over


def test_no_room_is_refused_with_the_numbers(
    hub: Hub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(pull.PullError, match=r"needs about 0\.5 GB of memory.*0\.1 GB"):
        _pull(hub, tmp_path, memory_available_gb=0.1)
    full = pull.shutil.disk_usage(tmp_path)._replace(free=SIZE // 2)  # 0.01 GB
    monkeypatch.setattr(pull.shutil, "disk_usage", lambda _: full)
    with pytest.raises(pull.PullError, match=r"its disk 0\.01 GB free"):
        _pull(hub, tmp_path)
    assert hub.downloads == []  # refused before a byte came


def test_two_pulls_of_one_file_are_one(hub: Hub, tmp_path: Path) -> None:
    hub.slow = True
    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(_pull(hub, tmp_path)))
               for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 2 and results[0] == results[1]
    assert len(hub.downloads) == 1
