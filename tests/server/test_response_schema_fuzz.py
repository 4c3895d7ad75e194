"""The `response_format` fuzz (tests/fuzz/response_schema.py) under a memory limit: in a child
process whose address space is capped, so an exploding grammar fails here, not the machine."""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import pytest

FUZZ = Path(__file__).resolve().parents[1] / "fuzz" / "response_schema.py"
MEMORY_LIMIT = 4 * 1024**3  # address space: the vocabulary and llama.cpp fit with room


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


@pytest.mark.model
def test_response_schemas_fuzzed_under_a_memory_limit() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(FUZZ)],
        preexec_fn=_limit,  # the child has no threads yet
        capture_output=True,
        text=True,
        timeout=900,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
