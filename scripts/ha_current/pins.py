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
import sys
import urllib.request
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import Version

HELPER = "pytest-homeassistant-custom-component"


def pypi(name: str, version: str = "") -> dict:
    url = f"https://pypi.org/pypi/{name}/{version + '/' if version else ''}json"
    with urllib.request.urlopen(url, timeout=60) as response:
        return json.load(response)


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def made_for(helper_version: str) -> str:
    """The homeassistant release a helper release pins (each pins exactly one)."""
    for spec in pypi(HELPER, helper_version)["info"].get("requires_dist") or []:
        req = Requirement(spec)
        if norm(req.name) == "homeassistant" and str(req.specifier).startswith("=="):
            return str(req.specifier)[2:]
    return ""


def helper(ha: str) -> None:
    releases = sorted(pypi(HELPER)["releases"], key=Version, reverse=True)
    for version in releases[:30]:
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
    # The helper's own requirements, at Home Assistant's pins.
    for spec in pypi(HELPER, helper_version)["info"].get("requires_dist") or []:
        if "extra ==" not in spec:
            take(spec.split(";")[0].strip(), f"{HELPER} {helper_version}")
    # The integrations whose requirements the project lists, and what they depend on: what they
    # require at this release and the project does not list is added.
    todo = [
        d for d, m in manifests.items()
        if any(norm(r.name) in chosen for r in parsed(m.get("requirements", [])))
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
        print(pypi("homeassistant")["info"]["version"])
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
