"""A chat message's content parts as text the model can read: text as it is, and files (OpenAI's
`file` parts, PDFs pasted as base64 by Home Assistant's llama.cpp integration) extracted as the
document store extracts them; images and audio are refused with a 400 that says why."""

from __future__ import annotations

import base64
import binascii
import re
from pathlib import Path
from typing import Any

from fairlane.api.common import ApiError
from fairlane.documents.text import DocumentError, extract_text

# Core's llama.cpp integration sends a PDF as a text part: "[File: name.pdf]\nContent: <base64>".
_PASTED_FILE = re.compile(
    r"\A\[File: (?P<name>[^\]\n]+)\]\nContent: (?P<data>[A-Za-z0-9+/=\s]+)\Z"
)
_DATA_URL = re.compile(
    r"\Adata:(?P<type>[\w.+-]+/[\w.+-]+)?(?:;[^,]*)?;base64,(?P<data>.*)\Z", re.S
)
_BY_SUFFIX = {".pdf": "application/pdf", ".md": "text/markdown", ".html": "text/html",
              ".htm": "text/html", ".txt": "text/plain"}


def read_parts(messages: list[dict[str, Any]], model: str) -> list[dict[str, Any]]:
    """Content parts as text the model can read: `text` as it is; `file` parts (OpenAI's
    shape, `file_data` a base64 data URL) and base64 PDFs pasted into a text part are
    extracted as the document store extracts them (text, Markdown, HTML, PDF). Images and
    audio get a 400 that says what the model reads. Runs in a thread: PDFs take a while."""
    out = []
    for index, message in enumerate(messages):
        content = message.get("content")
        if not isinstance(content, list):
            out.append(message)
            continue
        texts = [
            _part_text(part, model, f"messages.{index}.content.{number}")
            for number, part in enumerate(content)
        ]
        out.append({**message, "content": [{"type": "text", "text": t} for t in texts]})
    return out


def _part_text(part: dict[str, Any], model: str, where: str) -> str:
    kind = part["type"]
    if kind == "text":
        text = part.get("text")
        if not isinstance(text, str):
            raise ApiError(400, f"{where}.text: a text part needs its text", param=where)
        pasted = _PASTED_FILE.match(text)
        if pasted is None:
            return text
        data = _base64(pasted["data"], where)
        if not data.startswith(b"%PDF"):
            return text
        return _file_text(pasted["name"], data, "application/pdf", where)
    if kind == "file":
        file = part.get("file")
        if not isinstance(file, dict) or not isinstance(file.get("file_data"), str):
            raise ApiError(
                400,
                f"{where}.file: send the file inline as `file_data`, a base64 data URL "
                "(uploaded file ids are not kept by this server)",
                param=where,
            )
        name = str(file.get("filename") or "attachment")
        url = _DATA_URL.match(file["file_data"])
        raw = url["data"] if url else file["file_data"]
        content_type = (url["type"] if url else None) or _BY_SUFFIX.get(
            Path(name).suffix.lower(), "text/plain"
        )
        if content_type.startswith("image/"):
            return _part_text({"type": "image_url"}, model, where)
        return _file_text(name, _base64(raw, where), content_type, where)
    what = {"image_url": "image", "input_image": "image", "input_audio": "audio"}.get(kind, kind)
    raise ApiError(
        400,
        f"{where}: {what} input is not supported: {model} reads text only (send text, or a "
        "text, Markdown, HTML or PDF file part)",
        param=where,
        code="unsupported_content",
    )


def _base64(data: str, where: str) -> bytes:
    try:
        return base64.b64decode("".join(data.split()), validate=True)
    except (binascii.Error, ValueError) as err:
        raise ApiError(400, f"{where}: the file data is not base64: {err}", param=where) from err


def _file_text(name: str, data: bytes, content_type: str, where: str) -> str:
    try:
        text = extract_text(data, content_type)
    except DocumentError as err:
        raise ApiError(400, f"{where}: {name}: {err}", param=where) from err
    return f"[File: {name}]\n{text}"
