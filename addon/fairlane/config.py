"""Fairlane's configuration: one YAML file, validated once here, typed everywhere after.

Every key has a default; the README's table lists them. The schema (each key's rule) is
fairlane.config_schema; this module reads the file, applies `--set` overrides, and gives each
section its typed dataclass. Errors name the key and the rule, e.g. "policy.slice_ms: value
must be at least 1".
"""

from __future__ import annotations

import copy
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import voluptuous as vol
import yaml

from fairlane.config_schema import CONFIG_SCHEMA
from fairlane.policy import PolicyConfig, Priority, Slo

_DEFAULTS = PolicyConfig()


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8844
    token: str | None = None
    profile: str = "auto"
    cpu_slo_scale: float = 8.0
    max_body_mb: float = 32
    backlog: int = 1024
    data_dir: str = "~/.local/share/fairlane"
    stats_readers: tuple[str, ...] = ()
    token_file: str | None = None
    require_devices: bool = False
    clients: tuple[ClientToken, ...] = ()

    @property
    def authenticated(self) -> bool:
        """Whether requests need a bearer token (one is set, or clients have their own)."""
        return self.token is not None or bool(self.clients)


@dataclass(frozen=True)
class ClientToken:
    """A client's own token, and the most urgent class it may claim."""

    name: str
    token: str
    max_class: str = "voice"


@dataclass(frozen=True)
class LlmConfig:
    model: str = "qwen2.5-coder-0.5b-instruct"
    n_ctx: int = 8192
    n_seq_max: int = 8
    n_batch: int = 512
    threads: int = 0
    give_way: bool = True
    gpu_layers: int = 0
    max_tokens: int = 512
    prefix_cache_tokens: int | None = None
    grammar_budget_ms: int = 500
    worker: str | None = None

    @property
    def prefix_cache(self) -> int:
        """Tokens of KV kept for the prefix cache (a quarter of the context unless set)."""
        if self.prefix_cache_tokens is None:
            return self.n_ctx // 4
        return min(self.prefix_cache_tokens, self.n_ctx // 2)


@dataclass(frozen=True)
class SttConfig:
    enabled: bool = True
    model: str = "whisper-base"
    device: str = "cpu"
    compute_type: str = "int8"
    threads: int = 0
    beam_size: int = 1
    vad: bool = False
    worker: str | None = None


@dataclass(frozen=True)
class EmbedConfig:
    enabled: bool = True
    model: str = "all-minilm-l6-v2"
    backend: str = "onnx-int8"
    device: str = "cpu"
    threads: int = 0
    max_inputs: int = 2048
    worker: str | None = None


@dataclass(frozen=True)
class TtsConfig:
    enabled: bool = True
    voice: str = "en_US-joe-medium"
    device: str = "cpu"
    threads: int = 0
    worker: str | None = None


@dataclass(frozen=True)
class WyomingConfig:
    enabled: bool = True
    host: str | None = None
    port: int = 10300
    early_transcript: bool = True
    max_connections: int = 8
    max_class: str = "voice"
    idle_timeout_s: float = 30.0
    clients: tuple[str, ...] = ()


@dataclass(frozen=True)
class RemoteConfig:
    name: str
    url: str
    engine: str = "openai"  # vllm, sglang: sent each request's class as their `priority`
    token: str | None = None
    model: str | None = None
    classes: tuple[str, ...] = ("background",)
    kinds: tuple[str, ...] = ("llm",)
    max_in_flight: int = 4
    window_ttft_ms: float = 5000
    timeout_s: float = 60
    failures_to_open: int = 3
    open_s: float = 30


@dataclass(frozen=True)
class Config:
    server: ServerConfig = field(default_factory=ServerConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    policy_name: str = "fairlane"
    llm: LlmConfig = field(default_factory=LlmConfig)
    stt: SttConfig = field(default_factory=SttConfig)
    tts: TtsConfig = field(default_factory=TtsConfig)
    wyoming: WyomingConfig = field(default_factory=WyomingConfig)
    embed: EmbedConfig = field(default_factory=EmbedConfig)
    remotes: tuple[RemoteConfig, ...] = ()

    @property
    def profile(self) -> str:
        if self.server.profile != "auto":
            return self.server.profile
        return "cpu-2core" if self.llm.gpu_layers == 0 else "rtx4090"

    @property
    def llm_capacity(self) -> int:
        """KV positions the running sequences share: the context less the prefix cache, in
        whole policy blocks. The one number the engine, the policy and the API clamp all use."""
        block = self.policy.block_size
        return (self.llm.n_ctx - self.llm.prefix_cache) // block * block

    @property
    def engine_cache_tokens(self) -> int:
        """Cells the engine keeps for its prefix cache: all of the context but the capacity."""
        return self.llm.n_ctx - self.llm_capacity if self.llm.prefix_cache else 0

    def serving_policy(self, device: str) -> PolicyConfig:
        """The policy as the server runs it: budgets fitted to the engine, SLOs to the device."""
        policy = replace(
            self.policy,
            kv_blocks=self.llm_capacity // self.policy.block_size,
            max_num_seqs=min(self.policy.max_num_seqs, self.llm.n_seq_max),
            max_batch_tokens=min(self.policy.max_batch_tokens, self.llm.n_ctx),
        )
        return policy.scaled(self.server.cpu_slo_scale) if device == "cpu" else policy


class ConfigError(ValueError):
    """A configuration a person must fix; the message names the key."""


def policy_config(raw: dict[str, Any]) -> PolicyConfig:
    """Build a PolicyConfig from validated `policy:` values, per-class maps merged on defaults."""
    values = {k: v for k, v in raw.items() if k != "name"}
    for key in ("batch_window_ms", "queue_limit", "deadline_ms", "max_wait_ms"):
        if key in values:
            merged = dict(getattr(_DEFAULTS, key))
            merged.update({Priority.parse(c): v for c, v in values[key].items()})
            values[key] = merged
    if "slo" in values:
        slos = dict(_DEFAULTS.slo)
        for label, targets in values["slo"].items():
            priority = Priority.parse(label)
            current = slos[priority]
            slos[priority] = Slo(
                ttft_ms=targets.get("ttft_ms", current.ttft_ms),
                itl_ms=targets.get("itl_ms", current.itl_ms),
                stt_ms=targets.get("stt_ms", current.stt_ms),
            )
        values["slo"] = slos
    return PolicyConfig(**values)


def parse(data: dict[str, Any] | None) -> Config:
    """Validate a configuration mapping (as read from YAML) into a Config."""
    try:
        valid = CONFIG_SCHEMA(data or {})
    except vol.MultipleInvalid as err:
        raise ConfigError(_describe(err)) from err
    return Config(
        server=ServerConfig(
            **{
                **valid["server"],
                "stats_readers": tuple(valid["server"]["stats_readers"]),
                "clients": tuple(ClientToken(**c) for c in valid["server"]["clients"]),
            }
        ),
        policy=policy_config(valid["policy"]),
        policy_name=valid["policy"]["name"],
        llm=LlmConfig(**valid["llm"]),
        stt=SttConfig(**valid["stt"]),
        tts=TtsConfig(**valid["tts"]),
        wyoming=WyomingConfig(
            **{**valid["wyoming"], "clients": tuple(valid["wyoming"]["clients"])}
        ),
        embed=EmbedConfig(**valid["embed"]),
        remotes=tuple(
            RemoteConfig(**{**r, "classes": tuple(r["classes"]), "kinds": tuple(r["kinds"])})
            for r in valid["remotes"]
        ),
    )


def load(path: str | Path | None, overrides: Sequence[str] = ()) -> Config:
    """Read and validate a YAML configuration file (none: every default), then `overrides`."""
    data: Any = {}
    if path is not None:
        try:
            data = yaml.safe_load(Path(path).read_text())
        except OSError as err:
            raise ConfigError(f"cannot read config {path}: {err.strerror}") from err
        except yaml.YAMLError as err:
            raise ConfigError(f"config {path} is not valid YAML: {err}") from err
        if data is not None and not isinstance(data, dict):
            raise ConfigError(f"config {path} must be a mapping of sections")
    return parse(apply_overrides(data or {}, overrides))


def token_from_file(path: str | Path) -> str:
    """The token stored in `path`; a new random one is written there (mode 0600) if none."""
    file = Path(path).expanduser()
    if file.is_file() and (stored := file.read_text().strip()):
        return stored
    token = secrets.token_urlsafe(32)
    file.parent.mkdir(parents=True, exist_ok=True)
    file.touch(mode=0o600)
    file.write_text(token + "\n")
    return token


# Sections that are lists, set whole: `--set 'remotes=[{name: a, url: "http://…/v1"}]'`.
LIST_SECTIONS = ("remotes",)


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """`section.key=value` settings (the add-on's options, `--set`) on top of a config mapping.

    The value is read as YAML, so `8`, `true`, `[a, b]` and `null` mean what they say; an
    empty value leaves the setting at its default.
    """
    data = copy.deepcopy(data)
    for item in overrides:
        key, sep, text = item.partition("=")
        path = [part for part in key.strip().split(".") if part]
        if not sep or not path or (len(path) < 2 and path[0] not in LIST_SECTIONS):
            raise ConfigError(f"--set {item!r}: expected SECTION.KEY=VALUE, e.g. llm.threads=4")
        if not text.strip():
            continue
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise ConfigError(f"--set {item!r}: the value is not valid YAML") from err
        node = data
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"--set {item!r}: {part} is not a section")
            node = child
        node[path[-1]] = value
    return data


def _describe(err: vol.MultipleInvalid) -> str:
    return "; ".join(f"{'.'.join(str(p) for p in e.path) or 'config'}: {e.msg}" for e in err.errors)
