"""Fairlane's configuration: one YAML file, validated once here, typed everywhere after.

Every key has a default; the README's table lists them. Errors name the key and the rule, e.g.
"policy.slice_ms: value must be at least 1".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import voluptuous as vol
import yaml

from fairlane.policy import PolicyConfig, Priority, Slo

_DEFAULTS = PolicyConfig()
CLASSES = [p.label for p in Priority]


def _positive(minimum: float = 0.0) -> Any:
    return vol.All(vol.Coerce(float), vol.Range(min=minimum))


def _count(minimum: int = 1) -> Any:
    return vol.All(vol.Coerce(int), vol.Range(min=minimum))


def _per_class(value: Any) -> vol.Schema:
    return vol.Schema({vol.In(CLASSES): value})


_SLO = vol.Schema(
    {
        vol.Optional("ttft_ms"): vol.Any(None, _positive(1)),
        vol.Optional("itl_ms"): vol.Any(None, _positive(1)),
        vol.Optional("stt_ms"): vol.Any(None, _positive(1)),
    }
)

POLICY_SCHEMA = vol.Schema(
    {
        vol.Optional("name", default="fairlane"): vol.In(["fairlane", "fcfs"]),
        vol.Optional("slice_ms"): _positive(1),
        vol.Optional("max_batch_tokens"): _count(16),
        vol.Optional("max_num_seqs"): _count(1),
        vol.Optional("min_prefill_chunk"): _count(1),
        vol.Optional("itl_headroom"): vol.All(vol.Coerce(float), vol.Range(min=0.1, max=1.0)),
        vol.Optional("kv_blocks"): _count(1),
        vol.Optional("block_size"): _count(1),
        vol.Optional("kv_watermark"): vol.All(vol.Coerce(float), vol.Range(min=0.0, max=0.9)),
        vol.Optional("embed_max_batch"): _count(1),
        vol.Optional("embed_max_batch_tokens"): _count(16),
        vol.Optional("stt_max_batch"): _count(1),
        vol.Optional("vtc_input_weight"): _positive(),
        vol.Optional("vtc_output_weight"): _positive(),
        vol.Optional("batch_window_ms"): _per_class(_positive()),
        vol.Optional("background_min_share"): vol.All(
            vol.Coerce(float), vol.Range(min=0.0, max=1.0)
        ),
        vol.Optional("background_max_wait_s"): _positive(),
        vol.Optional("share_window_s"): _positive(0.1),
        vol.Optional("queue_limit"): _per_class(_count(1)),
        vol.Optional("deadline_ms"): _per_class(vol.Any(None, _positive(1))),
        vol.Optional("slo"): _per_class(_SLO),
    },
    extra=vol.PREVENT_EXTRA,
)

SERVER_SCHEMA = vol.Schema(
    {
        vol.Optional("host", default="127.0.0.1"): str,
        vol.Optional("port", default=8844): vol.All(vol.Coerce(int), vol.Range(min=1, max=65535)),
        vol.Optional("token", default=None): vol.Any(None, str),
        vol.Optional("profile", default="cpu-2core"): str,
    },
    extra=vol.PREVENT_EXTRA,
)

CONFIG_SCHEMA = vol.Schema(
    {
        vol.Optional("server", default={}): SERVER_SCHEMA,
        vol.Optional("policy", default={}): POLICY_SCHEMA,
    },
    extra=vol.PREVENT_EXTRA,
)


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8844
    token: str | None = None
    profile: str = "cpu-2core"


@dataclass(frozen=True)
class Config:
    server: ServerConfig = field(default_factory=ServerConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    policy_name: str = "fairlane"


class ConfigError(ValueError):
    """A configuration a person must fix; the message names the key."""


def policy_config(raw: dict[str, Any]) -> PolicyConfig:
    """Build a PolicyConfig from validated `policy:` values, per-class maps merged on defaults."""
    values = {k: v for k, v in raw.items() if k != "name"}
    for key in ("batch_window_ms", "queue_limit", "deadline_ms"):
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
        server=ServerConfig(**valid["server"]),
        policy=policy_config(valid["policy"]),
        policy_name=valid["policy"]["name"],
    )


def load(path: str | Path | None) -> Config:
    """Read and validate a YAML configuration file; no file means every default."""
    if path is None:
        return parse({})
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as err:
        raise ConfigError(f"cannot read config {path}: {err.strerror}") from err
    except yaml.YAMLError as err:
        raise ConfigError(f"config {path} is not valid YAML: {err}") from err
    if data is not None and not isinstance(data, dict):
        raise ConfigError(f"config {path} must be a mapping of sections")
    return parse(data)


def _describe(err: vol.MultipleInvalid) -> str:
    return "; ".join(f"{'.'.join(str(p) for p in e.path) or 'config'}: {e.msg}" for e in err.errors)
