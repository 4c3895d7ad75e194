"""The pins of the newest-Home-Assistant run (scripts/ha-current.sh), run in the chroot.

  pins.py newest                  the newest homeassistant on PyPI
  pins.py helper VERSION          the pytest-homeassistant-custom-component for VERSION, and the
                                  release it was made for (the newest made for VERSION or earlier)
  pins.py requirements VERSION HELPER PROJECT OUT CHANGES
                                  PROJECT's requirements for this release (in its venv): what
                                  Home Assistant pins at its version, what the integrations the
                                  tests use require now, and the helper's own requirements; each
                                  change is written to CHANGES
  pins.py constraints             the path of Home Assistant's package_constraints.txt
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import Version

HELPER = "pytest-homeassistant-custom-component"


def pip(*args: str) -> str:
    """pip's own answer (its index, its resolver's metadata): the same on PyPI and on a
    mirror that serves only the simple index."""
    run = [sys.executable, "-m", "pip", *args]
    return subprocess.run(run, capture_output=True, text=True, check=True).stdout


def versions(name: str) -> list[str]:
    """Every release of `name`, newest first."""
    for line in pip("index", "versions", name).splitlines():
        if line.startswith("Available versions:"):
            return [v.strip() for v in line.split(":", 1)[1].split(",")]
    return []


def requires(name: str, version: str) -> list[str]:
    """What `name==version` requires, from its metadata (nothing is installed)."""
    report = pip("install", "--dry-run", "--ignore-installed", "--no-deps", "-q", "--report",
                 "-", f"{name}=={version}")
    return list(json.loads(report)["install"][0]["metadata"].get("requires_dist") or [])


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def made_for(helper_version: str) -> str:
    """The homeassistant release a helper release pins (each pins exactly one)."""
    for spec in requires(HELPER, helper_version):
        req = Requirement(spec)
        if norm(req.name) == "homeassistant" and str(req.specifier).startswith("=="):
            return str(req.specifier)[2:]
    return ""


def helper(ha: str) -> None:
    for version in versions(HELPER)[:30]:
        pinned = made_for(version)
        if pinned and Version(pinned) <= Version(ha):
            print(version, pinned)
            return
    sys.exit(f"no {HELPER} among the newest 30 is made for homeassistant {ha} or earlier")


def requirements(ha: str, helper_version: str, project: str, out: str, changes_to: str) -> None:
    import homeassistant

    core = Path(homeassistant.__file__).parent
    paths = (core / "components").glob("*/manifest.json")
    manifests = {p.parent.name: json.loads(p.read_text()) for p in paths}

    def parsed(specs: list[str]) -> list[Requirement]:
        found = []
        for spec in specs:
            try:
                found.append(Requirement(spec))
            except InvalidRequirement:
                continue
        return found

    # What Home Assistant pins: its integrations' requirements, then its constraints (which win).
    pins: dict[str, str] = {}
    for domain, manifest in sorted(manifests.items()):
        for req in parsed(manifest.get("requirements", [])):
            pins.setdefault(norm(req.name), f"{req}  [Home Assistant {ha}'s {domain}]")
    for line in (core / "package_constraints.txt").read_text().splitlines():
        line = line.partition("#")[0].strip()
        if line and not line.startswith("-"):
            req = Requirement(line)
            pins[norm(req.name)] = f"{req}  [Home Assistant {ha}'s package_constraints.txt]"

    chosen: dict[str, str] = {}
    changes: list[str] = []

    def take(spec: str, origin: str) -> None:
        req = Requirement(spec)
        name = norm(req.name)
        if name in chosen or name == norm(HELPER):
            return  # the helper itself is installed apart, without its homeassistant pin
        if name == "homeassistant":
            new, why = f"homeassistant=={ha}", "the release under test"
        elif name in pins:
            new, _, why = pins[name].partition("  ")
        else:
            new, why = str(req), ""
        if norm(new) != norm(str(req)):
            changes.append(f"{spec} -> {new}  {why} (was {origin})")
        chosen[name] = new

    for line in Path(project).read_text().splitlines():
        line = line.partition("#")[0].strip()
        if line:
            take(line, "tests_ha/requirements.txt")
    listed = set(chosen)  # the project's own: which integrations the tests use
    # The helper's own requirements, at Home Assistant's pins.
    for spec in requires(HELPER, helper_version):
        if "extra ==" not in spec:
            take(spec.split(";")[0].strip(), f"{HELPER} {helper_version}")
    # The integrations whose requirements the project lists, and what they depend on: what they
    # require at this release and the project does not list is added.
    todo = [
        d for d, m in manifests.items()
        if any(norm(r.name) in listed for r in parsed(m.get("requirements", [])))
    ]
    seen: set[str] = set()
    while todo:
        domain = todo.pop()
        if domain in seen or domain not in manifests:
            continue
        seen.add(domain)
        manifest = manifests[domain]
        todo += manifest.get("dependencies", []) + manifest.get("after_dependencies", [])
        for req in parsed(manifest.get("requirements", [])):
            if norm(req.name) not in chosen:
                before = len(changes)
                take(str(req), f"required by {domain}, which the tests use")
                if len(changes) == before:
                    changes.append(f"+ {chosen[norm(req.name)]}  (required by {domain})")
    Path(out).write_text("\n".join(chosen.values()) + "\n")
    Path(changes_to).write_text("\n".join(changes or ["(no pin changed)"]) + "\n")


def main(argv: list[str]) -> None:
    command, *args = argv
    if command == "newest":
        print(versions("homeassistant")[0])
    elif command == "helper":
        helper(*args)
    elif command == "requirements":
        requirements(*args)
    elif command == "constraints":
        import homeassistant

        print(Path(homeassistant.__file__).parent / "package_constraints.txt")
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
