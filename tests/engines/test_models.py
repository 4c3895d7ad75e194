"""Packaged models: joined from their parts, verified by sha256, refused when they differ."""

from __future__ import annotations

import hashlib
from importlib import resources

import pytest

from fairlane.engines import models

PART = ("fairlane", "profiles/h100.yaml")  # any file inside an installed package will do


def _digest() -> str:
    data = resources.files("fairlane").joinpath("profiles/h100.yaml").read_bytes() * 2
    return hashlib.sha256(data).hexdigest()


def test_parts_are_joined_verified_and_marked(tmp_path) -> None:
    model = models.PackagedModel("tiny", "tiny.gguf", (PART, PART), _digest(), 0, "test")
    path = models.assemble(model, tmp_path)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == model.sha256
    assert path.with_suffix(".gguf.sha256").exists()
    assert models.assemble(model, tmp_path) == path  # the marker spares a second hash


def test_a_file_that_does_not_match_is_refused_and_removed(tmp_path) -> None:
    model = models.PackagedModel("tiny", "tiny.gguf", (PART,), "0" * 64, 0, "test")
    with pytest.raises(models.ModelError, match="expected 0000"):
        models.assemble(model, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_missing_package_and_missing_path_say_what_to_do(tmp_path) -> None:
    model = models.PackagedModel("x", "x.gguf", (("no_such_model_package", "a.bin"),), "0", 0, "")
    with pytest.raises(models.ModelError, match="not installed"):
        models.assemble(model, tmp_path)
    with pytest.raises(models.ModelError, match="neither a packaged model"):
        models.resolve_llm(str(tmp_path / "missing.gguf"))


def test_default_model_is_the_pinned_qwen() -> None:
    assert models.DEFAULT_LLM == "qwen2.5-coder-0.5b-instruct"
    path = models.resolve_llm(models.DEFAULT_LLM)
    assert path.stat().st_size == models.QWEN_CODER_05B.size
