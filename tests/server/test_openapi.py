"""The OpenAPI document describes every route the server has, and the server keeps to it:
requests generated from the document (schemathesis, a bounded number per operation) never get
a 5xx, and every error is a JSON body in OpenAI's error shape. The document cannot drift from
the handlers: it is made from the schemas they validate with, and every body it allows, the
handler's own validation accepts."""

from __future__ import annotations

import json
from typing import Any

import pytest
import schemathesis
import voluptuous as vol
from hypothesis import HealthCheck, settings

from fairlane.api.common import ApiError, validate
from fairlane.api.openapi import json_schema, operation_of
from fairlane.server import OPENAPI, PUBLIC_PATHS, ROUTES, BackgroundServer, create_app
from tests.server.conftest import MODEL_WAIT_S, TOKEN

SCHEMA = schemathesis.openapi.from_dict(OPENAPI)
# Valid requests and invalid ones (wrong types, missing fields, values out of range), the same
# examples on every run (deterministic: a failure here is a failure on every machine).
SCHEMA.config.generation.update(
    modes=list(schemathesis.GenerationMode), deterministic=True, database="none"
)


def test_every_route_is_documented_and_every_documented_route_exists(
        server: BackgroundServer) -> None:
    app = create_app(server.services)
    served = {
        (route.resource.canonical, route.method.lower())
        for route in app.router.routes()
        if route.resource is not None and route.method != "HEAD"
    }
    documented = {(path, method) for path, ops in OPENAPI["paths"].items() for method in ops}
    assert served == documented


def _bounded(case: Any) -> None:
    """Keep each generated request's device work small (a few tokens, a short summary): the
    point is the server's answer to the input, not how long a model can talk."""
    if isinstance(case.body, dict):
        for key in ("max_tokens", "max_completion_tokens"):
            if isinstance(case.body.get(key), int):
                case.body[key] = min(case.body[key], 4)
        if "messages" in case.body and case.body.get("max_tokens") is None:
            case.body["max_tokens"] = 4
        if isinstance(case.body.get("max_words"), int):
            case.body["max_words"] = 10


@SCHEMA.parametrize()
@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
def test_generated_requests_never_get_a_server_error(server: BackgroundServer, case: Any) -> None:
    _bounded(case)
    response = case.call(base_url=server.url, headers={"Authorization": f"Bearer {TOKEN}"},
                         timeout=MODEL_WAIT_S)
    assert response.status_code < 500, (case.method, case.path, case.body, response.text)
    if response.status_code >= 400:
        error = json.loads(response.text)["error"]
        assert isinstance(error["message"], str) and error["type"], response.text



# --- the document is the handlers' own ----------------------------------------------------------

OPERATIONS = {(route.path, route.method.lower()): operation_of(route.handler) for route in ROUTES}
POSITIVE = schemathesis.openapi.from_dict(OPENAPI)
POSITIVE.config.generation.update(
    modes=[schemathesis.GenerationMode.POSITIVE], deterministic=True, database="none"
)


@POSITIVE.parametrize()
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
def test_every_body_the_document_allows_the_handler_accepts(case: Any) -> None:
    """Offline, no server: a body generated as valid from the document passes the validation
    its handler runs (`read_json` / `read_form` with the declared schema)."""
    op = OPERATIONS[case.operation.path, case.method.lower()]
    if not isinstance(case.body, dict):
        return
    if case.media_type == "application/json":
        assert op.json is not None
        validate(op.json, case.body)
    else:  # multipart: every field but the file arrives as text, an empty one as absent
        assert op.form is not None and op.file is not None and "file" in case.body
        fields = {k: _as_form_text(v) for k, v in case.body.items() if k != "file"}
        validate(op.form, {k: v for k, v in fields.items() if v != ""})


def _as_form_text(value: Any) -> str:
    return json.dumps(value) if isinstance(value, bool | list | dict | None) else str(value)


def test_public_operations_are_the_ones_without_a_token() -> None:
    public = {path for path, ops in OPENAPI["paths"].items() for op in ops.values()
              if op.get("security") == []}
    assert public == PUBLIC_PATHS == {"/health", "/", "/dashboard"}


def test_every_handler_that_reads_a_body_declares_it() -> None:
    for (path, method), op in OPERATIONS.items():
        documented = OPENAPI["paths"][path][method].get("requestBody")
        assert (documented is not None) == (op.json is not None or op.file is not None), path


def test_json_schema_of_the_validators_the_api_uses() -> None:
    schema = vol.Schema(
        {
            vol.Required("text"): vol.All(str, vol.Length(min=1)),
            vol.Optional("top_k", description="how many"): vol.All(int, vol.Range(min=1, max=50)),
            vol.Optional("p"): vol.Any(
                vol.All(vol.Coerce(float), vol.Range(min=0, min_included=False)), None
            ),
            vol.Optional("style"): vol.In(["short", "bullets"]),
            vol.Optional("tags"): vol.Any([str], None),
            vol.Optional("nested"): {vol.Required("type"): "function"},
        },
        extra=vol.PREVENT_EXTRA,
    )
    assert json_schema(schema) == {
        "type": "object",
        "properties": {
            "text": {"type": "string", "minLength": 1},
            "top_k": {"type": "integer", "minimum": 1, "maximum": 50, "description": "how many"},
            "p": {"type": ["number", "null"], "exclusiveMinimum": 0},
            "style": {"enum": ["short", "bullets"]},
            "tags": {"type": ["array", "null"], "items": {"type": "string"}},
            "nested": {
                "type": "object",
                "properties": {"type": {"const": "function"}},
                "required": ["type"],
                "additionalProperties": False,
            },
        },
        "required": ["text"],
        "additionalProperties": False,
    }


def test_a_validator_the_document_cannot_describe_is_an_error() -> None:
    with pytest.raises(TypeError, match="no JSON Schema"):
        json_schema(vol.Schema({"when": vol.Match(r"\\d+")}))


def test_a_handler_validating_with_another_schema_would_be_caught() -> None:
    """The check above has teeth: a document wider than the handler fails it."""
    narrow = vol.Schema({vol.Required("n"): vol.All(int, vol.Range(max=5))})
    wide = {"n": 9}  # what a document without the range would allow
    with pytest.raises(ApiError, match="n:"):
        validate(narrow, wide)
