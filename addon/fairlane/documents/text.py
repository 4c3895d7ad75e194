"""A document's text: extracted from text, Markdown, HTML or PDF, and cut into overlapping
token-aware chunks, each with the token ids it will be embedded from."""

from __future__ import annotations

import html.parser
import io
from typing import Any

from fairlane.engines.embed import EmbeddingEngine

CHUNK_TOKENS, CHUNK_OVERLAP = 200, 40


class DocumentError(ValueError):
    """A document that cannot be added; `status` is the HTTP status to answer with."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class _TextOfHtml(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag: str, attrs: Any) -> None:
        if tag in ("script", "style"):
            self._skip += 1

    def handle_endtag(self, tag: str) -> None:
        if tag in ("script", "style") and self._skip:
            self._skip -= 1
        elif tag in ("p", "div", "br", "li", "h1", "h2", "h3", "tr"):
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if not self._skip:
            self.parts.append(data)


CONTENT_TYPES = {
    "text/plain": "text",
    "text": "text",
    "text/markdown": "markdown",
    "markdown": "markdown",
    "text/html": "html",
    "html": "html",
    "application/pdf": "pdf",
    "pdf": "pdf",
}


def extract_text(data: bytes, content_type: str) -> str:
    """Plain text of a text, Markdown, HTML or PDF document."""
    kind = CONTENT_TYPES.get(content_type.split(";")[0].strip().lower())
    if kind is None:
        raise DocumentError(
            f"unsupported content type {content_type!r}: send text, Markdown, HTML or PDF", 415
        )
    if kind == "pdf":
        from pypdf import PdfReader
        from pypdf.errors import PdfReadError

        try:
            reader = PdfReader(io.BytesIO(data))
            text = "\n".join(page.extract_text() or "" for page in reader.pages)
        except (PdfReadError, ValueError, KeyError, TypeError) as err:
            raise DocumentError(f"the PDF cannot be read: {err}") from err
    else:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as err:
            raise DocumentError("the document is not UTF-8 text") from err
        if kind == "html":
            parser = _TextOfHtml()
            parser.feed(text)
            text = "".join(parser.parts)
    text = "\n".join(line.strip() for line in text.splitlines() if line.strip())
    if not text:
        raise DocumentError("the document holds no text")
    return text


def chunk_tokens(token_ids: list[int], size: int, overlap: int) -> list[tuple[int, int]]:
    """Overlapping windows of `size` tokens (start, end) covering every token once at least."""
    if len(token_ids) <= size:
        return [(0, len(token_ids))]
    step = size - overlap
    spans = []
    start = 0
    while True:
        end = min(start + size, len(token_ids))
        spans.append((start, end))
        if end == len(token_ids):
            return spans
        start += step


def chunk(embedder: EmbeddingEngine, text: str) -> list[tuple[str, list[int]]]:
    """Token-aware overlapping chunks of `text`, each with the token ids it will embed."""
    encoding = embedder.tokenizer_full.encode(text, add_special_tokens=False)
    # Read once: each access to `.offsets` or `.ids` copies the whole list out of the
    # tokenizer (read per chunk, a 1 MB document took 281 s to be accepted).
    ids, offsets = encoding.ids, encoding.offsets
    chunks = []
    for start, end in chunk_tokens(ids, CHUNK_TOKENS, CHUNK_OVERLAP):
        piece = text[offsets[start][0] : offsets[end - 1][1]]
        chunks.append((piece, embedder.tokenize([piece])[0]))
    return chunks
