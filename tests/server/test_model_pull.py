"""A model named in the config and not here yet: the server serves the embedded default while
it is pulled from the hub (a local stand-in), /health shows the pull and then that a restart is
due, and after the restart the server answers with the pulled model."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from fairlane.engines import models
from fairlane.server import BackgroundServer
from tests.hub.standin import Hub
from tests.server.conftest import server_config, wait_for
from tests.server.test_chat_api import http

ROOT = Path(__file__).resolve().parents[2]
REPO, NAME = "household/tiny-GGUF", "tiny-Q8_0.gguf"


@pytest.fixture
def hub_with_a_tiny_model(tmp_path: Path) -> Iterator[Hub]:
    """A random-weight model of two small layers with the default model's tokenizer."""
    script = ROOT / "scripts" / "random-gguf.py"
    tokenizer, model = tmp_path / "tokenizer.json.gz", tmp_path / NAME
    real = models.resolve_llm(models.DEFAULT_LLM)
    subprocess.run([sys.executable, str(script), "--export-tokenizer", str(tokenizer),
                    "--from", str(real)], check=True)
    subprocess.run([sys.executable, str(script), "--shape", "tiny", "--tokenizer",
                    str(tokenizer), str(model)], check=True)
    with Hub() as hub:
        hub.add(REPO, NAME, model)
        yield hub


def test_a_configured_hub_model_is_pulled_then_served_after_a_restart(
    hub_with_a_tiny_model: Hub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model_dir = tmp_path / "models"
    model_dir.mkdir()
    default = models.resolve_llm(models.DEFAULT_LLM)  # the default, not assembled again
    (model_dir / default.name).symlink_to(default)
    monkeypatch.setenv("FAIRLANE_MODEL_DIR", str(model_dir))
    monkeypatch.setenv("HF_ENDPOINT", hub_with_a_tiny_model.url)
    base = server_config()
    cfg = replace(base, llm=replace(base.llm, model=f"hf:{REPO}/{NAME}"),
                  stt=replace(base.stt, enabled=False), tts=replace(base.tts, enabled=False),
                  embed=replace(base.embed, enabled=False))
    ask = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4}
    with BackgroundServer(cfg) as server:
        status, health = http(server, "GET", "/health")
        assert health["models"]["llm"] == models.DEFAULT_LLM  # served meanwhile
        assert health["pulls"][0]["model"] == f"hf:{REPO}/{NAME}"
        done = wait_for(lambda: http(server, "GET", "/health")[1]["pulls"][0]["state"]
                        in ("done", "failed"))
        pulled = http(server, "GET", "/health")[1]["pulls"][0]
        assert done and pulled["state"] == "done", pulled
        assert pulled["restart_needed"] and pulled["bytes_done"] == pulled["bytes_total"]
        assert http(server, "POST", "/v1/chat/completions", ask)[0] == 200
    with BackgroundServer(cfg) as restarted:  # the same config and data: a restart
        status, health = http(restarted, "GET", "/health")
        assert health["models"]["llm"] == Path(NAME).stem and health["pulls"] == []
        status, reply = http(restarted, "POST", "/v1/chat/completions", ask)
        assert status == 200 and reply["model"] == Path(NAME).stem
    assert len(hub_with_a_tiny_model.downloads) == 1  # pulled once, not again at the restart


def test_a_pull_over_http_is_a_durable_job_that_can_be_cancelled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    served = tmp_path / "served.gguf"
    served.write_bytes(b"GGUF" + bytes(24 * 1024 * 1024))
    model_dir = tmp_path / "models"
    model_dir.mkdir()
    default = models.resolve_llm(models.DEFAULT_LLM)
    (model_dir / default.name).symlink_to(default)
    monkeypatch.setenv("FAIRLANE_MODEL_DIR", str(model_dir))
    base = server_config()
    cfg = replace(base, stt=replace(base.stt, enabled=False),
                  tts=replace(base.tts, enabled=False), embed=replace(base.embed, enabled=False))
    with Hub() as hub, BackgroundServer(cfg) as server:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        hub.add(REPO, NAME, served)
        status, answer = http(server, "POST", "/v1/models/pull", {"model": "nobody/x"})
        assert status == 400 and "OWNER/REPO:QUANT" in answer["error"]["message"]
        hub.slow = True
        status, job = http(server, "POST", "/v1/models/pull", {"model": f"hf:{REPO}/{NAME}"})
        assert status == 202 and job["state"] == "pulling"
        record = Path(cfg.server.data_dir).expanduser() / "pulls.json"
        assert f"hf:{REPO}/{NAME}" in record.read_text()  # written before the answer
        again = http(server, "POST", "/v1/models/pull", {"model": f"hf:{REPO}/{NAME}"})[1]
        assert again["id"] == job["id"]  # the same file: the same pull
        wait_for(lambda: http(server, "GET", f"/v1/models/pull/{job['id']}")[1]["bytes_done"])
        status, _ = http(server, "DELETE", f"/v1/models/pull/{job['id']}")
        assert status == 200
        assert wait_for(lambda: http(server, "GET", f"/v1/models/pull/{job['id']}")[1]
                        ["state"] == "cancelled")
        hub.slow = False
        status, job = http(server, "POST", "/v1/models/pull", {"model": f"hf:{REPO}/{NAME}"})
        assert wait_for(lambda: http(server, "GET", f"/v1/models/pull/{job['id']}")[1]
                        ["state"] == "done")
        assert hub.downloads[-1][1] not in (None, "bytes=0-")  # went on from its bytes
        assert (model_dir / "hub" / REPO / NAME).read_bytes() == served.read_bytes()
        assert http(server, "GET", "/v1/models/pull/nothing")[0] == 404
        assert record.read_text() == "[]"
