"""A real Fairlane server (real model, real HTTP on 127.0.0.1) for the API tests."""

from __future__ import annotations

import io
import tempfile
from collections.abc import Iterator
from dataclasses import replace

import pytest

from fairlane import config
from fairlane.server import BackgroundServer

TOKEN = "test-token"


def server_config(policy: str = "fairlane", **llm: object) -> config.Config:
    data_dir = tempfile.mkdtemp(prefix="fairlane-test-")
    cfg = config.parse({"server": {"port": 0, "token": TOKEN, "data_dir": data_dir},
                        "wyoming": {"port": 0},
                        "llm": {"n_ctx": 4096, "n_seq_max": 8, "max_tokens": 64, **llm}})
    return replace(cfg, policy_name=policy)


@pytest.fixture(scope="module")
def server() -> Iterator[BackgroundServer]:
    with BackgroundServer(server_config()) as running:
        yield running


def pdf_bytes(text: str) -> bytes:
    """A one-page PDF with a text object, written by hand (no PDF writer needed)."""
    stream = f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET".encode()
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
        b"/Resources << /Font << /F1 5 0 R >> >> >>",
        b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    out = io.BytesIO()
    out.write(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(out.tell())
        out.write(b"%d 0 obj\n" % number + body + b"\nendobj\n")
    xref = out.tell()
    out.write(b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1))
    for offset in offsets:
        out.write(b"%010d 00000 n \n" % offset)
    out.write(b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n"
              % (len(objects) + 1, xref))
    return out.getvalue()
