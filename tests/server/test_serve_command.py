"""`fairlane serve` as a person runs it: a process, flags, a token from the environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

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
        assert health["status"] == "ok"
        assert {name: d["got"] for name, d in health["devices"].items()} == {
            "llm": "cpu", "stt": "cpu", "tts": "cpu", "embed": "cpu"}
        assert _get(f"{server.url}/v1/models")[0] == 401
        assert _get(f"{server.url}/v1/models", token="from-env")[0] == 200


def test_a_bad_config_stops_serve_with_the_key_named(tmp_path) -> None:
    path = tmp_path / "fairlane.yaml"
    path.write_text("llm: {n_ctx: 10}\n")
    done = subprocess.run([sys.executable, "-m", "fairlane", "serve", "--config", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "llm.n_ctx" in done.stderr


# Every engine asked for the GPU, on a machine without one (this one, and CI's).
GPU_EVERYWHERE = ["--set", "llm.gpu_layers=99", "--set", "stt.device=cuda",
                  "--set", "stt.compute_type=float16", "--set", "embed.device=cuda",
                  "--set", "embed.backend=onnx", "--set", "tts.device=cuda"]


def test_a_gpu_asked_for_and_not_obtained_is_said_not_hidden(tmp_path) -> None:
    """Before, llama.cpp ignored the layers quietly (and the policy took GPU targets), ONNX
    Runtime fell back to the CPU quietly, and CTranslate2 stopped the server at start."""
    port = free_port()
    config = tmp_path / "fairlane.yaml"
    config.write_text(f"wyoming: {{port: 0}}\nserver: {{data_dir: {tmp_path}}}\n")
    argv = [sys.executable, "-m", "fairlane", "serve", "--port", str(port),
            "--config", str(config), *GPU_EVERYWHERE]
    with ServerProcess(argv, port) as server:
        status, health = _get(f"{server.url}/health")
        assert status == 200 and health["status"] == "degraded"
        for name in ("llm", "stt", "tts", "embed"):
            device = health["devices"][name]
            assert (device["asked"], device["got"], device["ok"]) == ("cuda", "cpu", False), name
            assert device["detail"], name
        # The CPU's targets, not a GPU's: "auto" follows the device the LLM really got.
        _, stats = _get(f"{server.url}/v1/stats")
        assert stats["classes"]["voice"]["slo"]["ttft_ms"] > 1000
        log = Path(server.log.name).read_text()
    assert len([line for line in log.splitlines() if "Device not obtained" in line]) == 4


def test_required_devices_refuse_to_start_with_one_line(tmp_path) -> None:
    config = tmp_path / "fairlane.yaml"
    config.write_text(f"wyoming: {{port: 0}}\nserver: {{data_dir: {tmp_path}, "
                      "require_devices: true}\n")
    done = subprocess.run([sys.executable, "-m", "fairlane", "serve", "--config", str(config),
                           "--port", str(free_port()), *GPU_EVERYWHERE],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    [line] = [line for line in done.stderr.splitlines() if line.startswith("fairlane: ")]
    assert "llm asked for cuda and runs on cpu" in line and "require_devices" in line


def _serve(tmp_path, *extra: str, data_dir=None, timeout: float = 300):
    config = tmp_path / "one-line.yaml"
    config.write_text(f"wyoming: {{port: 0}}\nserver: {{data_dir: {data_dir or tmp_path}}}\n")
    return subprocess.run([sys.executable, "-m", "fairlane", "serve", "--config", str(config),
                           "--port", str(free_port()), *extra],
                          capture_output=True, text=True, timeout=timeout)


def _one_line(done: subprocess.CompletedProcess) -> str:
    """Start-up errors are one `fairlane: …` line and exit code 2, not a traceback."""
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    [line] = [line for line in done.stderr.splitlines() if line.startswith("fairlane: ")]
    return line


def test_a_second_server_on_the_same_data_dir_is_refused(tmp_path) -> None:
    port = free_port()
    config = tmp_path / "first.yaml"
    config.write_text(f"wyoming: {{port: 0}}\nserver: {{data_dir: {tmp_path}}}\n")
    first = [sys.executable, "-m", "fairlane", "serve", "--port", str(port),
             "--config", str(config)]
    with ServerProcess(first, port):
        assert "another Fairlane server uses the data directory" in _one_line(_serve(tmp_path))


def test_an_unusable_data_dir_is_one_line(tmp_path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    assert "cannot be used" in _one_line(_serve(tmp_path, data_dir=blocker / "data"))


def test_a_taken_wyoming_port_is_one_line(tmp_path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = _one_line(_serve(tmp_path, "--set", f"wyoming.port={port}"))
    assert "cannot listen" in line


def test_head_health_needs_no_token_and_a_wrong_method_says_which_are_right(tmp_path) -> None:
    port = free_port()
    config = tmp_path / "fairlane.yaml"
    config.write_text(f"wyoming: {{port: 0}}\nserver: {{data_dir: {tmp_path}, token: t}}\n")
    argv = [sys.executable, "-m", "fairlane", "serve", "--port", str(port), "--config",
            str(config)]
    with ServerProcess(argv, port) as server:
        head = urllib.request.Request(f"{server.url}/health", method="HEAD")
        with urllib.request.urlopen(head, timeout=30) as response:
            assert response.status == 200
        wrong = urllib.request.Request(f"{server.url}/v1/chat/completions", method="GET",
                                       headers={"Authorization": "Bearer t"})
        try:
            urllib.request.urlopen(wrong, timeout=30)
        except urllib.error.HTTPError as err:
            assert err.code == 405 and "POST" in err.headers["Allow"]
            assert json.loads(err.read())["error"]["message"]
        else:
            raise AssertionError("GET on a POST route was accepted")
