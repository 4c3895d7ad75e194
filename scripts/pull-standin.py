"""A recorded pull against the local stand-in for the hub (tests/hub/standin.py): time to the
first byte, throughput, and a pull killed half-way (SIGKILL) then resumed, with how many bytes
the second try asked for. For the pull's figures in docs/history/benchmarks.md (issue 44).

Usage: .venv/bin/python scripts/pull-standin.py [--mb 256]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.hub.standin import Hub

from fairlane.engines import pull
from fairlane.engines.catalogue import HubFile

REPO, NAME = "household/big-GGUF", "big-Q4_K_M.gguf"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=256)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="fairlane-pull-"))
    served = work / "served.gguf"
    with served.open("wb") as out:
        for _ in range(args.mb):
            out.write(os.urandom(1024 * 1024))
    size = served.stat().st_size
    with Hub() as hub:
        hub.add(REPO, NAME, served)
        first: list[float] = []
        start = time.perf_counter()
        pull.pull(HubFile(REPO, NAME), models=work / "a", endpoint=hub.url,
                  progress=lambda p: first.append(time.perf_counter()) if not first else None)
        took = time.perf_counter() - start
        print(f"whole pull: {size / 1e6:.0f} MB in {took:.2f} s = {size / 1e6 / took:.0f} MB/s; "
              f"first progress after {first[0] - start:.2f} s (huggingface_hub reports each "
              "10 MB read); sha256 checked, moved into place")
        hub.slow = True
        script = ("from pathlib import Path; from fairlane.engines import pull; from fairlane."
                  "engines.catalogue import HubFile\n"
                  f"pull.pull(HubFile({REPO!r}, {NAME!r}), models=Path({str(work / 'b')!r}), "
                  f"endpoint={hub.url!r})\n")
        child = subprocess.Popen([sys.executable, "-c", script])
        staging = work / "b" / "hub" / REPO / ".pull"
        while not any(p.stat().st_size > size // 8 for p in staging.glob("*.partial")):
            time.sleep(0.05)
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        kept = sum(p.stat().st_size for p in staging.glob("*.partial"))
        hub.slow = False
        start = time.perf_counter()
        pull.pull(HubFile(REPO, NAME), models=work / "b", endpoint=hub.url)
        took = time.perf_counter() - start
        print(f"killed (SIGKILL) with {kept / 1e6:.1f} MB on disk; the next pull asked for "
              f"{hub.downloads[-1][1]} and finished in {took:.2f} s "
              f"({(size - kept) / 1e6:.0f} MB fetched, not {size / 1e6:.0f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
