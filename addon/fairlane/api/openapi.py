"""The OpenAPI 3.1 description of Fairlane's HTTP API, served at /openapi.json, made from the
handlers themselves.

Each handler declares its operation with `@operation(...)`: a summary, the errors it answers
with, and the request body as the voluptuous schema it is validated with. `read_json` and
`read_form` in `api.common` validate a request with the schema of the handler the router chose,
and `document(routes)` writes every route's operation into the document, its body through
`json_schema`. One declaration serves both, so the document cannot drift from what the server
accepts (tests/server/test_openapi.py checks it against generated requests).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import voluptuous as vol
from aiohttp import web

from fairlane import __version__

ERROR_TEXT = {
    400: "Invalid request",
    401: "Missing or wrong bearer token",
    404: "Not found",
    409: "Cancelled before it ran",
    413: "Body too large",
    415: "A document type the server cannot read",
    429: "Refused by admission control (queue full, deadline); see Retry-After",
    502: "A remote lane's engine failed (remote_failed)",
    503: "A device loop stopped on a fault until the server restarts (device_failed), or a "
    "remote lane's circuit breaker is open (remote_unavailable; see Retry-After)",
    504: "A remote lane's engine sent nothing within its timeout (remote_timeout)",
    507: "The server's disk is full; nothing was stored",
}
CLASSES = ["voice", "chat", "background"]
CLASS_HEADER = {
    "name": "X-Fairlane-Class",
    "in": "header",
    "schema": {"type": "string", "enum": CLASSES},
    "description": "the class of work (voice > chat > background); a body field wins",
}
_ERROR = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
            "required": ["message", "type"],
        }
    },
    "required": ["error"],
}


@dataclass(frozen=True)
class Operation:
    """What one handler takes and answers, for the document and for validation."""

    summary: str
    ok: dict[int, str] = field(default_factory=lambda: {200: "OK"})
    errors: tuple[int, ...] = (401,)
    json: vol.Schema | None = None  # an application/json body, validated with this schema
    form: vol.Schema | None = None  # multipart/form-data text fields, validated with this
    file: str | None = None  # the form's file part: its description (it is required)
    class_header: bool = False  # the class may come from X-Fairlane-Class
    public: bool = False  # no bearer token needed


Handler = TypeVar("Handler", bound=Callable[..., Any])


def operation(summary: str, **details: Any) -> Callable[[Handler], Handler]:
    """Declare a handler's operation (see `Operation`)."""

    def declare(handler: Handler) -> Handler:
        handler.operation = Operation(summary, **details)  # type: ignore[attr-defined]
        return handler

    return declare


def operation_of(handler: Any) -> Operation:
    found = getattr(handler, "operation", None)
    if not isinstance(found, Operation):
        raise TypeError(f"{handler.__qualname__} declares no @operation")
    return found


# --- voluptuous to JSON Schema ---------------------------------------------------------------


class Whole:
    """JSON Schema's integer, as the schemas' `int`: an int or a number without a fraction
    (`1.0`, which JSON clients send), made an int; not a boolean (Python's `int` takes True)."""

    def __call__(self, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise vol.Invalid("expected an integer")
        if isinstance(value, float) and not value.is_integer():
            raise vol.Invalid("expected an integer")
        return int(value)


WHOLE = Whole()

_TYPES: dict[Any, dict[str, Any]] = {
    str: {"type": "string"},
    int: {"type": "integer"},
    float: {"type": "number"},
    bool: {"type": "boolean"},
    dict: {"type": "object"},
    list: {"type": "array"},
    None: {"type": "null"},
}


def json_schema(validator: Any) -> dict[str, Any]:
    """The JSON Schema of a voluptuous validator, for the constructs the API's schemas use.

    Anything else raises TypeError: a schema the document cannot describe is a failing test,
    not a silently missing field.
    """
    if isinstance(validator, vol.Schema):
        found = json_schema(validator.schema)
        if isinstance(validator.schema, dict):
            _set_extra(found, validator.extra)
        return found
    if isinstance(validator, dict):
        found = {"type": "object", "properties": {}, "required": []}
        for key, value in validator.items():
            name = key.schema if isinstance(key, vol.Marker) else key
            if not isinstance(name, str):
                raise TypeError(f"a field named by {name!r}")
            prop = json_schema(value)
            if isinstance(key, vol.Marker) and key.description:
                prop["description"] = key.description
            found["properties"][name] = prop
            if isinstance(key, vol.Required):
                found["required"].append(name)
        if not found["required"]:
            del found["required"]
        return found  # its `extra` comes from the Schema it is in (`_set_extra`)
    if isinstance(validator, list):
        if not validator:
            return {"type": "array"}
        items = [json_schema(v) for v in validator]
        return {"type": "array", "items": items[0] if len(items) == 1 else {"anyOf": items}}
    if isinstance(validator, str):
        return {"const": validator}
    if isinstance(validator, Whole):
        return {"type": "integer"}
    if validator in _TYPES:
        return dict(_TYPES[validator])
    if isinstance(validator, vol.Any):
        return _any_of([json_schema(v) for v in validator.validators])
    if isinstance(validator, vol.All):
        merged: dict[str, Any] = {}
        for part in validator.validators:
            merged = _narrow(merged, part)
        return merged
    if isinstance(validator, vol.In):
        return {"enum": list(validator.container)}  # type: ignore[arg-type]
    if isinstance(validator, vol.Coerce):
        return dict(_TYPES[validator.type])
    raise TypeError(f"no JSON Schema for the validator {validator!r}")


def _narrow(schema: dict[str, Any], part: Any) -> dict[str, Any]:
    """`schema` with one more validator of a vol.All applied."""
    if isinstance(part, vol.Range):
        if part.min is not None:
            schema["minimum" if part.min_included else "exclusiveMinimum"] = part.min
        if part.max is not None:
            schema["maximum" if part.max_included else "exclusiveMaximum"] = part.max
        return schema
    if isinstance(part, vol.Length):
        array = schema.get("type") == "array"
        if part.min is not None:
            schema["minItems" if array else "minLength"] = part.min
        if part.max is not None:
            schema["maxItems" if array else "maxLength"] = part.max
        return schema
    return {**schema, **json_schema(part)}


def _any_of(options: list[dict[str, Any]]) -> dict[str, Any]:
    """Alternatives, the simple ones folded into one list of types (`["integer", "null"]`)."""
    simple = [o for o in options if set(o) == {"type"} and isinstance(o["type"], str)]
    if len(options) == 2 and len(simple) == 1 and {"type": "null"} in options:
        other = next(o for o in options if o != {"type": "null"})
        if isinstance(other.get("type"), str):
            return {**other, "type": [other["type"], "null"]}
    if len(simple) == len(options):
        return {"type": [o["type"] for o in options]}
    return {"anyOf": options}


def _set_extra(schema: dict[str, Any], extra: int) -> None:
    """Apply a Schema's `extra` to its object and every plain dict nested in it."""
    if schema.get("type") == "object" and "properties" in schema:
        # Set on every object, True too (`_tidy` drops it): a nested Schema set its own first.
        schema.setdefault("additionalProperties", extra != vol.PREVENT_EXTRA)
        for prop in schema["properties"].values():
            _set_extra(prop, extra)
    for key in ("items",):
        if isinstance(schema.get(key), dict):
            _set_extra(schema[key], extra)
    for key in ("anyOf", "oneOf"):
        for option in schema.get(key, []):
            _set_extra(option, extra)


# --- the document ---------------------------------------------------------------------------


def document(routes: Iterable[web.RouteDef]) -> dict[str, Any]:
    """The OpenAPI document of these routes, each from its handler's `@operation`."""
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        op = operation_of(route.handler)
        entry: dict[str, Any] = {"summary": op.summary}
        parameters: list[dict[str, Any]] = [
            {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
            for name in _path_parameters(route.path)
        ]
        if op.class_header:
            parameters.append(CLASS_HEADER)
        if parameters:
            entry["parameters"] = parameters
        if op.public:
            entry["security"] = []
        content: dict[str, Any] = {}
        if op.json is not None:
            content["application/json"] = {"schema": json_schema(op.json)}
        if op.form is not None or op.file is not None:
            form: dict[str, Any] = (
                json_schema(op.form) if op.form is not None else {"type": "object"}
            )
            form.setdefault("properties", {})
            form.pop("additionalProperties", None)  # a form's other parts are read as text
            if op.file is not None:
                form["properties"] = {
                    "file": {"type": "string", "format": "binary", "description": op.file},
                    **form["properties"],
                }
                form["required"] = ["file", *form.get("required", [])]
            content["multipart/form-data"] = {"schema": form}
        if content:
            entry["requestBody"] = {"required": True, "content": content}
        entry["responses"] = {
            **{str(code): {"description": text} for code, text in op.ok.items()},
            **{
                str(code): {
                    "description": ERROR_TEXT[code],
                    "content": {
                        "application/json": {"schema": {"$ref": "#/components/schemas/Error"}}
                    },
                }
                for code in op.errors
            },
        }
        paths.setdefault(route.path, {})[route.method.lower()] = _tidy(entry)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Fairlane",
            "version": __version__,
            "description": "One home GPU, many voices. OpenAI-compatible where OpenAI has an "
            "endpoint; the class of work comes from X-Fairlane-Class or "
            "fairlane_class (voice > chat > background).",
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {"Error": _ERROR},
        },
        "security": [{"bearer": []}],
        "paths": paths,
    }


def _path_parameters(path: str) -> list[str]:
    return [part[1:-1] for part in path.split("/") if part.startswith("{") and part.endswith("}")]


def _tidy(node: Any) -> Any:
    """`node` without `additionalProperties: true` (JSON Schema's default)."""
    if isinstance(node, dict):
        return {
            k: _tidy(v) for k, v in node.items() if not (k == "additionalProperties" and v is True)
        }
    if isinstance(node, list):
        return [_tidy(v) for v in node]
    return node
