"""llama.cpp's native libraries, checked before Python loads them.

A shared library built with a static archive inside it exports every global symbol it took
from the archive unless the link says otherwise (`-Wl,--exclude-libs,ALL`). When that archive
holds a C++ runtime (libstdc++'s own with `-static-libstdc++`, or one bundled in a toolkit's
static library), the library exports a second, private copy of libstdc++: its streams,
locales and `codecvt` facets. libllama's calls into the C++ runtime (`std::ostream << long` in
`llama_model::print_info`) then bind to whichever copy the dynamic linker meets first: the
system's libstdc++ if something loaded it into the global scope before llama.cpp, or the
private copy, whose locale was never set up, if nothing did. That is how `fairlane serve`
crashed (SIGSEGV in `print_info`, resolved inside `libggml-cuda.so`) on the first GPU while
`fairlane bench engine`, with another import order, did not.

`runtime_copies` finds such exports by reading each library's dynamic symbol table (ELF,
no tools needed); `load_order_safe` loads the system's libstdc++ into the global scope first
when one is found, so the outcome no longer depends on import order; `probe_model_load` runs
a vocabulary-only model load in a child process, so a GPU build that still cannot load a model
fails the start with one line instead of a segfault.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.util
import logging
import mmap
import os
import signal
import struct
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

_LOGGER = logging.getLogger(__name__)

# Symbols only a C++ runtime defines: the stream inserters libstdc++ instantiates for itself
# (headers declare them `extern template`, so user code never emits them), locales and their
# facets, ios_base, and the ABI's exception and guard entry points.
RUNTIME_MARKERS = (
    "_ZNSo9_M_insert",  # std::ostream::_M_insert<T>
    "_ZNSi10_M_extract",  # std::istream::_M_extract<T>
    "_ZNSt6locale",  # std::locale
    "_ZNKSt6locale",
    "_ZNSt7codecvt",  # std::codecvt facets
    "_ZNKSt7codecvt",
    "_ZNSt8ios_base",  # std::ios_base
    "__cxa_throw",
    "__cxa_guard_acquire",
    "__gxx_personality_v0",
)

LINK_FIX = "-DCMAKE_SHARED_LINKER_FLAGS=-Wl,--exclude-libs,ALL"

_SHT_DYNSYM = 11
_STB_GLOBAL, _STB_WEAK, _STB_GNU_UNIQUE = 1, 2, 10
_STV_DEFAULT, _STV_PROTECTED = 0, 3


@dataclass(frozen=True)
class RuntimeCopy:
    """A library that exports symbols of its own C++ runtime."""

    library: Path
    symbols: tuple[str, ...]

    def describe(self) -> str:
        shown = ", ".join(self.symbols[:3])
        return f"{self.library.name} exports {len(self.symbols)} C++ runtime symbols ({shown}…)"


def exported_symbols(path: Path) -> list[str]:
    """The names a 64-bit little-endian ELF shared library defines and exports."""
    with path.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
        if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
            return []  # not an ELF64 LE file: nothing this check knows how to read
        return _dynamic_symbols(data)


def _dynamic_symbols(data: mmap.mmap) -> list[str]:
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [
        struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)
    ]
    names: list[str] = []
    for _, kind, _, _, offset, size, link, _, _, entsize in sections:
        if kind != _SHT_DYNSYM or entsize == 0:
            continue
        strtab_offset = sections[link][4]
        for at in range(offset, offset + size, entsize):
            name_at, info, other, shndx, _, _ = struct.unpack_from("<IBBHQQ", data, at)
            binding, visibility = info >> 4, other & 0x3
            if shndx == 0 or binding not in (_STB_GLOBAL, _STB_WEAK, _STB_GNU_UNIQUE):
                continue  # undefined here (imported), or local
            if visibility not in (_STV_DEFAULT, _STV_PROTECTED):
                continue  # hidden: no one else can bind to it
            end = data.find(b"\0", strtab_offset + name_at)
            names.append(data[strtab_offset + name_at : end].decode("ascii", "replace"))
    return names


def runtime_copies(lib_dir: Path) -> list[RuntimeCopy]:
    """Libraries in `lib_dir` that export a private copy of the C++ runtime."""
    found = []
    for library in sorted(lib_dir.glob("*.so*")):
        if library.is_symlink() or not library.is_file():
            continue  # each real file once
        symbols = tuple(
            name for name in exported_symbols(library) if name.startswith(RUNTIME_MARKERS)
        )
        if symbols:
            found.append(RuntimeCopy(library, symbols))
    return found


def llama_cpp_lib_dir() -> Path | None:
    """Where llama-cpp-python keeps libllama and the ggml backends, found without importing it."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return None
    lib_dir = Path(next(iter(spec.submodule_search_locations))) / "lib"
    return lib_dir if lib_dir.is_dir() else None


def load_order_safe(lib_dir: Path | None = None) -> list[RuntimeCopy]:
    """Before llama.cpp is loaded: if one of its libraries carries its own C++ runtime, put the
    system's libstdc++ in the global scope first, so every library binds to that one.

    Returns the copies found (empty for a sound build); says once in the log what it did and
    how the build should be fixed."""
    lib_dir = lib_dir or llama_cpp_lib_dir()
    if lib_dir is None:
        return []
    copies = runtime_copies(lib_dir)
    if copies:
        runtime = ctypes.util.find_library("stdc++") or "libstdc++.so.6"
        ctypes.CDLL(runtime, mode=ctypes.RTLD_GLOBAL)
        _LOGGER.warning(
            "llama.cpp's %s; loaded the system's %s first so that every library uses it. "
            "Rebuild llama-cpp-python with CMAKE_ARGS=\"... %s\" to fix the build itself",
            "; ".join(copy.describe() for copy in copies), runtime, LINK_FIX,
        )
    return copies


_checked = False


def import_llama_cpp(submodule: str = "") -> ModuleType:
    """llama-cpp-python (or one of its modules), imported after `load_order_safe`.

    Every import of llama_cpp in the server goes through here: whichever module imports it
    first decides the load order, so the check cannot live in one of them only."""
    global _checked
    if not _checked:
        load_order_safe()
        _checked = True
    return importlib.import_module(f"llama_cpp.{submodule}" if submodule else "llama_cpp")


def gpu_offload() -> bool:
    """Whether this llama.cpp build can put layers on a GPU."""
    return bool(import_llama_cpp().llama_supports_gpu_offload())


_PROBE = """
import sys
from fairlane.engines.native import import_llama_cpp
lc = import_llama_cpp()
quiet = lc.llama_log_callback(lambda level, text, data: None)  # kept alive while in use
lc.llama_log_set(quiet, None)
lc.llama_backend_init()
params = lc.llama_model_default_params()
params.n_gpu_layers = int(sys.argv[2])
params.vocab_only = True
model = lc.llama_model_load_from_file(sys.argv[1].encode(), params)
sys.exit(0 if model else 3)
"""


def probe_model_load(model: Path, gpu_layers: int, timeout_s: float = 120.0) -> str | None:
    """Load the model's metadata and vocabulary (the path that crashed) in a child process.

    None when it loads; otherwise one line that says what happened, for the start to fail
    with instead of taking the server down with a signal."""
    package_root = str(Path(__file__).resolve().parents[2])  # where `fairlane` is importable
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    try:
        done = subprocess.run(
            [sys.executable, "-c", _PROBE, str(model), str(gpu_layers)],
            capture_output=True, timeout=timeout_s, check=False, env=env,
        )
    except subprocess.TimeoutExpired:
        return f"llama.cpp did not load {model.name}'s metadata within {timeout_s:.0f} s"
    return describe_exit(done.returncode, model, done.stderr.decode(errors="replace"))


def describe_exit(returncode: int, model: Path, stderr: str = "") -> str | None:
    """One line for how a model-loading child process ended (None: it loaded)."""
    if returncode == 0:
        return None
    if returncode < 0:
        name = signal.Signals(-returncode).name
        copies = runtime_copies(lib_dir) if (lib_dir := llama_cpp_lib_dir()) else []
        cause = (
            f" ({copies[0].describe()}: rebuild llama-cpp-python with {LINK_FIX})"
            if copies else ""
        )
        return f"llama.cpp crashed ({name}) loading {model.name}{cause}"
    if returncode == 3:
        return f"llama.cpp could not load {model}"
    last = stderr.strip().splitlines()[-1:] or ["no output"]
    return f"loading {model.name} failed (exit {returncode}): {last[0]}"
