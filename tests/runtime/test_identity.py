"""The instance id: made once per data directory, then the same on every start."""

from __future__ import annotations

from pathlib import Path

from fairlane.runtime.identity import FILE, instance_id


def test_the_id_is_kept_across_starts_and_differs_between_data_dirs(tmp_path: Path) -> None:
    first = instance_id(tmp_path / "a")
    assert instance_id(tmp_path / "a") == first
    assert instance_id(tmp_path / "b") != first
    assert (tmp_path / "a" / FILE).read_text().strip() == first


def test_a_damaged_id_file_is_replaced(tmp_path: Path) -> None:
    (tmp_path / FILE).write_text("not a uuid")
    new = instance_id(tmp_path)
    assert len(new) == 32 and instance_id(tmp_path) == new
