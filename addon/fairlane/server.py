"""The HTTP server (aiohttp): OpenAI-compatible chat, models, stats, metrics and health.

Handlers validate, render and tokenize, then hand the request to the device loop and await its
tokens; they never block on the device. Every client-visible error has OpenAI's error shape and
a 4xx status with a message a person can act on.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hmac
import logging
import os
import sqlite3
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler

from fairlane import __version__
from fairlane import config as config_mod
from fairlane.api.chat import cancel_completion, chat_completions
from fairlane.api.common import (
    CLIENT_GRANT,
    SERVICES,
    WYOMING,
    ApiError,
    Services,
    services_of,
)
from fairlane.api.documents import (
    add_document,
    add_summary,
    delete_document,
    get_document,
    get_summary,
    job,
    jobs,
    list_documents,
    search_documents,
    start_workers,
    stop_workers,
)
from fairlane.api.embeddings import embeddings
from fairlane.api.openapi import OPENAPI
from fairlane.api.remote import api_error
from fairlane.api.speech import transcriptions
from fairlane.api.voice import speech, voices
from fairlane.documents.store import DocumentStore, progress
from fairlane.engines import models
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
from fairlane.policy import CostModel, Kind, PolicyConfig, Priority, make_policy
from fairlane.profiles import load as load_profile
from fairlane.runtime.components import storage_full
from fairlane.runtime.device import DeviceLoop, Devices, StepRecord
from fairlane.runtime.identity import instance_id
from fairlane.runtime.remote import RemoteError, RemoteLane
from fairlane.runtime.telemetry import Telemetry
from fairlane.voice import wyoming
from fairlane.voice.synthesis import VoiceService
from fairlane.voice.wyoming import SpeechService

_LOGGER = logging.getLogger(__name__)


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as err:
        return err.response()
    except RemoteError as err:  # a remote lane's failure (embeddings; chat maps its own)
        return api_error(err).response()
    except (OSError, sqlite3.OperationalError) as err:
        if not storage_full(err):
            raise
        _LOGGER.error("%s %s: the disk is full", request.method, request.path)
        return ApiError(
            507,
            "the server's disk is full: nothing was stored; free space and try again",
            kind="server_error",
            code="insufficient_storage",
        ).response()
    except web.HTTPRequestEntityTooLarge as err:
        return ApiError(
            413, f"the body is larger than the limit ({err.text})", code="body_too_large"
        ).response()
    except web.HTTPException as err:
        if err.status >= 400:
            response = ApiError(err.status, err.reason, kind="invalid_request_error").response()
            if isinstance(err, web.HTTPMethodNotAllowed):  # say which methods the route takes
                response.headers["Allow"] = ", ".join(sorted(err.allowed_methods))
            return response
        raise


# Open to everyone: liveness, and the dashboard page (it holds no data; it reads /v1/stats).
PUBLIC_PATHS = frozenset({"/health", "/", "/dashboard"})


def auth_middleware(server: config_mod.ServerConfig) -> Any:
    """Bearer tokens: `server.token` may claim every class; each of `server.clients` has its
    own token and class ceiling, which the handlers read from the request (CLIENT_GRANT)."""
    grants: list[tuple[bytes, Priority | None]] = []
    if server.token is not None:
        grants.append((server.token.encode(), None))
    grants += [(c.token.encode(), Priority.parse(c.max_class)) for c in server.clients]

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        public = request.method in ("GET", "HEAD") and request.path in PUBLIC_PATHS
        if not grants or public:
            return await handler(request)
        reading_stats = request.method == "GET" and request.path == "/v1/stats"
        if reading_stats and request.remote in server.stats_readers:
            return await handler(request)
        supplied = request.headers.get("Authorization", "")
        scheme, _, value = supplied.partition(" ")
        # Bytes: compare_digest refuses str with non-ASCII characters (a 500 before).
        given = value.strip().encode("utf-8", "surrogateescape")
        # Every token is compared, so the time taken does not say which one nearly matched.
        matches = [ceiling for token, ceiling in grants if hmac.compare_digest(given, token)]
        if scheme.lower() != "bearer" or not matches:
            return ApiError(
                401,
                "missing or wrong bearer token",
                kind="authentication_error",
                code="invalid_api_key",
            ).response()
        if (ceiling := matches[0]) is not None:
            request[CLIENT_GRANT] = ceiling
        return await handler(request)

    return check


def create_app(services: Services) -> web.Application:
    max_bytes = int(services.config.server.max_body_mb * 1024 * 1024)
    app = web.Application(
        client_max_size=max_bytes,
        middlewares=[
            error_middleware,
            auth_middleware(services.config.server),
        ],
    )
    app[SERVICES] = services
    app.router.add_get("/health", health)
    app.router.add_get("/", dashboard)
    app.router.add_get("/dashboard", dashboard)
    app.router.add_get("/v1/models", list_models)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/chat/completions/{id}/cancel", cancel_completion)
    app.router.add_post("/v1/audio/transcriptions", transcriptions)
    app.router.add_post("/v1/audio/speech", speech)
    app.router.add_get("/v1/audio/voices", voices)
    app.router.add_post("/v1/embeddings", embeddings)
    app.router.add_post("/v1/documents", add_document)
    app.router.add_get("/v1/documents", list_documents)
    app.router.add_post("/v1/documents/search", search_documents)
    app.router.add_get("/v1/documents/{id}", get_document)
    app.router.add_delete("/v1/documents/{id}", delete_document)
    app.router.add_get("/v1/jobs", jobs)
    app.router.add_post("/v1/summaries", add_summary)
    app.router.add_get("/v1/summaries/{id}", get_summary)
    app.router.add_get("/v1/jobs/{id}", job)
    app.router.add_get("/v1/stats", stats)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/openapi.json", openapi)
    app.on_startup.append(_start_wyoming)
    app.on_startup.append(start_workers)
    app.on_cleanup.append(_stop_wyoming)
    app.on_cleanup.append(stop_workers)
    app.on_cleanup.append(_close_remotes)
    return app


async def _close_remotes(app: web.Application) -> None:
    for lane in app[SERVICES].remotes:
        await lane.close()


async def health(request: web.Request) -> web.Response:
    """Liveness and what is wrong: answered from memory (no lock, no database, no device), so
    it stays fast while the device and the event loop are busy."""
    svc = services_of(request)
    devices = {p.engine: p.as_dict() for p in svc.placements}
    components = {name: c.as_dict() for name, c in svc.components.items()}
    remotes = {lane.name: lane.health() for lane in svc.remotes}
    healthy = (
        all(p.ok for p in svc.placements)
        and all(c.state != "retrying" for c in svc.components.values())
        and all(r["state"] == "closed" for r in remotes.values())
    )
    return web.json_response(
        {
            # "degraded": an engine runs on another device than the one asked for, a part
            # (the indexer, the summariser) failed and is being retried, or a remote lane's
            # breaker is not closed (`remotes`); the server still answers, so this is a 200
            # (a watchdog's restart would not help).
            "status": "ok" if healthy else "degraded",
            "devices": devices,
            "components": components,
            "remotes": remotes,
            "version": __version__,
            "instance_id": svc.instance_id,
            "policy": svc.policy_name,
            "models": {
                "llm": svc.model_name,
                "stt": svc.speech.model_name if svc.speech else None,
                "tts": svc.voice.voices[0] if svc.voice else None,
            },
            "wyoming_port": svc.wyoming_port,
        }
    )


DASHBOARD = Path(__file__).with_name("web") / "dashboard.html"


async def dashboard(request: web.Request) -> web.FileResponse:
    """The live lane dashboard (also the add-on's ingress panel); it polls /v1/stats."""
    return web.FileResponse(DASHBOARD, headers={"Cache-Control": "no-cache"})


async def list_models(request: web.Request) -> web.Response:
    svc = services_of(request)
    names = [svc.model_name] + ([svc.speech.model_name] if svc.speech else [])
    names += [svc.embed_name] if svc.embedder else []
    names += svc.voice.voices if svc.voice else []
    data = [{"id": name, "object": "model", "created": 0, "owned_by": "fairlane"} for name in names]
    return web.json_response({"object": "list", "data": data})


async def stats(request: web.Request) -> web.Response:
    svc = services_of(request)
    body = svc.telemetry.stats(svc.device.snapshot())
    body["policy"] = svc.policy_name
    # `device`: the LLM's loop (as before there were several); `devices`: each loop's.
    devices = {
        name: {"kinds": [k.value for k in loop.engines], **_device_use(loop, body["window_s"])}
        for name, loop in svc.device.loops.items()
    }
    body["device"] = devices[svc.device.loop_for(Kind.LLM).name]
    body["devices"] = devices
    body["steps"] = _step_summary(svc.device.records)
    if svc.remotes:
        body["remotes"] = {lane.name: lane.stats() for lane in svc.remotes}
    if svc.documents is not None:
        documents = await asyncio.to_thread(svc.documents.documents)
        body["background"] = {"indexing": progress(documents, svc.started_at)}
    return web.json_response(body)


async def metrics(request: web.Request) -> web.Response:
    svc = services_of(request)
    return web.Response(
        body=svc.telemetry.prometheus(svc.device.snapshot()),
        content_type="text/plain",
        charset="utf-8",
    )


async def openapi(request: web.Request) -> web.Response:
    return web.json_response(OPENAPI)


def _device_use(device: DeviceLoop, window_s: float) -> dict[str, Any]:
    """How busy the device was over the window, and each class's share of that busy time.

    A step that carried several classes counts for each of them, so shares may sum past 1.
    """
    since = device.clock() - window_s
    busy = 0.0
    by_class = dict.fromkeys((p.label for p in Priority), 0.0)
    for record in list(device.records):
        seconds = record.end - max(record.start, since)
        if seconds <= 0:
            continue
        busy += seconds
        for label in {p.label for p in record.classes}:
            by_class[label] += seconds
    return {
        "busy": round(min(busy / max(window_s, 1e-6), 1.0), 4),
        "share": {label: round(s / busy, 4) if busy else 0.0 for label, s in by_class.items()},
    }


def _step_summary(records: list[StepRecord], last: int = 50) -> list[dict[str, Any]]:
    return [
        {
            "device": r.device,
            "start": round(r.start, 4),
            "end": round(r.end, 4),
            "kind": r.kind.value,
            "classes": sorted({p.label for p in r.classes}),
            "sequences": len(r.request_ids),
            "prefill_tokens": r.prefill_tokens,
            "decode_seqs": r.decode_seqs,
        }
        for r in records[-last:]
    ]


# --- start-up ----------------------------------------------------------------------------------


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
    model_path = models.resolve_llm(cfg.llm.model)
    engine = LlamaEngine(
        EngineConfig(
            model_path=model_path,
            n_ctx=cfg.llm.n_ctx,
            n_seq_max=cfg.llm.n_seq_max,
            n_batch=cfg.llm.n_batch,
            n_threads=cfg.llm.threads,
            n_gpu_layers=cfg.llm.gpu_layers,
            prefix_cache_tokens=cfg.engine_cache_tokens,
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
    name = cfg.llm.model if cfg.llm.model in models.PACKAGED else model_path.stem
    remotes = [RemoteLane(remote, policy_config) for remote in cfg.remotes]
    speech = SpeechService(device, stt, telemetry, cfg.stt.model) if stt is not None else None
    voice = VoiceService(device, tts, telemetry) if tts is not None else None
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


async def _start_wyoming(app: web.Application) -> None:
    svc = app[SERVICES]
    if (svc.speech is None and svc.voice is None) or not svc.config.wyoming.enabled:
        return
    host = svc.config.wyoming.host or svc.config.server.host
    services = wyoming.WyomingServices(
        svc.speech,
        svc.voice,
        early=svc.config.wyoming.early_transcript,
        max_connections=svc.config.wyoming.max_connections,
        priority=Priority.parse(svc.config.wyoming.max_class),
        idle_timeout_s=svc.config.wyoming.idle_timeout_s,
        clients=wyoming.networks(svc.config.wyoming.clients),
    )
    svc.wyoming = services
    server = await wyoming.start(services, host, svc.config.wyoming.port)
    svc.wyoming_port = wyoming.bound_port(server)
    app[WYOMING] = server
    if services.clients:
        _LOGGER.info("Wyoming on tcp://%s:%d for %s", host, svc.wyoming_port,
                     ", ".join(svc.config.wyoming.clients))
    elif wyoming.beyond_loopback(host):
        _LOGGER.warning(
            "Wyoming on tcp://%s:%d has no credentials and takes any client: list the ones "
            "that may connect in wyoming.clients", host, svc.wyoming_port)
    else:
        _LOGGER.info("Wyoming on tcp://%s:%d (loopback only)", host, svc.wyoming_port)


async def _stop_wyoming(app: web.Application) -> None:
    if WYOMING in app:
        await app[WYOMING].stop()


def serve(args: argparse.Namespace) -> int:
    """`fairlane serve`: flags override the config file; the token may come from FAIRLANE_TOKEN."""
    log_format = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    logging.basicConfig(level=logging.INFO, format=log_format)
    cfg = config_mod.load(args.config, args.set or ())
    server = cfg.server
    server = replace(
        server,
        host=args.host or server.host,
        port=args.port if args.port is not None else server.port,
        token=args.token or os.environ.get("FAIRLANE_TOKEN") or server.token,
    )
    if server.token is None and server.token_file:
        server = replace(server, token=config_mod.token_from_file(server.token_file))
    cfg = replace(cfg, server=server, policy_name=args.policy or cfg.policy_name)
    services = build_services(cfg)
    for warning in exposure_warnings(cfg):
        _LOGGER.warning("%s", warning)
    app = create_app(services)
    app.on_cleanup.append(lambda _app: _shutdown(services))
    print(
        f"fairlane {__version__}: {services.model_name} with the {cfg.policy_name} policy on "
        f"http://{cfg.server.host}:{cfg.server.port}",
        flush=True,
    )
    try:
        web.run_app(
            app,
            host=cfg.server.host,
            port=cfg.server.port,
            backlog=cfg.server.backlog,
            print=None,
            handle_signals=True,
            # A client that goes away cancels its handler: a non-streaming completion stops
            # generating, as a stream does (documents are stored before they are acknowledged).
            handler_cancellation=True,
        )
    except OSError as err:  # a port taken, an address not here: one line, not a traceback
        raise StartupError(f"cannot listen: {err.strerror or err}") from err
    return 0


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


async def _shutdown(services: Services) -> None:
    await asyncio.to_thread(services.device.stop)
    with contextlib.suppress(Exception):
        services.engine.close()


class BackgroundServer:
    """The real server on 127.0.0.1 in a thread of this process (tests and benchmarks).

    Same app, same device loop, same engine as `fairlane serve`; only the event loop runs in a
    thread so the caller can use blocking clients and read the device's step records.
    """

    def __init__(self, cfg: config_mod.Config) -> None:
        self.services = build_services(cfg)
        self.loop = asyncio.new_event_loop()
        self.runner = web.AppRunner(create_app(self.services), handler_cancellation=True)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", cfg.server.port, backlog=cfg.server.backlog)
        self.loop.run_until_complete(site.start())
        sockets: Any = getattr(site._server, "sockets", None)  # the port the OS picked
        self.port = int(sockets[0].getsockname()[1]) if sockets else cfg.server.port
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="fairlane-http", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.run_until_complete(self.runner.cleanup())
        self.loop.close()
        self.services.device.stop()
        self.services.engine.close()
        if self.services.data_lock is not None:
            self.services.data_lock.close()  # the data directory is free again

    def __enter__(self) -> BackgroundServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
