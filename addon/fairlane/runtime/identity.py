"""The server's instance id: one UUID per data directory, made on the first start and kept.

Clients tell servers apart by it, not by address: Home Assistant uses it as the config entry's
unique id, so a server that moves to another address is still the same entry, and an entry is
never switched to another server by a discovery that happens to share its address.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

FILE = "instance_id"


def instance_id(data_dir: Path) -> str:
    """The id kept in `data_dir`, made (and written atomically) if there is none yet."""
    path = data_dir / FILE
    try:
        return uuid.UUID(path.read_text().strip()).hex
    except (FileNotFoundError, ValueError):
        pass
    data_dir.mkdir(parents=True, exist_ok=True)
    new = uuid.uuid4().hex
    partial = path.with_name(f".{FILE}.{os.getpid()}")
    partial.write_text(new + "\n")
    os.replace(partial, path)
    return new
