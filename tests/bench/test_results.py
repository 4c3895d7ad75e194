"""`fairlane bench results`: the results page's plots, drawn from the benchmarks' JSON as the
repository keeps it (docs/results/data, docs/gpu)."""

from __future__ import annotations

from pathlib import Path

from fairlane.bench.results import SOURCES, plot_all

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "docs" / "results" / "data"


def test_every_area_with_its_json_is_drawn_and_the_others_are_said(tmp_path, capsys) -> None:
    written = plot_all(DATA, tmp_path)
    present = {area for area, name in SOURCES.items() if (DATA / name).is_file()}
    assert {"assist", "gpu"} <= present  # committed with the page
    assert sorted(Path(p).stem for p in written) == sorted(present)
    for path in written:
        assert Path(path).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    missing = set(SOURCES) - present
    said = capsys.readouterr().out
    assert all(f"{area}: no " in said for area in missing)
