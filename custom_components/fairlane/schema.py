"""Validation schemas as JSON Schema for the model: tools' parameters, AI task structures.

Home Assistant 2026.9 moved from voluptuous to probatio, a drop-in with the same API: there,
`import voluptuous` resolves to probatio's shim, core's schemas and `llm.selector_serializer`
are probatio's (the serializer answers `probatio.UNSUPPORTED` for what it does not know), and
`voluptuous_openapi` is no longer installed. Each schema is converted by the library that
built it, so the integration works on both sides of that change; neither library is imported
before it is needed.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

# `vol` for the integration's own schemas. At run time it is `import voluptuous` (probatio's
# shim where core has moved). For the type checker it is the library core's signatures name:
# probatio for the releases on Python 3.14 this is checked against (2026.9 and later),
# voluptuous for 2026.2 on Python 3.13.
if TYPE_CHECKING and sys.version_info >= (3, 14):
    import probatio as vol
else:
    import voluptuous as vol

__all__ = ["built_by_probatio", "to_json_schema", "vol"]


def built_by_probatio(schema: Any) -> bool:
    return type(schema).__module__.partition(".")[0] == "probatio"


def to_json_schema(schema: Any, serializer: Callable[[Any], Any] | None) -> dict[str, Any]:
    """`schema` (a `vol.Schema` of either library) as a JSON Schema object."""
    if built_by_probatio(schema):
        import probatio  # Home Assistant 2026.9 and later

        result: dict[str, Any] = probatio.to_openapi(
            schema, custom_serializer=serializer, openapi_version="3.1.0"
        )
        return result
    from voluptuous_openapi import convert  # before 2026.9

    converted: dict[str, Any] = convert(schema, custom_serializer=serializer)
    return converted
