"""The images, checked without building them (no container engine here or in CI): every
runtime dependency pinned, every pin published for the images' platforms and Pythons, one
CUDA major across the GPU image's engines, and llama.cpp built for a machine other than the
one that builds it.

The pin checks read PyPI's JSON API and its wheel metadata (PEP 658), which CI reaches: a pin
that does not exist, or has no wheel for an image's platform and Python, fails here rather
than in a user's build. torch's CPU build comes from download.pytorch.org, which cannot be
reached from here: its version is checked on PyPI, where the same versions are published.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import canonicalize_name, parse_wheel_filename

from fairlane.engines import native

ROOT = Path(__file__).resolve().parents[2]
ADDON = ROOT / "addon"
CUDA = (ADDON / "Dockerfile.cuda").read_text()

# (image, Python, machine, newest glibc): Debian trixie for the add-on (both arches), Ubuntu
# 24.04 for the CUDA image.
TARGETS = [
    ("add-on amd64", (3, 13), "x86_64", 41),
    ("add-on aarch64", (3, 13), "aarch64", 41),
    ("cuda", (3, 12), "x86_64", 39),
]
# Built from source in the image (llama.cpp, for the image's CPU or CUDA): an sdist is enough.
FROM_SOURCE = {"llama-cpp-python"}


def constraints() -> dict[str, str]:
    lines = (ADDON / "constraints.txt").read_text().splitlines()
    pins = [Requirement(line) for line in lines if line.strip() and not line.startswith("#")]
    return {canonicalize_name(p.name): str(p.specifier).removeprefix("==") for p in pins}


def requirements() -> list[Requirement]:
    lines = (ADDON / "requirements.txt").read_text().splitlines()
    return [Requirement(line) for line in lines if line.strip() and not line.startswith("#")]


def test_every_runtime_requirement_is_pinned_within_its_range() -> None:
    pins = constraints()
    for requirement in requirements():
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{name} has no pin in addon/constraints.txt"
        assert requirement.specifier.contains(pins[name], prereleases=True), (name, pins[name])
    for dockerfile in ("Dockerfile", "Dockerfile.cuda"):
        text = (ADDON / dockerfile).read_text()
        assert "-c /usr/src/constraints.txt -r /usr/src/requirements.txt" in text, dockerfile
        torch = re.search(r"^ARG TORCH_VERSION=(\S+)", text, re.M)
        assert torch and torch.group(1) == pins["torch"], dockerfile


@cache
def pypi(name: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"https://pypi.org/pypi/{name}/json", timeout=60) as reply:
        return json.load(reply)  # type: ignore[no-any-return]


def supported(python: tuple[int, int], machine: str, glibc: int) -> set[Tag]:
    platforms = [f"manylinux_2_{minor}_{machine}" for minor in range(glibc, 16, -1)]
    platforms += [f"manylinux2014_{machine}", f"linux_{machine}"]
    if machine == "x86_64":
        platforms += ["manylinux2010_x86_64", "manylinux1_x86_64"]
    return set(cpython_tags(python, platforms=platforms)) | set(
        compatible_tags(python, platforms=platforms)
    )


def published(name: str, version: str) -> list[dict[str, Any]]:
    files: list[dict[str, Any]] = pypi(name)["releases"].get(version) or []
    return files


@pytest.mark.parametrize(("image", "python", "machine", "glibc"), TARGETS)
def test_every_pin_is_published_for_the_images_platform(
    image: str, python: tuple[int, int], machine: str, glibc: int
) -> None:
    tags = supported(python, machine, glibc)
    missing = []
    for name, version in sorted(constraints().items()):
        files = published(name, version)
        if not files:
            missing.append(f"{name}=={version}: not on PyPI")
            continue
        if name in FROM_SOURCE and any(f["packagetype"] == "sdist" for f in files):
            continue
        wheels = [f["filename"] for f in files if f["filename"].endswith(".whl")]
        if not any(set(parse_wheel_filename(w)[3]) & tags for w in wheels):
            missing.append(f"{name}=={version}: no wheel for {image}")
    assert not missing, missing


def _requires_dist(name: str, version: str) -> list[str]:
    """A release's requirements: from its wheels' metadata files (PEP 658), or, for the newest
    release, from the project's JSON (a mirror may not keep every metadata file)."""
    for wheel in published(name, version):
        if not wheel["filename"].endswith(".whl"):
            continue
        url = urllib.parse.urljoin(f"https://pypi.org/pypi/{name}/json", wheel["url"])
        try:
            with urllib.request.urlopen(url + ".metadata", timeout=60) as reply:
                lines = reply.read().decode().splitlines()
        except urllib.error.HTTPError:
            continue
        return [line.removeprefix("Requires-Dist: ") for line in lines
                if line.startswith("Requires-Dist: ")]
    info = pypi(name)["info"]
    assert info["version"] == version, f"no metadata found for {name} {version}"
    return list(info["requires_dist"] or [])


def _cuda_major_of_onnxruntime(version: str) -> int:
    """Its `cuda` extra asks for the nvidia-* packages of one CUDA major."""
    runtime = [r for r in _requires_dist("onnxruntime-gpu", version)
               if r.startswith("nvidia-cuda-runtime")]
    assert runtime, "no CUDA runtime requirement in onnxruntime-gpu's metadata"
    match = re.search(r"-cu(\d+)|~=(\d+)\.", runtime[0])
    assert match, runtime[0]
    return int(match.group(1) or match.group(2))


def test_the_gpu_image_uses_one_cuda_major() -> None:
    base = int(re.search(r"^ARG CUDA_VERSION=(\d+)\.", CUDA, re.M).group(1))  # type: ignore[union-attr]
    onnxruntime = re.search(r"^ARG ONNXRUNTIME_GPU_VERSION=(\S+)", CUDA, re.M).group(1)  # type: ignore[union-attr]
    assert _cuda_major_of_onnxruntime(onnxruntime) == base, "onnxruntime-gpu's CUDA major"
    # CTranslate2 4.x wheels link libcublas.so.12: CUDA 12 only.
    ctranslate2 = constraints()["ctranslate2"]
    assert ctranslate2.startswith("4.") and base == 12, f"ctranslate2 {ctranslate2}, CUDA {base}"
    # torch is for the one-time ONNX export: its CPU build, not a second CUDA stack.
    assert "download.pytorch.org/whl/cpu" in CUDA
    assert not re.search(r"whl/cu\d+", CUDA)


def test_llama_cpp_is_built_for_other_machines_than_the_builder() -> None:
    """`docker build` has no GPU: without GGML_NATIVE=OFF CMake asks for the build machine's
    GPU architectures and compiles the CPU code with -march=native (SIGILL elsewhere)."""
    cmake = re.search(r'CMAKE_ARGS="([^"]+)"', CUDA)
    assert cmake is not None
    flags = cmake.group(1)
    assert "-DGGML_CUDA=on" in flags and "-DGGML_NATIVE=OFF" in flags
    architectures = re.search(r'^ARG CUDA_ARCHITECTURES="?([\d;]+)"?', CUDA, re.M)
    assert architectures and "-DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHITECTURES}" in flags
    assert {"80", "86", "89"} <= set(architectures.group(1).split(";"))


def test_llama_cpp_keeps_what_it_links_statically_to_itself() -> None:
    """The GPU start-up crash: libggml-cuda.so exported a C++ runtime taken from a static
    archive, and libllama's stream calls bound to it. The link flag keeps it private."""
    cmake = re.search(r'CMAKE_ARGS="([^"]+)"', CUDA)
    assert cmake is not None and native.LINK_FIX in cmake.group(1).split()
    evidence = (ROOT / "scripts" / "gpu-evidence.sh").read_text()
    assert "-DCMAKE_SHARED_LINKER_FLAGS=-Wl,--exclude-libs,ALL" in evidence
