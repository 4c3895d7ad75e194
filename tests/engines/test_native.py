"""The start-up check of llama.cpp's native libraries (the GPU start-up crash's regression
check): a library that exports its own copy of the C++ runtime is found, the system's
libstdc++ is then loaded first, and a model load that dies in a child process ends the start
with one line instead of a signal."""

from __future__ import annotations

import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from fairlane.engines import models, native

# Streams a long through std::ostringstream: the call `llama_model::print_info` crashed in.
SOURCE = """
#include <sstream>
#include <string>
extern "C" int fl_format(long v, char *out, int n) {
    std::ostringstream s;
    s << v;
    std::string r = s.str();
    int i = 0;
    for (; i < n - 1 && i < (int)r.size(); ++i) out[i] = r[i];
    out[i] = 0;
    return i;
}
"""


def _build(tmp_path: Path, name: str, *flags: str) -> Path:
    if shutil.which("g++") is None:
        pytest.fail("g++ is needed to build the libraries this test reads")
    source = tmp_path / "format.cpp"
    source.write_text(SOURCE)
    folder = tmp_path / name
    folder.mkdir()
    library = folder / f"lib{name}.so"
    subprocess.run(
        ["g++", "-shared", "-fPIC", "-O1", *flags, str(source), "-o", str(library)], check=True
    )
    return library


def test_the_installed_llama_cpp_exports_no_runtime_of_its_own() -> None:
    lib_dir = native.llama_cpp_lib_dir()
    assert lib_dir is not None
    libllama = next(p for p in lib_dir.glob("libllama.so*") if not p.is_symlink())
    assert "llama_decode" in native.exported_symbols(libllama)
    assert native.runtime_copies(lib_dir) == []


def test_a_static_cxx_runtime_left_exported_is_found(tmp_path: Path) -> None:
    """`-static-libstdc++` without `--exclude-libs`: what libggml-cuda.so did on the H200."""
    library = _build(tmp_path, "exported", "-static-libstdc++")
    [copy] = native.runtime_copies(library.parent)
    assert copy.library == library
    assert any(name.startswith("_ZNSo9_M_insertIl") for name in copy.symbols)  # << long
    assert "C++ runtime symbols" in copy.describe()
    if nm := shutil.which("nm"):  # the reader agrees with binutils
        listed = subprocess.run(
            [nm, "-D", "--defined-only", str(library)], capture_output=True, text=True, check=True
        ).stdout.split()
        assert set(copy.symbols) <= set(listed)


def test_the_link_fix_hides_the_copy(tmp_path: Path) -> None:
    assert native.LINK_FIX.endswith("-Wl,--exclude-libs,ALL")
    library = _build(tmp_path, "hidden", "-static-libstdc++", "-Wl,--exclude-libs,ALL")
    assert native.runtime_copies(library.parent) == []
    assert "fl_format" in native.exported_symbols(library)


def test_a_found_copy_puts_the_system_runtime_first(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    library = _build(tmp_path, "exported", "-static-libstdc++")
    copies = native.load_order_safe(library.parent)
    assert [c.library for c in copies] == [library]
    assert "-Wl,--exclude-libs,ALL" in caplog.text and "libexported.so" in caplog.text
    assert any("libstdc++" in line for line in Path("/proc/self/maps").read_text().splitlines())


def test_a_model_that_loads_passes_the_probe() -> None:
    assert native.probe_model_load(models.resolve_llm(models.DEFAULT_LLM), 0) is None


def test_a_file_llama_cpp_refuses_is_one_line(tmp_path: Path) -> None:
    bogus = tmp_path / "not-a-model.gguf"
    bogus.write_bytes(b"GGUF but not really")
    problem = native.probe_model_load(bogus, 0)
    assert problem is not None and "could not load" in problem and "\n" not in problem


def test_a_crash_in_the_child_is_one_line_not_a_signal(tmp_path: Path) -> None:
    problem = native.describe_exit(-signal.SIGSEGV, tmp_path / "m.gguf")
    assert problem is not None and problem.startswith("llama.cpp crashed (SIGSEGV) loading m.gguf")
    assert "\n" not in problem
