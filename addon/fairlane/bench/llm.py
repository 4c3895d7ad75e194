"""LLM benchmarks on the real engine, side by side in one run.

- `fairlane bench engine`: this machine's step costs (feeds the CPU cost profile).
- `fairlane bench throughput`: aggregate decode tokens/s and per-stream ITL at 1, 4 and 8
  concurrent streams, Fairlane against llama.cpp's own `llama-server --parallel N`
  (same GGUF, same threads).
- `fairlane bench interference`: chat TTFT p95 while long background prompts saturate the
  device, divided by idle chat TTFT p95, for the fairlane and fcfs policies.
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fairlane.bench.servers import (
    ServerProcess,
    StreamTiming,
    fairlane_server,
    free_port,
    stream_chat,
)
from fairlane.engines import models
from fairlane.runtime.metrics import percentile

COUNT = [{"role": "user", "content": "Count from 1 to 300, separated by commas."}]
SHORT_CHAT = [{"role": "user", "content": "Suggest a name for a kitten. One word."}]
MANUAL = (
    "The dishwasher has three programmes. Eco washes at 45 degrees and takes three hours; "
    "Quick washes at 55 degrees in forty minutes; Intensive reaches 70 degrees for pans. "
    "Clean the filter every month and refill the rinse aid when the light is on. "
)
BACKGROUND = [{"role": "user", "content": "Summarise this manual:\n" + MANUAL * 20}]
QUIET_S = 30.0  # interference: background alone, before the chats


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f}"


# --- engine step costs --------------------------------------------------------------------------


def engine_costs(
    threads: int,
    gpu_layers: int = 0,
    model: Path | None = None,
    prefill_sizes: tuple[int, ...] = (64, 256, 512),
    decode_sizes: tuple[int, ...] = (1, 2, 4, 8),
    context_sizes: tuple[int, ...] = (),
    occupancy: tuple[tuple[int, int], ...] = (),
    after_embed: int = 0,
    prefill_after: tuple[tuple[int, int], ...] = (),
) -> dict[str, Any]:
    """Prefill cost per token at each chunk size, one decode iteration at each number of
    sequences, (with `context_sizes`) one sequence's decode iteration after a prompt of each
    length, (with `occupancy`, pairs (n, m)) one sequence's decode beside n others holding
    m KV cells each, (with `prefill_after`, pairs (n, p)) a prompt chunk of n tokens that
    starts at position p (a long prompt's later chunk, as a summary's), and (with
    `after_embed`, texts in a batch) one sequence's decode right after an embedding batch
    beside one right after a decode: the terms of the cost model, on
    this machine. Every step is also written with its shape (`points`), which `fairlane
    profile fit` fits the profile from. `model`: another GGUF than the default (the GPU
    evidence uses random-weight models of real shapes); `gpu_layers`: layers offloaded (999:
    all)."""
    from fairlane.engines.llm import EngineConfig, LlamaEngine, SamplingParams
    from fairlane.policy import Chunk, LlmPlan, Priority

    longest = max((
        *prefill_sizes, *context_sizes, *(m for _, m in occupancy),
        *(n + p for n, p in prefill_after), 64,
    ))
    n_seq = max((*decode_sizes, *(n + 1 for n, _ in occupancy)))
    held_most = max((n * m for n, m in occupancy), default=0)
    n_ctx = max(4096, n_seq * 96, longest + 64, held_most + 256)
    engine = LlamaEngine(
        EngineConfig(
            model or models.resolve_llm(models.DEFAULT_LLM),
            n_ctx=n_ctx,
            n_seq_max=max(8, n_seq),
            n_batch=max(512, max(prefill_sizes)),
            n_threads=threads,
            n_gpu_layers=gpu_layers,
        )
    )
    tokens = engine.tokenize(MANUAL * 40)
    while len(tokens) < longest:
        tokens += tokens
    params = SamplingParams(max_tokens=1000, temperature=0)
    out: dict[str, Any] = {
        "threads": engine.threads,
        "model": str(model or models.DEFAULT_LLM),
        "device": engine.placement.as_dict(),
        "n_ctx": n_ctx,
        "prefill_ms_per_token": {},
        "decode_ms_per_iteration": {},
        "context_decode_ms": {},
        "occupancy_decode_ms": {},
        "prefill_after_ms_per_token": {},
        "points": [],
    }
    print(f"engine step costs, {engine.threads} threads (median of repeats)")
    # One untimed prefill first: the first step of a run pays one-time set-up (on CUDA, the
    # kernels' first launch), which made the smallest chunk look dearer than the next.
    engine.add("warm-up", tokens[:64], params)
    engine.execute(LlmPlan((Chunk("warm-up", 0, 64, True, False, Priority.CHAT),), (), 0.0, 64))
    engine.release("warm-up")
    position = 64 + 6 + 1  # a decode's KV position at the median of its 12 iterations
    for size in prefill_sizes:
        times = []
        for _ in range(3):
            engine.add("p", tokens[:size], params)
            plan = LlmPlan((Chunk("p", 0, size, True, False, Priority.CHAT),), (), 0.0, size)
            result, _ = engine.execute(plan)
            engine.release("p")
            times.append(result.elapsed_s)
        per_token = sorted(times)[1] / size
        out["prefill_ms_per_token"][size] = round(per_token * 1000, 4)
        out["points"].append(_point("prefill", size, 0, size, size, per_token * size))
        print(f"  prefill {size:>4} tokens: {per_token * 1000:.2f} ms/token")
    for size, position in prefill_after:
        times = []
        for _ in range(3):
            engine.add("p", tokens[: position + size], params)
            for start in range(0, position, 512):  # the text before it, untimed
                piece = min(512, position - start)
                first = Chunk("p", start, piece, False, False, Priority.CHAT)
                engine.execute(LlmPlan((first,), (), 0.0, start + piece))
            plan = LlmPlan(
                (Chunk("p", position, size, True, False, Priority.CHAT),),
                (), 0.0, position + size, held_tokens=position + size,
            )
            result, _ = engine.execute(plan)
            engine.release("p")
            times.append(result.elapsed_s)
        seconds = sorted(times)[1]
        out["prefill_after_ms_per_token"][f"{size}@{position}"] = round(seconds / size * 1000, 4)
        at = position + size
        out["points"].append(_point("prefill", size, 0, at, at, seconds))
        print(f"  prefill {size:>4} tokens at position {position:>5}: "
              f"{seconds / size * 1000:.2f} ms/token")
    for seqs in decode_sizes:
        median = _decode_median(engine, tokens, params, seqs, 64)
        out["decode_ms_per_iteration"][seqs] = round(median * 1000, 2)
        out["points"].append(_point("decode", 0, seqs, seqs * position, seqs * position, median))
        print(
            f"  decode, {seqs} sequences: {median * 1000:.1f} ms/iteration "
            f"({seqs / median:.0f} tok/s)"
        )
    for context in context_sizes:
        median = _decode_median(engine, tokens, params, 1, context)
        out["context_decode_ms"][context] = round(median * 1000, 2)
        at = context + 7
        out["points"].append(_point("context", 0, 1, at, at, median))
        print(f"  decode after {context:>5} tokens of context: {median * 1000:.1f} ms")
    for others, cells in occupancy:
        # Sequences that hold KV and do nothing else, as summaries waiting between their slices.
        for i in range(others):
            engine.add(f"held{i}", tokens[:cells], params)
            engine.execute(
                LlmPlan((Chunk(f"held{i}", 0, cells, False, False, Priority.BACKGROUND),), (),
                        0.0, cells)
            )
        median = _decode_median(engine, tokens, params, 1, 64)
        for i in range(others):
            engine.release(f"held{i}")
        out["occupancy_decode_ms"][f"{others}x{cells}"] = round(median * 1000, 2)
        out["points"].append(
            _point("occupancy", 0, 1, position, position + others * cells, median)
        )
        print(f"  decode beside {others} sequences of {cells} cells: {median * 1000:.1f} ms")
    if after_embed:
        out["after_embed"] = _after_embed(engine, tokens, params, threads, after_embed, out)
    engine.close()
    return out


AFTER_ROUNDS = 12
EMBED_TEXT_TOKENS = 128  # a household document chunk


def _after_embed(
    engine: Any, tokens: list[int], params: Any, threads: int, texts: int, out: dict[str, Any]
) -> dict[str, float]:
    """One sequence decoding while the same device runs embedding batches between its
    iterations, as on the server's one CPU loop: each round is a decode, a decode (timed:
    after a decode), an embedding batch of `texts` chunks (timed) and a decode (timed: after
    the batch). Medians over the rounds, and a point each for the profile fit."""
    from fairlane.engines.embed import EmbedConfig, EmbeddingEngine
    from fairlane.policy import Chunk, EmbedPlan, LlmPlan, Priority

    embedder = EmbeddingEngine(
        EmbedConfig(models.resolve_embedder(models.DEFAULT_EMBED), threads=threads)
    )
    chunk = embedder.tokenize([MANUAL * 4])[0][:EMBED_TEXT_TOKENS]
    prompt = 64
    engine.add("s", tokens[:prompt], params)
    engine.execute(LlmPlan((Chunk("s", 0, prompt, True, False, Priority.CHAT),), (), 0.0, 0))
    position = prompt
    timed: dict[str, list[float]] = {"after_decode": [], "embed": [], "after_embed": []}

    def decode() -> float:
        nonlocal position
        plan = LlmPlan((Chunk("s", position, 1, True, True, Priority.CHAT),), (), 0.0, 0)
        position += 1
        return float(engine.execute(plan)[0].elapsed_s)

    for round_ in range(AFTER_ROUNDS):
        decode()
        timed["after_decode"].append(decode())
        names = tuple(f"e{round_}-{i}" for i in range(texts))
        for name in names:
            embedder.add(name, chunk)
        batch = EmbedPlan(names, Priority.BACKGROUND, texts * len(chunk), 0.0)
        timed["embed"].append(embedder.execute(batch)[0].elapsed_s)
        timed["after_embed"].append(decode())
    engine.release("s")
    medians = {what: sorted(times)[len(times) // 2] for what, times in timed.items()}
    at = prompt + 2 * AFTER_ROUNDS  # the KV position at the middle of the rounds
    # Both are plain decodes to the cost model (no term for the engine before): with ONNX
    # Runtime's threads not spinning, the two cost the same on this CPU
    # (docs/history/benchmarks.md).
    for what in ("after_decode", "after_embed"):
        out["points"].append(_point("after", 0, 1, at, at, medians[what]))
    print(
        f"  decode after a decode: {medians['after_decode'] * 1000:.1f} ms; embedding batch of "
        f"{texts}×{len(chunk)} tokens: {medians['embed'] * 1000:.0f} ms; decode after it: "
        f"{medians['after_embed'] * 1000:.1f} ms "
        f"(+{(medians['after_embed'] - medians['after_decode']) * 1000:.1f} ms)"
    )
    return {f"{what}_ms": round(m * 1000, 2) for what, m in medians.items()}


def _point(what: str, prefill: int, decodes: int, context: int, held: int, seconds: float
           ) -> dict[str, Any]:
    """One measured step with its shape (`fairlane.profiles.fit.Point`)."""
    return {"what": what, "prefill": prefill, "decodes": decodes, "context": context,
            "held": held, "ms": round(seconds * 1000, 3)}


def _decode_median(engine: Any, tokens: list[int], params: Any, seqs: int, prompt: int) -> float:
    """The median of 12 decode iterations of `seqs` sequences, each after `prompt` tokens."""
    from fairlane.policy import Chunk, LlmPlan, Priority

    for i in range(seqs):
        engine.add(f"s{i}", tokens[:prompt], params)
    engine.execute(
        LlmPlan(
            tuple(Chunk(f"s{i}", 0, prompt, True, False, Priority.CHAT) for i in range(seqs)),
            (),
            0.0,
            0,
        )
    )
    times = []
    for step in range(12):
        plan = LlmPlan(
            tuple(Chunk(f"s{i}", prompt + step, 1, True, True, Priority.CHAT) for i in range(seqs)),
            (),
            0.0,
            0,
        )
        times.append(engine.execute(plan)[0].elapsed_s)
    for i in range(seqs):
        engine.release(f"s{i}")
    return float(sorted(times)[len(times) // 2])


# --- throughput against llama-server -------------------------------------------------------------


def llama_server_binary() -> Path:
    """llama.cpp's server from scripts/build-llama-server.sh (or $FAIRLANE_LLAMA_SERVER)."""
    path = Path(os.environ.get("FAIRLANE_LLAMA_SERVER", ".bench/llama-server/bin/llama-server"))
    if not path.is_file():
        raise ValueError(f"no llama-server at {path}: run scripts/build-llama-server.sh first")
    return path


def llama_server(parallel: int, threads: int, unified: bool = True) -> ServerProcess:
    """llama.cpp's server with N slots (continuous batching), CPU only, same GGUF and threads.

    `unified`: the slots share one KV cache of the whole context (`--kv-unified`), as
    Fairlane's engine does; without it each slot gets 1/N of the context."""
    port = free_port()
    argv = [
        str(llama_server_binary()),
        "-m",
        str(models.resolve_llm(models.DEFAULT_LLM)),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "-t",
        str(threads),
        "-c",
        "8192",
        "-np",
        str(parallel),
        "-ngl",
        "0",
        "--jinja",
        "--no-webui",
        *(["--kv-unified"] if unified else []),
    ]
    return ServerProcess(argv, port)


def _throughput_row(name: str, streams: int, timings: list[StreamTiming]) -> dict[str, Any]:
    tokens = sum(len(t.token_times) for t in timings)
    start = min(t.sent for t in timings)
    end = max(t.token_times[-1] for t in timings if t.token_times)
    gaps = [g for t in timings for g in t.gaps]
    first = [t.ttft for t in timings if t.ttft is not None]
    return {
        "server": name,
        "streams": streams,
        "tokens": tokens,
        "aggregate_tok_s": round(tokens / (end - start), 1),
        "itl_p50_ms": round((percentile(gaps, 50) or 0) * 1000, 1),
        "itl_p95_ms": round((percentile(gaps, 95) or 0) * 1000, 1),
        "ttft_p50_ms": round((percentile(first, 50) or 0) * 1000, 1),
        "errors": sum(1 for t in timings if t.error),
    }


def throughput(
    streams: list[int], threads: int, max_tokens: int, rounds: int = 2
) -> list[dict[str, Any]]:
    """Decode throughput at N concurrent streams, Fairlane against llama-server --parallel N.

    Like for like: every prompt is unique (a nonce first), so neither server's prompt cache
    helps; both get the same warm-up (N concurrent unique requests); the servers alternate
    (A B A B) for `rounds` rounds and every round is printed with the spread of the ratio.
    """
    rows: list[dict[str, Any]] = []
    servers: list[tuple[str, Callable[[int], ServerProcess]]] = [
        ("fairlane", lambda n: fairlane_server("fairlane", threads, max(streams))),
        ("llama-server", lambda n: llama_server(n, threads)),
    ]
    for round_index in range(1, rounds + 1):
        for count in streams:
            for name, start in servers:
                with start(count) as server:
                    _concurrent_unique(server.url, count, SHORT_CHAT, 4)  # warm-up
                    timings = _concurrent_unique(server.url, count, COUNT, max_tokens)
                    rows.append({"round": round_index, **_throughput_row(name, count, timings)})
                print(
                    f"  round {round_index} {name} × {count}: {rows[-1]['aggregate_tok_s']} tok/s",
                    flush=True,
                )
    print(
        f"\ndecode throughput, {threads} threads, {max_tokens} tokens a stream, same GGUF, "
        f"unique prompts, {rounds} rounds alternating"
    )
    print(
        f"{'streams':>8}{'round':>6}{'server':>14}{'agg tok/s':>11}{'ITL p50':>9}{'ITL p95':>9}"
        f"{'TTFT p50':>10}{'ratio':>8}"
    )
    for count in streams:
        ratios = []
        for round_index in range(1, rounds + 1):
            mine = [r for r in rows if r["streams"] == count and r["round"] == round_index]
            base = next(r for r in mine if r["server"] == "llama-server")
            for row in mine:
                ratio = row["aggregate_tok_s"] / base["aggregate_tok_s"]
                row["ratio"] = round(ratio, 2)
                if row["server"] == "fairlane":
                    ratios.append(ratio)
                print(
                    f"{count:>8}{round_index:>6}{row['server']:>14}{row['aggregate_tok_s']:>11}"
                    f"{row['itl_p50_ms']:>9}{row['itl_p95_ms']:>9}{row['ttft_p50_ms']:>10}"
                    f"{ratio:>8.2f}"
                )
        print(f"{count:>8} streams: fairlane / llama-server {min(ratios):.2f}–{max(ratios):.2f}")
    return rows


def _concurrent_unique(
    url: str, streams: int, messages: list[dict[str, Any]], max_tokens: int
) -> list[StreamTiming]:
    """`streams` concurrent requests, each with its own nonce (no shared cached prefix)."""
    results: list[StreamTiming | None] = [None] * streams

    def run(index: int) -> None:
        results[index] = stream_chat(url, _unique(messages), max_tokens)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(streams)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [r for r in results if r is not None]


# --- interference ------------------------------------------------------------------------------


def _unique(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The same turn with a nonce first: no two requests share a cached prefix, so each one
    really prefills its whole prompt (the load is what it says)."""
    nonce = f"[{uuid.uuid4().hex[:12]}] "
    return [{**m, "content": nonce + m["content"]} if i == 0 else m for i, m in enumerate(messages)]


def _background_load(url: str, stop: threading.Event, done: list[StreamTiming]) -> None:
    """Keep one background stream of long, unique prompts going until `stop`."""
    extra = {"fairlane_class": "background", "user": "documents"}
    while not stop.is_set():
        done.append(stream_chat(url, _unique(BACKGROUND), 8, extra))


def _interference_round(
    policy: str, threads: int, chats: int, background_streams: int, extra: dict[str, Any] | None
) -> dict[str, Any]:
    seqs = int((extra or {}).get("llm", {}).get("n_seq_max", 8))
    with fairlane_server(policy, threads, seqs, extra) as server:
        chat = {"fairlane_class": "chat", "user": "parent"}
        stream_chat(server.url, _unique(SHORT_CHAT), 4, chat)  # warm-up
        idle = [stream_chat(server.url, _unique(SHORT_CHAT), 8, chat) for _ in range(chats)]
        stop = threading.Event()
        background_done: list[StreamTiming] = []
        loaders = [
            threading.Thread(target=_background_load, args=(server.url, stop, background_done))
            for _ in range(background_streams)
        ]
        for loader in loaders:
            loader.start()
        time.sleep(3.0)  # let the background saturate the device
        # Background alone: how fast it goes when nobody is talking.
        quiet_from, quiet_before = time.monotonic(), len(background_done)
        time.sleep(QUIET_S)
        quiet_s, quiet_done = time.monotonic() - quiet_from, len(background_done) - quiet_before
        loaded_from, finished_before = time.monotonic(), len(background_done)
        loaded = []
        for i in range(chats):
            loaded.append(stream_chat(server.url, _unique(SHORT_CHAT), 8, chat))
            time.sleep(0.3 + 0.1 * (i % 3))
        loaded_s = time.monotonic() - loaded_from
        in_phase = len(background_done) - finished_before
        stop.set()
        for loader in loaders:
            loader.join()
        with urllib.request.urlopen(f"{server.url}/v1/stats", timeout=30) as response:
            stats = json.loads(response.read())
    idle_p95 = percentile([t.ttft for t in idle if t.ttft is not None], 95)
    loaded_p95 = percentile([t.ttft for t in loaded if t.ttft is not None], 95)
    return {
        "policy": policy,
        "idle_ttft_p95_s": idle_p95,
        "loaded_ttft_p95_s": loaded_p95,
        "ratio": (loaded_p95 / idle_p95) if idle_p95 and loaded_p95 else None,
        "idle_ttft_p50_s": percentile([t.ttft for t in idle if t.ttft is not None], 50),
        "loaded_ttft_p50_s": percentile([t.ttft for t in loaded if t.ttft is not None], 50),
        # Background requests completed while the chats ran, per minute of that phase, and
        # while nobody talked.
        "background_per_min": round(60 * in_phase / loaded_s, 1),
        "background_alone_per_min": round(60 * quiet_done / quiet_s, 1),
        # The server's own view of the round: its cost model's error and its host time.
        "prediction_error": stats.get("prediction_error"),
        "host_overhead": stats.get("host_overhead"),
    }


def interference(
    policies: list[str],
    threads: int,
    chats: int,
    background_streams: int,
    policy_config: dict[str, Any] | None = None,
    rounds: int = 2,
    llm: dict[str, Any] | None = None,
    profile: str | None = None,
) -> list[dict[str, Any]]:
    """Chat TTFT when background long prompts saturate the device, against the idle TTFT.

    Every prompt is unique (a nonce first), so the prefix cache cannot make the load vanish;
    the policies' rounds alternate (A B A B) and every round is reported, with the spread.
    `llm` replaces the LLM's settings (another model, layers on a GPU): then only the LLM runs,
    as on a GPU machine that has no speech or embedding engines; `profile` is the cost profile
    the servers plan with.
    """
    rows: list[dict[str, Any]] = []
    extra: dict[str, Any] = {"policy": policy_config} if policy_config else {}
    if llm:
        off = {"enabled": False}
        extra.update({"llm": llm, "stt": off, "tts": off, "embed": off})
    if profile:
        extra["server"] = {"profile": profile}
    for round_index in range(rounds):
        for policy in policies:
            row = _interference_round(policy, threads, chats, background_streams, extra or None)
            rows.append({"round": round_index + 1, **row})
            print(
                f"  round {round_index + 1} {policy}: idle p95 {_ms(row['idle_ttft_p95_s'])} ms, "
                f"loaded p95 {_ms(row['loaded_ttft_p95_s'])} ms",
                flush=True,
            )
    print(
        f"\nchat TTFT under background load ({background_streams} streams of unique "
        f"~1,000-token prompts), {chats} chats a phase, {threads} threads, {rounds} rounds"
    )
    print(
        f"{'policy':>10}{'round':>6}{'idle p95 ms':>13}{'loaded p95 ms':>15}{'ratio':>8}"
        f"{'idle p50':>10}{'loaded p50':>12}{'bg/min':>8}{'bg/min alone':>14}"
    )
    for row in rows:
        ratio = "-" if row["ratio"] is None else f"{row['ratio']:.2f}"
        print(
            f"{row['policy']:>10}{row['round']:>6}{_ms(row['idle_ttft_p95_s']):>13}"
            f"{_ms(row['loaded_ttft_p95_s']):>15}{ratio:>8}"
            f"{_ms(row['idle_ttft_p50_s']):>10}{_ms(row['loaded_ttft_p50_s']):>12}"
            f"{row['background_per_min']:>8}{row['background_alone_per_min']:>14}"
        )
    for policy in policies:
        ratios = sorted(r["ratio"] for r in rows if r["policy"] == policy and r["ratio"])
        bg = sorted(r["background_per_min"] for r in rows if r["policy"] == policy)
        alone = sorted(r["background_alone_per_min"] for r in rows if r["policy"] == policy)
        if ratios:
            print(
                f"{policy:>10}: ratio {min(ratios):.2f}–{max(ratios):.2f}, background "
                f"{min(bg)}–{max(bg)} a minute while chatting, {min(alone)}–{max(alone)} alone"
            )
    return rows
