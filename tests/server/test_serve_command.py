"""`fairlane serve` as a person runs it: a process, flags, a token from the environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request

from fairlane.bench.servers import ServerProcess, free_port


def _get(url: str, token: str | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_serve_starts_on_the_default_model_with_a_token_from_the_environment(tmp_path) -> None:
    port = free_port()
    env = {**os.environ, "FAIRLANE_TOKEN": "from-env"}
    config = tmp_path / "fairlane.yaml"
    # Any free Wyoming port (the default may be taken); the index in the test's folder.
    config.write_text(f"wyoming: {{port: 0}}\nserver: {{data_dir: {tmp_path}}}\n")
    argv = [sys.executable, "-m", "fairlane", "serve", "--port", str(port), "--policy", "fcfs",
            "--config", str(config)]
    with ServerProcess(argv, port, env=env) as server:
        status, health = _get(f"{server.url}/health")
        assert status == 200 and health["policy"] == "fcfs"
        assert health["models"] == {
            "llm": "qwen2.5-coder-0.5b-instruct", "stt": "whisper-base", "tts": "en_US-joe-medium"
        }
        assert health["wyoming_port"] > 0
        assert _get(f"{server.url}/v1/models")[0] == 401
        assert _get(f"{server.url}/v1/models", token="from-env")[0] == 200


def test_a_bad_config_stops_serve_with_the_key_named(tmp_path) -> None:
    path = tmp_path / "fairlane.yaml"
    path.write_text("llm: {n_ctx: 10}\n")
    done = subprocess.run([sys.executable, "-m", "fairlane", "serve", "--config", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "llm.n_ctx" in done.stderr
