"""The OpenAPI 3.1 description of Fairlane's HTTP API, served at /openapi.json."""

from __future__ import annotations

from typing import Any

from fairlane import __version__

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
}


_ERROR_REF = {"$ref": "#/components/schemas/Error"}


def _errors(*codes: int) -> dict[str, Any]:
    text = {
        400: "Invalid request",
        401: "Missing or wrong bearer token",
        404: "Not found",
        413: "Body too large",
        415: "A document type the server cannot read",
        429: "Refused by admission control (queue full, deadline); see Retry-After",
        502: "A remote lane's engine failed (remote_failed)",
        503: "A remote lane's circuit breaker is open (remote_unavailable); see Retry-After",
        504: "A remote lane's engine sent nothing within its timeout (remote_timeout)",
        507: "The server's disk is full; nothing was stored",
    }
    return {
        str(c): {"description": text[c], "content": {"application/json": {"schema": _ERROR_REF}}}
        for c in codes
    }


_CLASS = {"type": "string", "enum": ["voice", "chat", "background"]}
_CLASS_HEADER = {"name": "X-Fairlane-Class", "in": "header", "schema": _CLASS}
_PRIORITY = {
    "oneOf": [{"type": "integer"}, _CLASS, {"type": "null"}],
    "description": "vLLM's and SGLang's field: below 0 is voice, 0 chat, above 0 background, "
    "or a class name; fairlane_class wins",
}
_DEADLINE = {
    "type": ["number", "null"],
    "minimum": 1,
    "maximum": 86_400_000,
    "description": "ms until the first output; a request that cannot meet it is refused (429)",
}
_ID = {"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}
_DOCUMENT_FIELDS = {
    "text": {"type": "string", "minLength": 1},
    "content_type": {"type": "string"},
    "title": {"type": ["string", "null"]},
    "source": {"type": ["string", "null"]},
    "tags": {"type": ["array", "null"], "items": {"type": "string"}},
}


def _json(properties: dict[str, Any], required: list[str], extra: bool = True) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "properties": properties, "required": required}
    if not extra:
        schema["additionalProperties"] = False
    return {"required": True, "content": {"application/json": {"schema": schema}}}


def _multipart(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    schema = {"type": "object", "properties": properties, "required": required}
    return {"required": True, "content": {"multipart/form-data": {"schema": schema}}}


OPENAPI: dict[str, Any] = {
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
        "schemas": {
            "Error": _ERROR,
            "Message": {
                "type": "object",
                "properties": {
                    "role": {"enum": ["system", "developer", "user", "assistant", "tool"]},
                    "content": {
                        "type": ["string", "array", "null"],
                        "description": "a string, or parts: text, and file (file.file_data a "
                        "base64 data URL of text, Markdown, HTML or PDF; its text is extracted); "
                        "image and audio parts are refused with a 400",
                    },
                    "tool_calls": {
                        "type": ["array", "null"],
                        "items": {
                            "type": "object",
                            "properties": {
                                "id": {"type": "string"},
                                "type": {"const": "function"},
                                "function": {
                                    "type": "object",
                                    "properties": {
                                        "name": {"type": "string"},
                                        "arguments": {"type": ["string", "object"]},
                                    },
                                    "required": ["name"],
                                },
                            },
                            "required": ["function"],
                        },
                    },
                    "tool_call_id": {"type": "string"},
                },
                "required": ["role"],
            },
            "ChatRequest": {
                "type": "object",
                "properties": {
                    "model": {"type": "string"},
                    "messages": {
                        "type": "array",
                        "minItems": 1,
                        "items": {"$ref": "#/components/schemas/Message"},
                    },
                    "stream": {"type": "boolean"},
                    "stream_options": {
                        "type": ["object", "null"],
                        "properties": {"include_usage": {"type": "boolean"}},
                        "additionalProperties": False,
                    },
                    "max_tokens": {"type": ["integer", "null"], "minimum": 1},
                    "max_completion_tokens": {"type": ["integer", "null"], "minimum": 1},
                    "temperature": {"type": ["number", "null"], "minimum": 0, "maximum": 2},
                    "top_p": {"type": ["number", "null"], "exclusiveMinimum": 0, "maximum": 1},
                    "top_k": {"type": ["integer", "null"], "minimum": 0},
                    "seed": {"type": ["integer", "null"]},
                    "n": {"type": ["integer", "null"], "minimum": 1, "maximum": 1},
                    "stop": {
                        "oneOf": [
                            {"type": "string"},
                            {"type": "array", "items": {"type": "string"}, "maxItems": 4},
                            {"type": "null"},
                        ]
                    },
                    "user": {"type": ["string", "null"], "description": "the fairness client"},
                    "tools": {
                        "type": ["array", "null"],
                        "items": {
                            "type": "object",
                            "properties": {
                                "type": {"const": "function"},
                                "function": {
                                    "type": "object",
                                    "properties": {
                                        "name": {"type": "string"},
                                        "description": {"type": "string"},
                                        "parameters": {"type": "object"},
                                    },
                                    "required": ["name"],
                                },
                            },
                            "required": ["type", "function"],
                        },
                    },
                    "tool_choice": {
                        "oneOf": [{"type": "string"}, {"type": "object"}, {"type": "null"}]
                    },
                    "response_format": {
                        "description": "text, json_object, or json_schema with "
                        "json_schema.schema: sampling is constrained to that JSON (a schema "
                        "llama.cpp's grammar converter cannot take is a 400)",
                        "oneOf": [
                            {
                                "type": "object",
                                "properties": {"type": {"enum": ["text", "json_object"]}},
                                "required": ["type"],
                                "additionalProperties": False,
                            },
                            {
                                "type": "object",
                                "properties": {
                                    "type": {"const": "json_schema"},
                                    "json_schema": {
                                        "type": "object",
                                        "properties": {
                                            "name": {"type": "string"},
                                            "strict": {"type": "boolean"},
                                            "schema": {"type": "object"},
                                        },
                                        "required": ["schema"],
                                    },
                                },
                                "required": ["type", "json_schema"],
                                "additionalProperties": False,
                            },
                            {"type": "null"},
                        ],
                    },
                    "fairlane_class": _CLASS,
                    "priority": _PRIORITY,
                    "deadline_ms": _DEADLINE,
                },
                "required": ["messages"],
            },
        },
    },
    "security": [{"bearer": []}],
    "paths": {
        "/health": {
            "get": {
                "summary": "Liveness (no auth), answered from memory: status (degraded when an "
                "engine did not get the device asked for, a component is retrying or a remote "
                "lane's breaker is not closed), devices, components (indexer, summariser: "
                "state, error, failures), remotes (state, failures, error), version, "
                "instance_id (stable per data directory), models, Wyoming port",
                "security": [],
                "responses": {"200": {"description": "Server is up"}},
            }
        },
        "/": {
            "get": {
                "summary": "The live lane dashboard (HTML; it reads /v1/stats)",
                "security": [],
                "responses": {"200": {"description": "HTML page"}},
            }
        },
        "/dashboard": {
            "get": {
                "summary": "The live lane dashboard (HTML; it reads /v1/stats)",
                "security": [],
                "responses": {"200": {"description": "HTML page"}},
            }
        },
        "/v1/models": {
            "get": {
                "summary": "Models served",
                "responses": {"200": {"description": "Model list"}, **_errors(401)},
            }
        },
        "/v1/chat/completions": {
            "post": {
                "summary": "Chat completion (SSE with stream: true)",
                "parameters": [_CLASS_HEADER],
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {"schema": {"$ref": "#/components/schemas/ChatRequest"}}
                    },
                },
                "responses": {
                    "200": {
                        "description": "chat.completion, or text/event-stream of "
                        "chat.completion.chunk ending in [DONE]"
                    },
                    **_errors(400, 401, 413, 429, 502, 503, 504),
                },
            }
        },
        "/v1/chat/completions/{id}/cancel": {
            "post": {
                "summary": "Cancel a running completion; its KV is freed at the next iteration",
                "parameters": [
                    {"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}
                ],
                "responses": {"200": {"description": "Cancelled"}, **_errors(401, 404)},
            }
        },
        "/v1/audio/speech": {
            "post": {
                "summary": "Speak a text (class voice by default); stream_format audio or sse "
                "sends each sentence as soon as it is synthesised",
                "parameters": [{"name": "X-Fairlane-Class", "in": "header", "schema": _CLASS}],
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {
                            "schema": {
                                "type": "object",
                                "properties": {
                                    "model": {"type": "string"},
                                    "input": {"type": "string", "maxLength": 4096},
                                    "voice": {"type": "string"},
                                    "response_format": {
                                        "enum": ["mp3", "wav", "pcm", "flac", "opus", "aac"]
                                    },
                                    "speed": {"type": "number", "minimum": 0.25, "maximum": 4},
                                    "stream_format": {"enum": ["audio", "sse"]},
                                    "fairlane_class": _CLASS,
                                },
                                "required": ["input"],
                            }
                        }
                    },
                },
                "responses": {
                    "200": {"description": "The audio, or text/event-stream of speech.audio.*"},
                    **_errors(400, 401, 429),
                },
            }
        },
        "/v1/audio/voices": {
            "get": {
                "summary": "The voices this server speaks with",
                "responses": {"200": {"description": "Voice list"}, **_errors(401)},
            }
        },
        "/v1/audio/transcriptions": {
            "post": {
                "summary": "Transcribe one utterance (class voice by default); WAV, FLAC, MP3, "
                "OGG or raw 16-bit PCM (audio/pcm with sample_rate); at most 120 s",
                "parameters": [_CLASS_HEADER],
                "requestBody": _multipart(
                    {
                        "file": {"type": "string", "format": "binary"},
                        "model": {"type": "string"},
                        "language": {"type": "string"},
                        "prompt": {"type": "string"},
                        "response_format": {"enum": ["json", "text", "verbose_json"]},
                        "sample_rate": {"type": "integer", "minimum": 1000, "maximum": 384000},
                        "fairlane_class": _CLASS,
                        "user": {"type": "string"},
                        "deadline_ms": _DEADLINE,
                    },
                    ["file"],
                ),
                "responses": {
                    "200": {"description": "The transcript (json, text or verbose_json)"},
                    **_errors(400, 401, 413, 429),
                },
            }
        },
        "/v1/embeddings": {
            "post": {
                "summary": "Embed texts (class background by default); each text waits as one "
                "request of its class",
                "parameters": [_CLASS_HEADER],
                "requestBody": _json(
                    {
                        "input": {
                            "oneOf": [
                                {"type": "string"},
                                {"type": "array", "items": {"type": "string"}},
                            ]
                        },
                        "model": {"type": "string"},
                        "encoding_format": {"enum": ["float", "base64"]},
                        "dimensions": {"type": ["integer", "null"], "minimum": 1},
                        "user": {"type": ["string", "null"]},
                        "fairlane_class": _CLASS,
                        "priority": _PRIORITY,
                        "deadline_ms": _DEADLINE,
                    },
                    ["input"],
                ),
                "responses": {
                    "200": {"description": "list of embedding"},
                    **_errors(400, 401, 413, 429),
                },
            }
        },
        "/v1/documents": {
            "post": {
                "summary": "Add a household document (text, Markdown, HTML, PDF): stored "
                "before it is acknowledged, then chunked and indexed in the background lane",
                "requestBody": {
                    "required": True,
                    "content": {
                        **_json(_DOCUMENT_FIELDS, ["text"])["content"],
                        **_multipart(
                            {
                                "file": {"type": "string", "format": "binary"},
                                "title": {"type": "string"},
                                "source": {"type": "string"},
                                "tags": {"type": "string", "description": "comma-separated"},
                                "content_type": {"type": "string"},
                            },
                            ["file"],
                        )["content"],
                    },
                },
                "responses": {
                    "200": {"description": "Already stored (unchanged: true)"},
                    "202": {"description": "Stored; indexing"},
                    **_errors(400, 401, 413, 415, 507),
                },
            },
            "get": {
                "summary": "Every document with its indexing progress",
                "responses": {"200": {"description": "Document list"}, **_errors(401)},
            },
        },
        "/v1/documents/search": {
            "post": {
                "summary": "The passages nearest in meaning to a query (class chat by default)",
                "parameters": [_CLASS_HEADER],
                "requestBody": _json(
                    {
                        "query": {"type": "string", "minLength": 1},
                        "top_k": {"type": "integer", "minimum": 1, "maximum": 50},
                        "fairlane_class": _CLASS,
                    },
                    ["query"],
                    extra=False,
                ),
                "responses": {"200": {"description": "Hits"}, **_errors(400, 401, 429)},
            }
        },
        "/v1/documents/{id}": {
            "get": {
                "summary": "One document and its indexing progress",
                "parameters": [_ID],
                "responses": {"200": {"description": "Document"}, **_errors(401, 404)},
            },
            "delete": {
                "summary": "Forget a document and its passages",
                "parameters": [_ID],
                "responses": {"200": {"description": "Deleted"}, **_errors(401, 404)},
            },
        },
        "/v1/jobs": {
            "get": {
                "summary": "Background jobs (indexing, summaries) and their progress",
                "responses": {"200": {"description": "Job list"}, **_errors(401)},
            }
        },
        "/v1/jobs/{id}": {
            "get": {
                "summary": "One background job",
                "parameters": [_ID],
                "responses": {"200": {"description": "Job"}, **_errors(401, 404)},
            }
        },
        "/v1/summaries": {
            "post": {
                "summary": "A summary job (background lane), durable before it is "
                "acknowledged: give text or document_id",
                "requestBody": _json(
                    {
                        "text": {"type": "string", "minLength": 1},
                        "document_id": {"type": "string"},
                        "style": {"enum": ["short", "bullets"]},
                        "max_words": {"type": "integer", "minimum": 10, "maximum": 400},
                    },
                    [],
                    extra=False,
                ),
                "responses": {
                    "202": {"description": "Stored; pending"},
                    **_errors(400, 401, 404, 507),
                },
            }
        },
        "/v1/summaries/{id}": {
            "get": {
                "summary": "A summary job's status and result",
                "parameters": [_ID],
                "responses": {"200": {"description": "Summary"}, **_errors(401, 404)},
            }
        },
        "/v1/stats": {
            "get": {
                "summary": "Per-class TTFT/ITL/E2E percentiles, queues, KV, device use (the "
                "LLM's loop, and every loop in `devices`), steps, remote lanes",
                "responses": {"200": {"description": "Stats"}, **_errors(401)},
            }
        },
        "/metrics": {
            "get": {
                "summary": "Prometheus metrics",
                "responses": {"200": {"description": "Prometheus text format"}, **_errors(401)},
            }
        },
        "/openapi.json": {
            "get": {
                "summary": "This document",
                "responses": {"200": {"description": "OpenAPI 3.1"}},
            }
        },
    },
}
