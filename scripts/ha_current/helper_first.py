"""Loaded by pytest before its other plugins when the test helper was made for an earlier Home
Assistant release than the one under test (scripts/ha-current.sh passes `-p helper_first`).

- Home Assistant is imported first: 2026.11 aliases httpx to httpx2 on import and refuses to
  when httpx was imported before it (the helper imports respx, so httpx).
- A name the helper imports from where an earlier release defined it, and this release has
  moved into a submodule, is made importable from the old place again. Each is printed: a
  failure in the helper's own fixtures then says nothing about the integration.
"""

from __future__ import annotations

import importlib
import pkgutil
import re

import homeassistant  # noqa: F401  (first: see above)

CANNOT = re.compile(r"cannot import name '(\w+)' from '([\w.]+)'")
HELPER = "pytest_homeassistant_custom_component"


def _moved(name: str, module_name: str) -> bool:
    """Find `name` in a submodule of `module_name` and put it back on the module."""
    module = importlib.import_module(module_name)
    for info in pkgutil.walk_packages(getattr(module, "__path__", []), module_name + "."):
        try:
            submodule = importlib.import_module(info.name)
        except Exception:  # a submodule that does not import here is not it
            continue
        if hasattr(submodule, name):
            setattr(module, name, getattr(submodule, name))
            print(f"helper_first: {name} imported from {info.name}, no longer {module_name}")
            return True
    return False


def _import_helper() -> None:
    """Import the helper's pytest plugin (it imports the rest in its own order); each name
    that has moved is put back where the helper looks for it, then the import is tried again.
    (A module whose import failed leaves sys.modules; those it imported first stay.)"""
    for _ in range(30):
        try:
            importlib.import_module(f"{HELPER}.plugins")
            return
        except ImportError as error:
            found = CANNOT.search(str(error))
            if found is None or not _moved(found[1], found[2]):
                raise


_import_helper()
