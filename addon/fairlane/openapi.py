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
        429: "Refused by admission control (queue full, deadline)",
    }
    return {
        str(c): {"description": text[c], "content": {"application/json": {"schema": _ERROR_REF}}}
        for c in codes
    }


_CLASS = {"type": "string", "enum": ["voice", "chat", "background"]}

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
                    "tool_calls": {"type": "array", "items": {"type": "object"}},
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
                        "type": "object",
                        "properties": {"include_usage": {"type": "boolean"}},
                    },
                    "max_tokens": {"type": "integer", "minimum": 1},
                    "max_completion_tokens": {"type": "integer", "minimum": 1},
                    "temperature": {"type": "number", "minimum": 0, "maximum": 2},
                    "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
                    "top_k": {"type": "integer", "minimum": 0},
                    "seed": {"type": "integer"},
                    "stop": {
                        "oneOf": [
                            {"type": "string"},
                            {"type": "array", "items": {"type": "string"}, "maxItems": 4},
                        ]
                    },
                    "user": {"type": "string", "description": "the fairness client"},
                    "tools": {"type": "array", "items": {"type": "object"}},
                    "tool_choice": {"oneOf": [{"type": "string"}, {"type": "object"}]},
                    "response_format": {
                        "type": "object",
                        "description": "text, json_object, or json_schema with "
                        "json_schema.schema: sampling is constrained to that JSON",
                    },
                    "fairlane_class": _CLASS,
                    "priority": {
                        "oneOf": [{"type": "integer"}, _CLASS],
                        "description": "vLLM's and SGLang's field: below 0 is voice, 0 chat, "
                        "above 0 background, or a class name; fairlane_class wins",
                    },
                },
                "required": ["messages"],
            },
        },
    },
    "security": [{"bearer": []}],
    "paths": {
        "/health": {
            "get": {
                "summary": "Liveness (no auth): status (degraded when an engine did not get "
                "the device asked for), devices, version, instance_id (stable per data "
                "directory), models, Wyoming port",
                "security": [],
                "responses": {"200": {"description": "Server is up"}},
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
                "parameters": [{"name": "X-Fairlane-Class", "in": "header", "schema": _CLASS}],
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
                    **_errors(400, 401, 413, 429),
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
        "/v1/stats": {
            "get": {
                "summary": "Per-class TTFT/ITL/E2E percentiles, queues, KV, device use, steps",
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
