"""Start-up: everything `fairlane serve` builds from its configuration before it answers.

The engines where the configuration places them (a GPU asked for and missing is said, or
refused with `server.require_devices`), the policy with its cost profile, one device loop per
device, the durable document store, the remote lanes and the voice services, gathered in one
`Services` for the HTTP app (`fairlane.server`) and the Wyoming server.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from fairlane import config as config_mod
from fairlane.api.common import (
    Services,
)
from fairlane.api.speculation import Speculation
from fairlane.documents.store import DocumentStore
from fairlane.engines import models, native
from fairlane.engines.chat_template import ChatTemplate, ChatTemplateError
from fairlane.engines.embed import EmbedConfig as EmbedEngineConfig
from fairlane.engines.embed import EmbeddingEngine
from fairlane.engines.llm import (
    EngineConfig,
    LlamaEngine,
    default_threads,
)
from fairlane.engines.placement import Placement
from fairlane.engines.stt import SttConfig, WhisperEngine
from fairlane.engines.tts import PiperVoice
from fairlane.engines.tts import TtsConfig as TtsEngineConfig
from fairlane.policy import CostModel, Kind, PolicyConfig, make_policy
from fairlane.profiles import load as load_profile
from fairlane.runtime.device import DeviceLoop, Devices
from fairlane.runtime.identity import instance_id
from fairlane.runtime.pulls import PullJobs, llm_to_load
from fairlane.runtime.remote import RemoteLane, lanes_of
from fairlane.runtime.telemetry import Telemetry
from fairlane.voice.synthesis import VoiceService
from fairlane.voice.wyoming import SpeechService

_LOGGER = logging.getLogger(__name__)


class StartupError(ValueError):
    """Why the server cannot start, in one line for a person (`fairlane serve` prints it)."""


def claim_data_dir(path: Path) -> Any:
    """The data directory, made if needed and locked for this process: a second server on the
    same directory would index into the same SQLite file and find nothing it had not written.
    Returns the open lock file (the lock lasts as long as it is open)."""
    import fcntl

    try:
        path.mkdir(parents=True, exist_ok=True)
        lock = (path / ".lock").open("a")
    except OSError as err:
        raise StartupError(f"the data directory {path} cannot be used: {err.strerror}") from err
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        lock.close()
        raise StartupError(f"another Fairlane server uses the data directory {path}") from err
    return lock


def build_services(cfg: config_mod.Config) -> Services:
    """Load the model, start the device loop: everything `serve` needs, ready to use."""
    data_dir = Path(cfg.server.data_dir).expanduser()
    data_lock = claim_data_dir(data_dir)
    try:
        identity = instance_id(data_dir)
    except OSError as err:
        raise StartupError(f"the data directory {data_dir} cannot be written: {err}") from err
    # A catalogue name or a hub reference not pulled yet: the default serves while it comes.
    llm_model, background_pull = llm_to_load(cfg.llm.model)
    model_path = models.resolve_llm(llm_model)
    # A GPU build that cannot load a model takes the process down with a signal: load its
    # metadata in a child process first, and refuse the start with one line instead.
    on_gpu = cfg.llm.gpu_layers != 0 and native.gpu_offload()
    if on_gpu and (problem := native.probe_model_load(model_path, cfg.llm.gpu_layers)):
        raise StartupError(problem)
    engine = LlamaEngine(
        EngineConfig(
            model_path=model_path,
            n_ctx=cfg.llm.n_ctx,
            n_seq_max=cfg.llm.n_seq_max,
            n_batch=cfg.llm.n_batch,
            n_threads=cfg.llm.threads,
            give_way=cfg.llm.give_way,
            n_gpu_layers=cfg.llm.gpu_layers,
            prefix_cache_tokens=cfg.engine_cache_tokens,
            grammar_budget_s=cfg.llm.grammar_budget_ms / 1000,
        )
    )
    template: ChatTemplate | None = None
    template_error: str | None = None
    try:
        template = ChatTemplate(
            engine.metadata("tokenizer.chat_template"), engine.bos_text, engine.eos_text
        )
    except ChatTemplateError as err:
        template_error = str(err)
        _LOGGER.warning("%s: %s", model_path.name, err)
    engines: dict[Kind, Any] = {Kind.LLM: engine}
    stt: WhisperEngine | None = None
    if cfg.stt.enabled:
        stt = WhisperEngine(
            SttConfig(
                model_path=Path(models.resolve_stt(cfg.stt.model)),
                device=cfg.stt.device,
                compute_type=cfg.stt.compute_type,
                threads=cfg.stt.threads or default_threads(),
                beam_size=cfg.stt.beam_size,
                vad=cfg.stt.vad,
            )
        )
        engines[Kind.STT] = stt
    tts: PiperVoice | None = None
    if cfg.tts.enabled:
        tts = PiperVoice(
            TtsEngineConfig(
                model_path=models.resolve_voice(cfg.tts.voice),
                threads=cfg.tts.threads or default_threads(),
                device=cfg.tts.device,
            )
        )
        engines[Kind.TTS] = tts
    embedder: EmbeddingEngine | None = None
    if cfg.embed.enabled:
        embedder = EmbeddingEngine(
            EmbedEngineConfig(
                model_path=models.resolve_embedder(cfg.embed.model),
                backend=cfg.embed.backend,
                device=cfg.embed.device,
                threads=cfg.embed.threads or default_threads(),
            )
        )
        engines[Kind.EMBED] = embedder
    placements = [
        engine.placement for engine in (engine, stt, tts, embedder) if engine is not None
    ]
    check_placements(placements, cfg.server.require_devices)
    workers = {Kind.LLM: cfg.llm.worker, Kind.STT: cfg.stt.worker, Kind.TTS: cfg.tts.worker,
               Kind.EMBED: cfg.embed.worker}
    device, policy_config = start_loops(cfg, engines, workers)
    telemetry = Telemetry(policy_config)
    name = llm_model if llm_model in models.PACKAGED else model_path.stem
    remotes = [RemoteLane.of(group, policy_config) for group in lanes_of(cfg.remotes)]
    speech = SpeechService(device, stt, telemetry, cfg.stt.model) if stt is not None else None
    voice = VoiceService(device, tts, telemetry) if tts is not None else None
    pulls = PullJobs(data_dir)
    if background_pull is not None:
        pulls.adopt(background_pull)
        background_pull.start()
    pulls.resume()  # pulls asked for before a restart go on from their bytes
    return Services(
        cfg,
        device,
        engine,
        template,
        template_error,
        telemetry,
        name,
        cfg.policy_name,
        speech,
        voice=voice,
        embedder=embedder,
        embed_name=cfg.embed.model,
        instance_id=identity,
        data_lock=data_lock,
        placements=placements,
        remotes=remotes,
        speculation=Speculation(device.cancel),
        pulls=pulls,
        documents=DocumentStore(data_dir / "fairlane.sqlite")
        if embedder is not None
        else None,
    )


def start_loops(
    cfg: config_mod.Config, engines: dict[Kind, Any], workers: dict[Kind, str | None]
) -> tuple[Devices, PolicyConfig]:
    """One device loop per worker, started: engines are grouped by the `worker` their
    section names, or else by the device they really got (`cpu`, `cuda`).

    Every loop plans for the household's targets, which are set by where the LLM runs (a GPU
    box keeps GPU targets for its CPU speech loop too, so a CPU embedding step stays short
    enough for the next utterance); each loop's costs come from its own device's profile
    ("auto": the CPU profile for a loop with no engine on a GPU). Returns the loops and that
    policy configuration."""
    llm_on_gpu = engines[Kind.LLM].placement.got == "cuda"
    policy_config = cfg.serving_policy(load_profile(_profile(cfg, llm_on_gpu))[1])
    groups: dict[str, dict[Kind, Any]] = {}
    for kind, engine in engines.items():
        groups.setdefault(workers.get(kind) or engine.placement.got, {})[kind] = engine
    loops = []
    for name, group in groups.items():
        on_gpu = any(engine.placement.got == "cuda" for engine in group.values())
        profile, _ = load_profile(_profile(cfg, on_gpu))
        policy = make_policy(cfg.policy_name, policy_config, CostModel(profile))
        loops.append(DeviceLoop(policy, group, name=name))
    devices = Devices(loops)
    devices.start()
    if len(loops) > 1:
        _LOGGER.info(
            "device loops: %s",
            "; ".join(f"{loop.name}: {', '.join(k.value for k in loop.engines)}" for loop in loops),
        )
    return devices, policy_config


def _profile(cfg: config_mod.Config, on_gpu: bool) -> str:
    """The cost profile of a device: "auto" chooses by the device the engines really got,
    not the one they asked for."""
    return "cpu-2core" if cfg.server.profile == "auto" and not on_gpu else cfg.profile


class DeviceMissing(ValueError):
    """An engine did not get the device it was asked for, and `server.require_devices` is on
    (a ValueError: `fairlane serve` prints its message as one line and exits)."""


def check_placements(placements: list[Placement], required: bool) -> None:
    """Say, one line per engine, each GPU asked for and not obtained; refuse to go on when
    the configuration requires the devices."""
    missing = [p for p in placements if not p.ok]
    for placement in missing:
        _LOGGER.error("Device not obtained: %s", placement.complaint())
    if missing and required:
        raise DeviceMissing(
            "; ".join(p.complaint() for p in missing) + " (server.require_devices is on)"
        )


LOOPBACK = ("127.0.0.1", "localhost", "::1")


def exposure_warnings(cfg: config_mod.Config) -> list[str]:
    """What a listener beyond this machine lets anyone on the network do (said at start)."""
    warnings = []
    if not cfg.server.authenticated and cfg.server.host not in LOOPBACK:
        warnings.append(
            f"serving HTTP on {cfg.server.host} without a token: anyone on the network can use "
            "every class, voice included (set server.token, or server.clients with ceilings)"
        )
    wyoming_host = cfg.wyoming.host or cfg.server.host
    if cfg.wyoming.enabled and wyoming_host not in LOOPBACK:
        warnings.append(
            f"Wyoming listens on {wyoming_host} without authentication (the protocol has none): "
            f"anyone on the network may open {cfg.wyoming.max_connections} connections at "
            f"class {cfg.wyoming.max_class} (wyoming.max_connections, wyoming.max_class)"
        )
    return warnings
