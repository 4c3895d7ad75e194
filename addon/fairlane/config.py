"""Fairlane's configuration: one YAML file, validated once here, typed everywhere after.

Every key has a default; the README's table lists them. Errors name the key and the rule, e.g.
"policy.slice_ms: value must be at least 1".

Longer than the project's ~450 lines on purpose: the whole file's schema and its dataclasses
read top to bottom in the order of the YAML, one section after another.
"""

from __future__ import annotations

import copy
import ipaddress
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
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


# An engine's `worker`: the device loop it runs on; engines that name the same worker share
# one loop. None: the device it runs on (`cpu`, `cuda`), so a GPU's engines never wait for a
# CPU's steps (rule 10).
_WORKER = vol.Any(None, vol.All(str, vol.Length(min=1)))

_SLO = vol.Schema(
    {
        vol.Optional("ttft_ms"): vol.Any(None, _positive(1)),
        vol.Optional("itl_ms"): vol.Any(None, _positive(1)),
        vol.Optional("stt_ms"): vol.Any(None, _positive(1)),
    }
)

POLICY_SCHEMA = vol.Schema(
    {
        vol.Optional("name", default="fairlane"): vol.In(["fairlane", "separate", "vllm", "fcfs"]),
        vol.Optional("slice_ms"): _positive(1),
        vol.Optional("arrival_wait_fraction"): vol.All(
            vol.Coerce(float), vol.Range(min=0.05, max=1.0)
        ),
        vol.Optional("forecast_wait_fraction"): vol.All(
            vol.Coerce(float), vol.Range(min=0.0, max=1.0)
        ),
        vol.Optional("max_batch_tokens"): _count(16),
        vol.Optional("max_num_seqs"): _count(1),
        vol.Optional("min_prefill_chunk"): _count(1),
        vol.Optional("background_min_chunk"): _count(1),
        vol.Optional("owed_chunk_worth"): vol.All(vol.Coerce(float), vol.Range(min=0.0, max=8.0)),
        vol.Optional("itl_headroom"): vol.All(vol.Coerce(float), vol.Range(min=0.1, max=1.0)),
        vol.Optional("voice_pace"): vol.All(vol.Coerce(float), vol.Range(min=1.0)),
        vol.Optional("kv_blocks"): _count(1),
        vol.Optional("block_size"): _count(1),
        vol.Optional("kv_watermark"): vol.All(vol.Coerce(float), vol.Range(min=0.0, max=0.9)),
        vol.Optional("embed_max_batch"): _count(1),
        vol.Optional("embed_max_batch_tokens"): _count(16),
        vol.Optional("stt_max_batch"): _count(1),
        vol.Optional("tts_max_batch"): _count(1),
        vol.Optional("vtc_input_weight"): _positive(),
        vol.Optional("vtc_output_weight"): _positive(),
        vol.Optional("batch_window_ms"): _per_class(_positive()),
        vol.Optional("background_min_share"): vol.All(
            vol.Coerce(float), vol.Range(min=0.0, max=1.0)
        ),
        vol.Optional("background_max_wait_s"): _positive(),
        vol.Optional("turn_gap_s"): vol.All(vol.Coerce(float), vol.Range(min=0.0)),
        vol.Optional("share_window_s"): _positive(0.1),
        vol.Optional("queue_limit"): _per_class(_count(1)),
        vol.Optional("deadline_ms"): _per_class(vol.Any(None, _positive(1))),
        vol.Optional("max_wait_ms"): _per_class(vol.Any(None, _positive(1))),
        vol.Optional("slo"): _per_class(_SLO),
    },
    extra=vol.PREVENT_EXTRA,
)

CLASS_NAMES = [p.label for p in Priority]

SERVER_SCHEMA = vol.Schema(
    {
        vol.Optional("host", default="127.0.0.1"): str,
        vol.Optional("port", default=8844): vol.All(vol.Coerce(int), vol.Range(min=0, max=65535)),
        vol.Optional("token", default=None): vol.Any(None, str),
        # The cost profile the policy starts from; "auto": the CPU profile unless layers are
        # offloaded to a GPU. Measured step times correct it online either way.
        vol.Optional("profile", default="auto"): str,
        # Interactive SLO targets are multiplied by this on a CPU (a 2-core box is ~8× slower).
        vol.Optional("cpu_slo_scale", default=8.0): _positive(1),
        vol.Optional("max_body_mb", default=32): _positive(0.001),
        # Connections the OS holds for the server while it is busy accepting (the kernel caps
        # it at net.core.somaxconn); beyond it, new connections are refused or reset.
        vol.Optional("backlog", default=1024): _count(1),
        # Where the document index (SQLite) lives.
        vol.Optional("data_dir", default="~/.local/share/fairlane"): str,
        # Addresses that may read the dashboard's figures (GET /v1/stats) without the token:
        # the add-on lists Supervisor's ingress proxy, which has already checked the user.
        vol.Optional("stats_readers", default=[]): [str],
        # With no token set: read it from this file, or make one there on first start (the
        # add-on keeps it in /data and hands it to Home Assistant through discovery).
        vol.Optional("token_file", default=None): vol.Any(None, str),
        # A GPU asked for and not obtained: refuse to start (true), or start on the CPU and
        # say so in the log and /health (false).
        vol.Optional("require_devices", default=False): bool,
        # More tokens, each for one client with the most urgent class it may claim (e.g.
        # automations at most `background`): a request above its ceiling runs at the ceiling.
        # `token` (above) may claim every class.
        vol.Optional("clients", default=[]): [
            vol.Schema(
                {
                    vol.Required("name"): vol.All(str, vol.Length(min=1)),
                    vol.Required("token"): vol.All(str, vol.Length(min=8)),
                    vol.Optional("max_class", default="voice"): vol.In(CLASS_NAMES),
                },
                extra=vol.PREVENT_EXTRA,
            )
        ],
    },
    extra=vol.PREVENT_EXTRA,
)

LLM_SCHEMA = vol.Schema(
    {
        # A packaged model name (see fairlane.engines.models) or a path to any GGUF file.
        vol.Optional("model", default="qwen2.5-coder-0.5b-instruct"): str,
        vol.Optional("n_ctx", default=8192): _count(256),
        vol.Optional("n_seq_max", default=8): _count(1),
        vol.Optional("n_batch", default=512): _count(32),
        vol.Optional("threads", default=0): _count(0),  # 0: one per core this process owns
        vol.Optional("gpu_layers", default=0): vol.All(vol.Coerce(int), vol.Range(min=-1)),
        vol.Optional("max_tokens", default=512): _count(1),  # when a request names none
        # KV cells kept for finished sequences, reused by prompts that start the same way;
        # taken from n_ctx. None: a quarter of n_ctx; 0: no prefix cache.
        vol.Optional("prefix_cache_tokens", default=None): vol.Any(None, _count(0)),
        # A request's grammar work (JSON mode, tool calls) in one step, at most: past it that
        # request ends with a 400 and the step goes on for everyone else.
        vol.Optional("grammar_budget_ms", default=500): _count(1),
        vol.Optional("worker", default=None): _WORKER,
    },
    extra=vol.PREVENT_EXTRA,
)

STT_SCHEMA = vol.Schema(
    {
        vol.Optional("enabled", default=True): bool,
        # A packaged model (whisper-base: multilingual, whisper-tiny.en: fast English), a
        # CTranslate2 model directory, or a faster-whisper model name.
        vol.Optional("model", default="whisper-base"): str,
        vol.Optional("device", default="cpu"): vol.In(["cpu", "cuda", "auto"]),
        vol.Optional("compute_type", default="int8"): str,
        vol.Optional("threads", default=0): _count(0),  # 0: one per core this process owns
        vol.Optional("beam_size", default=1): _count(1),
        vol.Optional("vad", default=False): bool,  # trim silence before transcribing
        vol.Optional("worker", default=None): _WORKER,
    },
    extra=vol.PREVENT_EXTRA,
)

EMBED_SCHEMA = vol.Schema(
    {
        vol.Optional("enabled", default=True): bool,
        # A packaged model (all-minilm-l6-v2) or a sentence-transformers model folder.
        vol.Optional("model", default="all-minilm-l6-v2"): str,
        vol.Optional("backend", default="onnx-int8"): vol.In(["torch", "onnx", "onnx-int8"]),
        vol.Optional("device", default="cpu"): vol.In(["cpu", "cuda"]),
        vol.Optional("threads", default=0): _count(0),  # 0: one per core this process owns
        vol.Optional("max_inputs", default=2048): _count(1),  # texts in one request
        vol.Optional("worker", default=None): _WORKER,
    },
    extra=vol.PREVENT_EXTRA,
)

TTS_SCHEMA = vol.Schema(
    {
        vol.Optional("enabled", default=True): bool,
        # A packaged voice (en_US-joe-medium) or a Piper voice file (<name>.onnx with its
        # <name>.onnx.json beside it).
        vol.Optional("voice", default="en_US-joe-medium"): str,
        vol.Optional("device", default="cpu"): vol.In(["cpu", "cuda"]),
        vol.Optional("threads", default=0): _count(0),  # 0: one per core this process owns
        vol.Optional("worker", default=None): _WORKER,
    },
    extra=vol.PREVENT_EXTRA,
)

def _network(value: Any) -> str:
    try:
        return str(ipaddress.ip_network(str(value), strict=False))
    except ValueError as err:
        raise vol.Invalid(f"not an address or network: {value!r}") from err


WYOMING_SCHEMA = vol.Schema(
    {
        vol.Optional("enabled", default=True): bool,
        vol.Optional("host", default=None): vol.Any(str, None),  # None: server.host
        vol.Optional("port", default=10300): vol.All(vol.Coerce(int), vol.Range(min=0, max=65535)),
        # Transcribe at the speaker's first pause, before the client ends the utterance.
        vol.Optional("early_transcript", default=True): bool,
        # Wyoming has no authentication: at most this many connections at once (a satellite
        # or pipeline uses one per utterance), each served at this class at most.
        vol.Optional("max_connections", default=8): _count(1),
        vol.Optional("max_class", default="voice"): vol.In(CLASS_NAMES),
        # A connection with no event for this long is closed (its first event: 5 s at most),
        # so idle connections cannot hold every slot.
        vol.Optional("idle_timeout_s", default=30.0): vol.All(
            vol.Coerce(float), vol.Range(min=1.0, max=3600.0)
        ),
        # The addresses or networks that may connect (e.g. [172.30.32.0/23, 192.168.1.20]);
        # empty: any. Wyoming has no credentials, so beyond loopback this is its access control.
        vol.Optional("clients", default=[]): [_network],
    },
    extra=vol.PREVENT_EXTRA,
)

def _remote_url(value: Any) -> str:
    url = str(value).rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise vol.Invalid("must be an http:// or https:// URL (the engine's /v1 base)")
    return url


# A lane on another machine (rule 10): the work of these classes and kinds goes to a remote
# OpenAI-compatible engine (vLLM, SGLang, llama-server, another Fairlane): `llm`, chat
# completions and summaries; `embed`, embeddings (the document index's too). Admission, class
# order, fairness and queue limits are still this server's.
REMOTE_SCHEMA = vol.Schema(
    {
        vol.Required("name"): vol.All(str, vol.Length(min=1)),
        vol.Required("url"): _remote_url,
        vol.Optional("token", default=None): vol.Any(None, str),
        # The `model` sent to the remote; None: the client's, as it asked.
        vol.Optional("model", default=None): vol.Any(None, str),
        vol.Optional("classes", default=["background"]): vol.All(
            [vol.In(CLASS_NAMES)], vol.Length(min=1)
        ),
        vol.Optional("kinds", default=["llm"]): vol.All(
            [vol.In(["llm", "embed"])], vol.Length(min=1)
        ),
        # Requests the remote holds at once at most; the window shrinks below it while the
        # remote's time to first token is over `window_ttft_ms` (it is queueing, not serving).
        vol.Optional("max_in_flight", default=4): _count(1),
        vol.Optional("window_ttft_ms", default=5000): _positive(1),
        # Longest silence from the remote (before its first token, between chunks) before the
        # request fails; connecting has at most 10 s.
        vol.Optional("timeout_s", default=60): _positive(0.1),
        # The circuit breaker: this many failures in a row stop sending for `open_s`, then one
        # request probes the remote again.
        vol.Optional("failures_to_open", default=3): _count(1),
        vol.Optional("open_s", default=30): _positive(0.1),
    },
    extra=vol.PREVENT_EXTRA,
)


def _one_remote_per_class(remotes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    seen: dict[tuple[str, str], str] = {}
    for remote in remotes:
        for work in ((label, kind) for label in remote["classes"] for kind in remote["kinds"]):
            if work in seen:
                raise vol.Invalid(
                    f"{work[1]} work of class {work[0]!r} is bound to both {seen[work]!r} "
                    f"and {remote['name']!r}"
                )
            seen[work] = remote["name"]
    return remotes


CONFIG_SCHEMA = vol.Schema(
    {
        vol.Optional("remotes", default=[]): vol.All([REMOTE_SCHEMA], _one_remote_per_class),
        vol.Optional("server", default={}): SERVER_SCHEMA,
        vol.Optional("policy", default={}): POLICY_SCHEMA,
        vol.Optional("llm", default={}): LLM_SCHEMA,
        vol.Optional("stt", default={}): STT_SCHEMA,
        vol.Optional("tts", default={}): TTS_SCHEMA,
        vol.Optional("wyoming", default={}): WYOMING_SCHEMA,
        vol.Optional("embed", default={}): EMBED_SCHEMA,
    },
    extra=vol.PREVENT_EXTRA,
)


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
