"""The OpenAPI document describes every route the server has, and the server keeps to it:
requests generated from the document (schemathesis, a bounded number per operation) never get
a 5xx, and every error is a JSON body in OpenAI's error shape."""

from __future__ import annotations

import json
from typing import Any

import schemathesis
from hypothesis import HealthCheck, settings

from fairlane.api.openapi import OPENAPI
from fairlane.server import BackgroundServer, create_app
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

