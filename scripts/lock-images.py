"""Write addon/constraints.txt: every runtime dependency of the images, pinned.

The images install `addon/requirements.txt` (the ranges the package declares) under these
constraints, so a build months from now installs what the tests ran with. The pins are the
versions in the development environment (`.venv`, made by `make install`), for every package
the runtime requirements need on Linux, transitively.

    .venv/bin/python scripts/lock-images.py        # then review the diff and run the tests
"""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
# Markers are read for the images' Linux (the CUDA image's Python is the oldest, 3.12).
LINUX = {"python_version": "3.12", "sys_platform": "linux", "platform_machine": "x86_64",
         "platform_system": "Linux", "extra": ""}


def pins() -> dict[str, str]:
    lines = (ROOT / "addon" / "requirements.txt").read_text().splitlines()
    stack = [Requirement(line) for line in lines if line.strip() and not line.startswith("#")]
    found: dict[str, str] = {}
    while stack:
        requirement = stack.pop()
        name = canonicalize_name(requirement.name)
        if name in found:
            continue
        distribution = metadata.distribution(requirement.name)
        found[name] = distribution.version.split("+")[0]  # torch's "+cpu" is the index's
        for text in distribution.requires or ():
            dependency = Requirement(text)
            if dependency.marker is None or dependency.marker.evaluate(LINUX):
                stack.append(dependency)
    return found


def main() -> None:
    header = (
        "# Every runtime dependency of the images, pinned (scripts/lock-images.py writes this\n"
        "# from the tested environment; tests/addon/test_images.py checks each pin exists for\n"
        "# the images' platforms). The images install requirements.txt under these.\n"
    )
    body = "".join(f"{name}=={version}\n" for name, version in sorted(pins().items()))
    (ROOT / "addon" / "constraints.txt").write_text(header + body)


if __name__ == "__main__":
    main()
