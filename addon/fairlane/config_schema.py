"""The configuration file's schema: every key, its default and its rule, in the order of the
YAML (fairlane.config turns what it validates into typed dataclasses).

Errors name the key and the rule, e.g. "policy.slice_ms: value must be at least 1".
"""

from __future__ import annotations

import ipaddress
from typing import Any

import voluptuous as vol

from fairlane.policy import PolicyConfig, Priority

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
        # On automatic threads, give a thread up while another process holds a core
        # (fairlane.engines.cores); see the README's `llm.give_way`.
        vol.Optional("give_way", default=True): bool,
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
# order, fairness and queue limits are still this server's. Entries with the same classes and
# kinds are one lane of several remotes (two GPU boxes): a request goes to the one with the
# most room, and while one is down the others take its share.
ENGINES = ["openai", "vllm", "sglang", "llama-server", "fairlane"]
REMOTE_SCHEMA = vol.Schema(
    {
        vol.Required("name"): vol.All(str, vol.Length(min=1)),
        vol.Required("url"): _remote_url,
        # What the remote runs: `vllm` (started with --scheduling-policy priority) and `sglang`
        # (--enable-priority-scheduling) are sent each request's class as their own `priority`
        # field; another Fairlane reads the X-Fairlane-Class header every remote is sent;
        # `openai` (any other) and `llama-server` (FIFO) get no priority.
        vol.Optional("engine", default="openai"): vol.In(ENGINES),
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


def _lanes_do_not_overlap(remotes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Remotes with the same classes and kinds are one lane; a remote that shares some of a
    lane's work but not all of it would make the lane of a request ambiguous."""
    names: set[str] = set()
    lanes: dict[tuple[frozenset[str], frozenset[str]], str] = {}
    for remote in remotes:
        if remote["name"] in names:
            raise vol.Invalid(f"two remotes are named {remote['name']!r}")
        names.add(remote["name"])
        work = (frozenset(remote["classes"]), frozenset(remote["kinds"]))
        for (classes, kinds), first in lanes.items():
            if (classes, kinds) != work and classes & work[0] and kinds & work[1]:
                raise vol.Invalid(
                    f"{remote['name']!r} and {first!r} share some work but not all of it: "
                    "remotes of one lane have the same classes and kinds"
                )
        lanes.setdefault(work, remote["name"])
    return remotes


CONFIG_SCHEMA = vol.Schema(
    {
        vol.Optional("remotes", default=[]): vol.All([REMOTE_SCHEMA], _lanes_do_not_overlap),
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
