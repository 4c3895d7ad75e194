"""The Home Assistant add-on: config.yaml by the Supervisor's rules, options ↔ server settings
(the s6 run script executed with a sample options.json), the s6 tree, the Dockerfiles (hadolint)
and the standalone compose file. No Docker engine is needed."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import tomllib
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from fairlane import config
from fairlane.cli import build_parser
from fairlane.policy import Priority

ROOT = Path(__file__).resolve().parents[2]
ADDON = ROOT / "addon"
S6 = ADDON / "rootfs" / "etc" / "s6-overlay" / "s6-rc.d"
BIN = Path(os.environ.get("VIRTUAL_ENV", ROOT / ".venv")) / "bin"
CONFIG = yaml.safe_load((ADDON / "config.yaml").read_text())

# Supervisor's option types (the add-on configuration docs): type[(range)] with `?` optional.
SCHEMA_TYPE = re.compile(
    r"^(str|bool|email|url|password|port|device(\(.*\))?|match\(.+\)|list\([^|()]+(\|[^|()]+)*\)"
    r"|int(\(-?\d*,-?\d*\))?|float(\(-?[\d.]*,-?[\d.]*\))?)\??$"
)
MAPS = {"homeassistant_config", "addon_config", "app_config", "ssl", "addons", "backup", "share",
        "media", "all_addon_configs"}


# --- config.yaml ----------------------------------------------------------------------------


def test_config_yaml_follows_the_supervisor_rules() -> None:
    for key in ("name", "version", "slug", "description", "arch"):
        assert CONFIG.get(key), key
    assert re.fullmatch(r"[a-z0-9_]+", CONFIG["slug"])
    assert isinstance(CONFIG["version"], str)
    assert set(CONFIG["arch"]) == {"amd64", "aarch64"}
    assert CONFIG["init"] is False  # s6-overlay v3 is PID 1
    ports = CONFIG["ports"]
    assert all(re.fullmatch(r"\d+/(tcp|udp)", p) for p in ports)
    assert set(CONFIG["ports_description"]) == set(ports)
    assert set(CONFIG["discovery"]) == {"fairlane", "wyoming"}
    for entry in CONFIG["map"]:
        name, _, mode = entry.partition(":")
        assert name in MAPS and mode in ("", "rw", "ro"), entry
    assert {"share:ro", "media:ro"} <= set(CONFIG["map"])  # documents, read-only
    assert "models" in CONFIG["backup_exclude"]
    assert re.fullmatch(r"(tcp|https?)://\[HOST\]:\[PORT:\d+\].*", CONFIG["watchdog"])
    assert CONFIG["ingress"] is True and f"{CONFIG['ingress_port']}/tcp" in ports
    # A published image per arch: the Supervisor pulls it instead of building on the box.
    assert CONFIG["image"].startswith("ghcr.io/") and "{arch}" in CONFIG["image"]


def test_every_option_has_a_valid_type_a_default_and_a_translation() -> None:
    schema, options = CONFIG["schema"], CONFIG["options"]
    assert set(options) == set(schema)  # every option has a default shown to the user
    for key, kind in schema.items():
        assert SCHEMA_TYPE.match(kind), f"{key}: {kind}"
        _check_value(key, kind, options[key])
    translations = yaml.safe_load((ADDON / "translations" / "en.yaml").read_text())
    assert set(translations["configuration"]) == set(schema)
    assert all(t["name"] and t["description"] for t in translations["configuration"].values())
    assert set(translations["network"]) == set(CONFIG["ports"])
    docs = (ADDON / "DOCS.md").read_text()
    for key in schema:
        assert f"`{key}`" in docs, f"DOCS.md has no section for {key}"


def _check_value(key: str, kind: str, value: Any) -> None:
    """A default must pass its own type, as the Supervisor checks it."""
    optional = kind.endswith("?")
    kind = kind.rstrip("?")
    if optional and value in ("", None):
        return
    if kind.startswith("list("):
        assert value in kind[5:-1].split("|"), key
    elif kind.startswith(("int", "float")):
        assert isinstance(value, int | float) and not isinstance(value, bool), key
        if kind.startswith("int"):
            assert isinstance(value, int), key
        if "(" in kind:
            low, high = kind[kind.index("(") + 1 : -1].split(",")
            assert (not low or value >= float(low)) and (not high or value <= float(high)), key
    elif kind == "bool":
        assert isinstance(value, bool), key
    else:
        assert isinstance(value, str), key


# --- options ↔ server settings -------------------------------------------------------------

# Each option, the value the sample gives it (never its default), and where it must land.
MAPPING: dict[str, tuple[Any, Any]] = {
    "llm_model": ("/config/models/household.gguf", lambda c: c.llm.model),
    "stt_model": ("whisper-tiny.en", lambda c: c.stt.model),
    "embed_model": ("/config/embedder", lambda c: c.embed.model),
    "threads": (3, lambda c: (c.llm.threads, c.stt.threads, c.embed.threads)),
    "context_tokens": (16384, lambda c: c.llm.n_ctx),
    "max_sequences": (4, lambda c: c.llm.n_seq_max),
    "voice_ttft_ms": (400, lambda c: c.policy.slo[Priority.VOICE].ttft_ms),
    "chat_ttft_ms": (900, lambda c: c.policy.slo[Priority.CHAT].ttft_ms),
    "chat_itl_ms": (120, lambda c: c.policy.slo[Priority.CHAT].itl_ms),
    "cpu_slo_scale": (4.5, lambda c: c.server.cpu_slo_scale),
    "slice_ms": (30, lambda c: c.policy.slice_ms),
    "background_min_share": (0.25, lambda c: c.policy.background_min_share),
    "wyoming": (False, lambda c: c.wyoming.enabled),
    "token": ("s3cret: with #chars", lambda c: c.server.token),
    "remote_url": ("http://attic.local:8844/v1", lambda c: c.remotes[0].url),
    "remote_token": ('it"s: #secret', lambda c: c.remotes[0].token),
    "remote_model": ("Qwen/Qwen2.5-7B-Instruct", lambda c: c.remotes[0].model),
    "remote_engine": ("vllm", lambda c: c.remotes[0].engine),
    "remote_classes": ("everything", lambda c: c.remotes[0].classes),
}


def _run_script(tmp_path: Path, options: dict[str, Any]) -> tuple[list[str], dict[str, str]]:
    """Run the s6 `run` script with bashio's functions and a `fairlane` that records its call."""
    (tmp_path / "options.json").write_text(json.dumps(options))
    fake = tmp_path / "bin" / "fairlane"
    fake.parent.mkdir(exist_ok=True)
    fake.write_text(
        "#!/bin/sh\n"
        f'printf "%s\\0" "$@" > {tmp_path}/argv\n'
        f'printf "%s" "$FAIRLANE_MODEL_DIR" > {tmp_path}/model_dir\n'
    )
    fake.chmod(0o755)
    script = f"source {ROOT}/tests/addon/bashio.sh; source {S6}/fairlane/run"
    env = {**os.environ, "OPTIONS": str(tmp_path / "options.json"),
           "PATH": f"{fake.parent}:{os.environ['PATH']}"}
    subprocess.run(["bash", "-c", script], env=env, check=True, capture_output=True)
    argv = (tmp_path / "argv").read_text().split("\0")[:-1]
    return argv, {"FAIRLANE_MODEL_DIR": (tmp_path / "model_dir").read_text()}


def _server_config(argv: list[str]) -> config.Config:
    """What `fairlane serve` makes of that command line (its own parser and config)."""
    args = build_parser().parse_args(argv)
    cfg = config.load(args.config, args.set or ())
    return replace(cfg, server=replace(cfg.server, token=args.token or None))


# Options the add-on's own scripts read, not the server.
ADDON_ONLY = {"wyoming_discovery"}


def test_every_option_maps_to_its_server_setting(tmp_path: Path) -> None:
    # And back: no option without a setting.
    assert set(MAPPING) == set(CONFIG["schema"]) - ADDON_ONLY
    sample = {key: value for key, (value, _) in MAPPING.items()}
    assert all(sample[k] != CONFIG["options"][k] for k in sample)  # every value is telling
    argv, env = _run_script(tmp_path, sample)
    assert argv[:5] == ["serve", "--host", "0.0.0.0", "--port", "8844"]
    cfg = _server_config(argv)
    for key, (value, setting) in MAPPING.items():
        got = setting(cfg)
        expected = (value,) * 3 if key == "threads" else value
        if key == "remote_classes":
            expected = ("voice", "chat", "background")
        assert got == expected, f"option {key}: {got!r} != {expected!r}"
    assert cfg.server.data_dir == "/data" and cfg.server.token_file == "/data/token"
    assert cfg.server.stats_readers == ("172.30.32.2",)  # Supervisor's ingress proxy
    assert env["FAIRLANE_MODEL_DIR"] == "/data/models"  # backup_exclude: models


def test_no_option_asks_for_a_device_the_image_cannot_provide(tmp_path: Path) -> None:
    """The add-on image is built for the CPU and the Supervisor gives it no CUDA GPU: whatever
    the options say, every engine runs on the CPU (before, `gpu_layers` switched the
    scheduler to GPU targets and `stt_device: cuda` stopped the add-on at start)."""
    assert not {"gpu_layers", "stt_device", "embed_device"} & set(CONFIG["schema"])
    for options in (CONFIG["options"], {key: value for key, (value, _) in MAPPING.items()}):
        cfg = _server_config(_run_script(tmp_path, options)[0])
        assert cfg.llm.gpu_layers == 0
        assert cfg.stt.device == "cpu" and cfg.embed.device == "cpu" and cfg.tts.device == "cpu"


def test_the_default_options_give_the_default_server(tmp_path: Path) -> None:
    argv, _ = _run_script(tmp_path, CONFIG["options"])
    cfg = _server_config(argv)
    defaults = config.parse({})
    assert cfg.llm == replace(defaults.llm, threads=0)
    assert cfg.stt == defaults.stt and cfg.embed == defaults.embed
    assert cfg.policy == defaults.policy
    assert cfg.server.token is None  # made on first start in /data/token
    assert cfg.remotes == ()  # no remote lane unless one is given


# --- s6, Dockerfiles, compose, repository ----------------------------------------------------


def test_s6_services_are_complete() -> None:
    assert (S6 / "fairlane" / "type").read_text().strip() == "longrun"
    assert (S6 / "discovery" / "type").read_text().strip() == "oneshot"
    assert (S6 / "discovery" / "up").read_text().strip() == str(
        Path("/etc/s6-overlay/s6-rc.d/discovery/run")
    )
    assert (S6 / "discovery" / "dependencies.d" / "fairlane").exists()
    assert {p.name for p in (S6 / "user" / "contents.d").iterdir()} == {"fairlane", "discovery"}
    for script in (S6 / "fairlane" / "run", S6 / "fairlane" / "finish", S6 / "discovery" / "run",
                   ADDON / "rootfs" / "usr" / "local" / "bin" / "fairlane"):
        assert os.access(script, os.X_OK), script
    scripts = [str(S6 / "fairlane" / "run"), str(S6 / "fairlane" / "finish"),
               str(S6 / "discovery" / "run"), str(ROOT / "scripts" / "gpu-smoke.sh"),
               str(ROOT / "scripts" / "gpu-evidence.sh"),
               str(ROOT / "scripts" / "gpu-evidence-pack.sh"),
               str(ROOT / "scripts" / "ha-current.sh")]
    result = subprocess.run([BIN / "shellcheck", "-s", "bash", *scripts], capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stdout
    discovery = (S6 / "discovery" / "run").read_text()
    assert 'bashio::discovery "fairlane"' in discovery and "token" in discovery
    assert 'bashio::discovery "wyoming"' in discovery


@pytest.mark.parametrize(("wyoming", "announce", "sent"), [
    (True, False, ["fairlane"]),  # the default: the integration has the STT and the voice
    (True, True, ["fairlane", "wyoming"]),
    (False, True, ["fairlane"]),
])
def test_wyoming_is_announced_only_when_asked(tmp_path: Path, wyoming: bool, announce: bool,
                                              sent: list[str]) -> None:
    options = {**CONFIG["options"], "wyoming": wyoming, "wyoming_discovery": announce,
               "token": "t"}
    (tmp_path / "options.json").write_text(json.dumps(options))
    stubs = (f"curl() {{ :; }}; hostname() {{ echo addon; }}; "
             f"bashio::var.json() {{ echo '{{}}'; }}; "
             f"bashio::discovery() {{ echo \"$1\" >> {tmp_path}/sent; }}")
    script = f"source {ROOT}/tests/addon/bashio.sh; {stubs}; source {S6}/discovery/run"
    env = {**os.environ, "OPTIONS": str(tmp_path / "options.json")}
    subprocess.run(["bash", "-c", script], env=env, check=True, capture_output=True)
    assert (tmp_path / "sent").read_text().split() == sent


def test_dockerfiles_pass_hadolint_and_have_what_the_addon_needs() -> None:
    files = [ADDON / "Dockerfile", ADDON / "Dockerfile.cuda"]
    result = subprocess.run(
        [BIN / "hadolint", "--config", str(ADDON / ".hadolint.yaml"), *map(str, files)],
        capture_output=True, text=True,
    )
    assert result.returncode == 0, result.stdout
    addon = (ADDON / "Dockerfile").read_text()
    assert re.search(r"^ARG BUILD_FROM=\S*debian", addon, re.M)
    assert "FROM ${BUILD_FROM}" in addon and "COPY rootfs /" in addon
    assert "HEALTHCHECK" in addon and "download.pytorch.org/whl/cpu" in addon
    cuda = (ADDON / "Dockerfile.cuda").read_text()
    assert "-DGGML_CUDA=on" in cuda and "onnxruntime-gpu" in cuda and "HEALTHCHECK" in cuda
    # The Dockerfile alone picks each arch's base (build.yaml is gone from current Supervisors).
    assert not (ADDON / "build.yaml").exists()
    assert re.search(r"^ARG BUILD_ARCH=amd64$", addon, re.M)
    assert re.search(r"^ARG BUILD_FROM=ghcr.io/home-assistant/\$\{BUILD_ARCH\}-base", addon, re.M)


def test_the_published_images_are_the_ones_the_supervisor_pulls() -> None:
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "addon.yml").read_text())
    job = workflow["jobs"]["build"]
    arches = [entry["arch"] for entry in job["strategy"]["matrix"]["include"]]
    assert sorted(arches) == sorted(CONFIG["arch"])
    action = "home-assistant/builder/actions/build-image"
    [build] = [step for step in job["steps"] if str(step.get("uses", "")).startswith(action)]
    image = build["with"]["image"].replace("${{ matrix.arch }}", "{arch}")
    assert image == CONFIG["image"]
    assert build["with"]["context"] == "addon"
    assert "io.hass.type=addon" in build["with"]["labels"]


def test_backups_are_cold_and_keep_the_users_own_models() -> None:
    """The SQLite index is copied closed (cold), and only the packaged models' copy is left
    out: a `*.gguf` pattern dropped the user's own models, contrary to the documentation."""
    assert CONFIG["backup"] == "cold"
    assert CONFIG["backup_exclude"] == ["models"]


def test_the_gpu_image_command_is_a_valid_server_config() -> None:
    cuda = (ADDON / "Dockerfile.cuda").read_text()
    entry = json.loads(re.search(r"^ENTRYPOINT (\[.*\])", cuda, re.M).group(1))
    cmd = json.loads(re.search(r"^CMD (\[.*?\])", cuda, re.M | re.S).group(1).replace("\\\n", ""))
    assert entry[0] == "fairlane"
    cfg = _server_config(entry[1:] + cmd)
    assert cfg.llm.gpu_layers == 999 and cfg.stt.device == "cuda" and cfg.embed.device == "cuda"


def test_image_requirements_are_the_packages_dependencies() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    lines = (ADDON / "requirements.txt").read_text().splitlines()
    wanted = [line for line in lines if line and not line.startswith("#")]
    assert wanted == pyproject["project"]["dependencies"]


def test_compose_runs_the_gpu_image_with_a_token_and_a_volume() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    service = compose["services"]["fairlane"]
    assert (ROOT / service["build"]["context"] / service["build"]["dockerfile"]).is_file()
    assert "FAIRLANE_TOKEN" in service["environment"]
    assert "8844:8844" in service["ports"]
    assert any(v.endswith(":/data") for v in service["volumes"])
    [device] = service["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]


def test_repository_yaml_makes_this_an_addon_repository() -> None:
    repository = yaml.safe_load((ROOT / "repository.yaml").read_text())
    assert repository["name"] and repository["url"].startswith("https://")
    for name in ("DOCS.md", "CHANGELOG.md", "README.md", "icon.png", "logo.png"):
        assert (ADDON / name).is_file(), name


def test_the_run_script_only_maps_options() -> None:
    """No logic in the script beyond mapping: no branches, no loops, one exec."""
    run = (S6 / "fairlane" / "run").read_text()
    code = [shlex.split(x, comments=True) for x in run.splitlines()[1:]]
    words = {w for tokens in code for w in tokens}
    assert not {"if", "for", "while", "case"} & words
    assert run.count("exec ") == 1
