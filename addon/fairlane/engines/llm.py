"""The LLM engine: llama.cpp's low-level API, one context, many sequences.

The engine never decides what runs: it turns a planned `LlmPlan` into exactly one
`llama_decode` call whose batch carries one token for each decoding sequence plus the prefill
chunks the plan chose, samples a token for each chunk that asks for one, and reports back.

Longer than the project's ~450 lines on purpose: llama.cpp's C API (batch, KV, sampling) is
bound in one place, so what the engine does per step reads in one file.
"""

from __future__ import annotations

import codecs
import ctypes
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fairlane.engines.native import import_llama_cpp
from fairlane.engines.placement import Placement
from fairlane.policy import LlmPlan, SeqOutput, StepResult

lc = import_llama_cpp()


class EngineError(RuntimeError):
    """The engine could not do what was asked (bad model, context overflow, decode failure)."""


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 0.7
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    seed: int | None = None
    stop: tuple[str, ...] = ()
    grammar: str | None = None  # GBNF the output must match (JSON mode), rule `root`


@dataclass(frozen=True)
class TokenEvent:
    """Text a sequence produced in one step (may be empty while a stop string is possible)."""

    request_id: str
    text: str
    finish_reason: str | None = None  # "stop" (EOS or stop string) or "length"


@dataclass
class Sequence:
    """Engine-side state of one request: its tokens, sampler and detokenizer."""

    request_id: str
    tokens: list[int]
    prompt_len: int
    params: SamplingParams
    sampler: Any  # llama_sampler_p
    seq_id: int | None = None
    decoder: codecs.IncrementalDecoder = field(
        default_factory=lambda: codecs.getincrementaldecoder("utf-8")("replace")
    )
    held: str = ""  # text not yet sent: it might be the start of a stop string
    finish_reason: str | None = None
    # A cached prefix this sequence starts from, copied in when its first chunk runs.
    reuse: CachedPrefix | None = None
    reuse_tokens: int = 0
    # The entry it was admitted to start from (kept after the pin goes, for the cache's
    # bookkeeping when it finishes).
    started_from: CachedPrefix | None = None
    interactive: bool = True  # its class, from its chunks (voice or chat; not background)

    @property
    def generated(self) -> int:
        return len(self.tokens) - self.prompt_len


@dataclass
class CachedPrefix:
    """The KV cells of a finished sequence's tokens, kept under a sequence id of their own."""

    seq_id: int
    tokens: list[int]
    used_at: float
    pins: int = 0  # sequences admitted to start from it, until they are released
    hits: int = 0  # prompts that started from it (Home Assistant's system prompt: many)
    interactive: bool = True  # stored by a voice or chat turn (a background one: False)


@dataclass(frozen=True)
class EngineConfig:
    model_path: Path
    n_ctx: int = 8192
    n_seq_max: int = 8
    n_batch: int = 2048
    n_threads: int = 0  # 0: the cores this process may use
    n_gpu_layers: int = 0  # 0: CPU only; -1 or a large number: everything on the GPU
    # Cells kept for finished sequences' tokens, reused by a later prompt that starts the same
    # way (Home Assistant's system prompt and tools, the second call of a tool turn). They are
    # outside the policy's KV budget, which is n_ctx minus these. 0: no prefix cache.
    prefix_cache_tokens: int = 0
    prefix_cache_slots: int = 2


# A shorter common prefix is not worth a cache lookup's bookkeeping.
MIN_PREFIX_REUSE = 16


def default_threads() -> int:
    """One thread per core this process owns (sched_getaffinity, not the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


_LOG_CALLBACK = lc.llama_log_callback(lambda level, text, user_data: None)


class LlamaEngine:
    """One llama.cpp context with `n_seq_max` sequence ids."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        lc.llama_log_set(_LOG_CALLBACK, ctypes.c_void_p(0))
        lc.llama_backend_init()
        model_params = lc.llama_model_default_params()
        model_params.n_gpu_layers = config.n_gpu_layers
        offload = bool(lc.llama_supports_gpu_offload())
        asked = "cuda" if config.n_gpu_layers != 0 else "cpu"
        self.placement = Placement(
            "llm",
            asked,
            asked if offload or asked == "cpu" else "cpu",
            "llama.cpp with GPU offload" if offload else "llama.cpp built without GPU offload",
        )
        self.model = lc.llama_model_load_from_file(str(config.model_path).encode(), model_params)
        if not self.model:
            raise EngineError(f"llama.cpp could not load {config.model_path}")
        threads = config.n_threads or default_threads()
        params = lc.llama_context_default_params()
        params.n_ctx = config.n_ctx
        # One llama_decode may carry up to a context's worth of tokens (the policy decides how
        # many); llama.cpp computes it in micro-batches of n_batch.
        params.n_batch = config.n_ctx
        params.n_ubatch = config.n_batch
        cache_slots = config.prefix_cache_slots if config.prefix_cache_tokens > 0 else 0
        params.n_seq_max = config.n_seq_max + cache_slots
        params.n_threads = threads
        params.n_threads_batch = threads
        # One KV pool shared by every sequence: the policy accounts KV as one budget of blocks.
        params.kv_unified = True
        self.ctx = lc.llama_init_from_model(self.model, params)
        if not self.ctx:
            lc.llama_model_free(self.model)
            raise EngineError("llama.cpp could not create a context (out of memory?)")
        self.vocab = lc.llama_model_get_vocab(self.model)
        self.memory = lc.llama_get_memory(self.ctx)
        self.batch = lc.llama_batch_init(config.n_ctx, 0, 1)
        self.n_ctx = lc.llama_n_ctx(self.ctx)
        self.free_ids = list(range(config.n_seq_max - 1, -1, -1))
        self.cache_ids = list(range(config.n_seq_max + cache_slots - 1, config.n_seq_max - 1, -1))
        self.cache: list[CachedPrefix] = []
        # `add` runs on the HTTP side, the rest on the device loop's thread: the cache's
        # entries and pins are shared between them.
        self._cache_lock = threading.RLock()
        self.sequences: dict[str, Sequence] = {}
        self.threads = threads

    # --- model facts -------------------------------------------------------------------------

    def metadata(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(1 << 16)
        size = lc.llama_model_meta_val_str(self.model, key.encode(), buf, len(buf))
        if size < 0:
            return None
        if size >= len(buf):  # a long chat template: ask again with room for all of it
            buf = ctypes.create_string_buffer(size + 1)
            lc.llama_model_meta_val_str(self.model, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", errors="replace")

    def token_text(self, token: int, special: bool = True) -> str:
        buf = ctypes.create_string_buffer(256)
        n = lc.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        return buf.raw[: max(n, 0)].decode("utf-8", errors="replace")

    @property
    def bos_text(self) -> str:
        token = lc.llama_vocab_bos(self.vocab)
        return self.token_text(token) if token >= 0 else ""

    @property
    def eos_text(self) -> str:
        token = lc.llama_vocab_eos(self.vocab)
        return self.token_text(token) if token >= 0 else ""

    def tokenize(self, text: str, add_special: bool = False) -> list[int]:
        """Tokens of `text`; special tokens written in it (chat markup) are parsed as such."""
        data = text.encode("utf-8")
        capacity = len(data) + 16
        tokens = (lc.llama_token * capacity)()
        n = lc.llama_tokenize(self.vocab, data, len(data), tokens, capacity, add_special, True)
        if n < 0:
            raise EngineError(f"tokenizer needed {-n} tokens for {len(data)} bytes")
        return list(tokens[:n])

    # --- sequences ---------------------------------------------------------------------------

    @property
    def capacity(self) -> int:
        """Tokens the running sequences may hold together: the context less the prefix cache."""
        return int(self.n_ctx) - self.config.prefix_cache_tokens

    def add(self, request_id: str, prompt: list[int], params: SamplingParams) -> int:
        """Register a sequence; it gets a llama.cpp sequence id when its first chunk runs.

        Returns how many of its prompt tokens are already in the prefix cache: its prefill
        starts there.
        """
        if not prompt:
            raise EngineError("empty prompt")
        if len(prompt) + 1 > self.capacity:
            raise EngineError(
                f"prompt of {len(prompt)} tokens exceeds the context ({self.capacity})"
            )
        seq = Sequence(request_id, list(prompt), len(prompt), params, self._sampler(params))
        with self._cache_lock:
            entry, reused = self._longest_prefix(prompt)
            if entry is not None:
                entry.pins += 1
                entry.hits += 1
                entry.used_at = time.monotonic()
                seq.reuse, seq.reuse_tokens, seq.started_from = entry, reused, entry
        self.sequences[request_id] = seq
        return seq.reuse_tokens

    def release(self, request_id: str) -> None:
        """Forget a finished or cancelled sequence: its id is reused, and its cells go or, if
        it finished, are kept in the prefix cache."""
        seq = self.sequences.pop(request_id, None)
        if seq is None:
            return
        self._unpin(seq)
        if seq.finish_reason is not None and seq.seq_id is not None:
            self._keep_prefix(seq)
        self._drop_kv(seq)
        lc.llama_sampler_free(seq.sampler)

    def _drop_kv(self, seq: Sequence) -> None:
        if seq.seq_id is not None:
            lc.llama_memory_seq_rm(self.memory, seq.seq_id, -1, -1)
            self.free_ids.append(seq.seq_id)
            seq.seq_id = None

    # --- the prefix cache --------------------------------------------------------------------

    def _longest_prefix(self, prompt: list[int]) -> tuple[CachedPrefix | None, int]:
        """The cached prefix sharing the most leading tokens with `prompt`, and how many.

        The prompt's last token is always computed: its logits give the first output.
        """
        best: tuple[CachedPrefix | None, int] = (None, 0)
        for entry in self.cache:
            shared = min(_common_prefix(entry.tokens, prompt), len(prompt) - 1)
            if shared >= MIN_PREFIX_REUSE and shared > best[1]:
                best = (entry, shared)
        return best

    def _start_from_cache(self, seq: Sequence) -> None:
        """Share the cached prefix's cells with the sequence (no copy of the data in unified
        KV: the cells get the sequence's id too).

        The entry stays pinned until the sequence is released or recomputed: its cells are
        counted in the cache's budget only, so the entry must not leave the cache (and the
        budget) while a sequence still uses them.
        """
        entry = seq.reuse
        assert entry is not None and seq.seq_id is not None
        lc.llama_memory_seq_rm(self.memory, seq.seq_id, -1, -1)
        lc.llama_memory_seq_cp(self.memory, entry.seq_id, seq.seq_id, 0, seq.reuse_tokens)

    def _unpin(self, seq: Sequence) -> None:
        with self._cache_lock:
            if seq.reuse is not None:
                seq.reuse.pins -= 1
                seq.reuse = None

    def _keep_prefix(self, seq: Sequence) -> None:
        """Keep the cells of a finished sequence's tokens (every token but the last sampled,
        which was never fed) for a later prompt that starts the same way."""
        budget = self.config.prefix_cache_tokens
        tokens = seq.tokens[: min(len(seq.tokens) - 1, budget)]
        if len(tokens) < MIN_PREFIX_REUSE:
            return
        with self._cache_lock:
            self._store_prefix(seq, tokens, budget)

    def _store_prefix(self, seq: Sequence, tokens: list[int], budget: int) -> None:
        """Keep `tokens`' cells if room can be made.

        An entry they extend is superseded, and so is the entry the sequence started from when
        it reused most of it (Home Assistant's system prompt and an earlier turn's unique words:
        the new entry holds the same system prompt, and the latest turn); their hits carry
        over. Room is then made from the least valuable entries first: a background turn's,
        then one no prompt has reused, then the least recently used. A background turn (a
        summary of a unique document) may only replace another background turn's entry that
        nobody reused: it must not push out Home Assistant's system prompt. Entries that
        sequences are about to start from (pinned) always stay.
        """
        hits = 0
        superseded = [e for e in self.cache if _common_prefix(e.tokens, tokens) == len(e.tokens)]
        started_from = seq.started_from
        if (
            started_from is not None
            and started_from in self.cache
            and 2 * seq.reuse_tokens >= len(started_from.tokens)
        ):
            superseded.append(started_from)
        for entry in superseded:
            if entry.pins == 0 and entry in self.cache:
                hits = max(hits, entry.hits)
                self._evict(entry)

        def has_room() -> bool:
            return bool(self.cache_ids) and (
                sum(len(e.tokens) for e in self.cache) + len(tokens) <= budget
            )

        def may_replace(entry: CachedPrefix) -> bool:
            if entry.pins:
                return False
            return seq.interactive or (not entry.interactive and entry.hits == 0)

        for entry in sorted(self.cache, key=lambda e: (e.interactive, e.hits > 0, e.used_at)):
            if has_room():
                break
            if may_replace(entry):
                self._evict(entry)
        if not has_room():
            return  # what is cached is worth more than this sequence's tokens: keep it
        assert seq.seq_id is not None
        cache_id = self.cache_ids.pop()
        lc.llama_memory_seq_cp(self.memory, seq.seq_id, cache_id, 0, len(tokens))
        entry = CachedPrefix(cache_id, tokens, time.monotonic(), hits=hits)
        entry.interactive = seq.interactive
        self.cache.append(entry)

    def _evict(self, entry: CachedPrefix) -> None:
        lc.llama_memory_seq_rm(self.memory, entry.seq_id, -1, -1)
        self.cache.remove(entry)
        self.cache_ids.append(entry.seq_id)

    def grammar_parses(self, grammar: str) -> bool:
        """Whether llama.cpp accepts this GBNF grammar (rule `root`) for this model's vocabulary."""
        sampler = lc.llama_sampler_init_grammar(self.vocab, grammar.encode(), b"root")
        if not sampler:
            return False
        lc.llama_sampler_free(sampler)
        return True

    def _sampler(self, params: SamplingParams) -> Any:
        chain = lc.llama_sampler_chain_init(lc.llama_sampler_chain_default_params())
        if params.grammar is not None:
            # First in the chain: tokens the grammar forbids never reach the other samplers.
            grammar = lc.llama_sampler_init_grammar(self.vocab, params.grammar.encode(), b"root")
            if not grammar:
                lc.llama_sampler_free(chain)
                raise EngineError("the output grammar does not parse")
            lc.llama_sampler_chain_add(chain, grammar)
        if params.temperature <= 0:
            lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_greedy())
            return chain
        if params.top_k > 0:
            lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_top_k(params.top_k))
        if params.top_p < 1.0:
            lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_top_p(params.top_p, 1))
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_temp(params.temperature))
        seed = params.seed if params.seed is not None else lc.LLAMA_DEFAULT_SEED
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_dist(seed & 0xFFFFFFFF))
        return chain

    # --- one iteration -----------------------------------------------------------------------

    def execute(
        self, plan: LlmPlan, clock: Callable[[], float] = time.perf_counter
    ) -> tuple[StepResult, list[TokenEvent]]:
        """Run one iteration: ONE llama_decode over every chunk in the plan."""
        for request_id in plan.preempted:
            if (seq := self.sequences.get(request_id)) is not None:
                self._unpin(seq)
                self._drop_kv(seq)  # resumes later by recomputing its tokens
        batch = self.batch
        n = 0
        sampling: list[tuple[Sequence, int]] = []
        for chunk in plan.chunks:
            seq = self.sequences[chunk.request_id]
            seq.interactive = chunk.priority.interactive
            if seq.seq_id is None:
                seq.seq_id = self.free_ids.pop()
            if chunk.start == 0:  # a fresh start or a recompute: no stale cells
                self._unpin(seq)
                lc.llama_memory_seq_rm(self.memory, seq.seq_id, -1, -1)
            elif seq.reuse is not None and chunk.start == seq.reuse_tokens:
                self._start_from_cache(seq)  # the first chunk after a cached prefix
            for offset in range(chunk.num_tokens):
                position = chunk.start + offset
                batch.token[n] = seq.tokens[position]
                batch.pos[n] = position
                batch.n_seq_id[n] = 1
                batch.seq_id[n][0] = seq.seq_id
                batch.logits[n] = 0
                n += 1
            if chunk.samples:
                batch.logits[n - 1] = 1
                sampling.append((seq, n - 1))
        batch.n_tokens = n
        if n == 0:  # only preemptions: nothing to compute
            return StepResult(0.0, ()), []
        start = clock()
        status = lc.llama_decode(self.ctx, batch)
        decoded = clock()
        if status != 0:
            raise EngineError(f"llama_decode failed with status {status} on {n} tokens")
        outputs: list[SeqOutput] = []
        events: list[TokenEvent] = []
        for seq, index in sampling:
            token = lc.llama_sampler_sample(seq.sampler, self.ctx, index)
            event = self._emit(seq, token)
            events.append(event)
            outputs.append(SeqOutput(seq.request_id, 1, event.finish_reason is not None))
        return StepResult(clock() - start, tuple(outputs), decoded - start), events

    def _emit(self, seq: Sequence, token: int) -> TokenEvent:
        """Append a sampled token; return the text that can be sent and whether it ended."""
        seq.tokens.append(token)
        if lc.llama_vocab_is_eog(self.vocab, token):
            seq.finish_reason = "stop"
            text, seq.held = seq.held + seq.decoder.decode(b"", final=True), ""
            return TokenEvent(seq.request_id, text, "stop")
        piece = ctypes.create_string_buffer(256)
        size = lc.llama_token_to_piece(self.vocab, token, piece, len(piece), 0, False)
        seq.held += seq.decoder.decode(piece.raw[: max(size, 0)])
        for stop in seq.params.stop:
            if (cut := seq.held.find(stop)) >= 0:
                seq.finish_reason = "stop"
                text, seq.held = seq.held[:cut], ""
                return TokenEvent(seq.request_id, text, "stop")
        if seq.generated >= seq.params.max_tokens or len(seq.tokens) >= self.n_ctx:
            seq.finish_reason = "length"
            text, seq.held = seq.held + seq.decoder.decode(b"", final=True), ""
            return TokenEvent(seq.request_id, text, "length")
        keep = _stop_prefix_len(seq.held, seq.params.stop)
        text = seq.held[: len(seq.held) - keep]
        seq.held = seq.held[len(seq.held) - keep :]
        return TokenEvent(seq.request_id, text)

    def close(self) -> None:
        for request_id in list(self.sequences):
            self.release(request_id)
        with self._cache_lock:
            for entry in list(self.cache):
                self._evict(entry)
        lc.llama_batch_free(self.batch)
        lc.llama_free(self.ctx)
        lc.llama_model_free(self.model)


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _stop_prefix_len(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest tail of `text` that is the start of a stop string."""
    longest = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), 0, -1):
            if text.endswith(stop[:size]):
                longest = max(longest, size)
                break
    return longest
