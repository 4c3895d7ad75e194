"""The LLM engine: llama.cpp's low-level API, one context, many sequences.

The engine never decides what runs: it turns a planned `LlmPlan` into exactly one
`llama_decode` call whose batch carries one token for each decoding sequence plus the prefill
chunks the plan chose, samples a token for each chunk that asks for one, and reports back.

Sampling (a token from each row of logits, under a grammar where asked) is engines.sampling.
"""

from __future__ import annotations

import bisect
import codecs
import ctypes
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fairlane.engines.cores import CoreShare
from fairlane.engines.native import import_llama_cpp
from fairlane.engines.placement import Placement
from fairlane.engines.prefix_cache import MIN_PREFIX_REUSE, CachedPrefix, PrefixCache, common_prefix
from fairlane.engines.sampling import (
    GRAMMAR_OVER_BUDGET,
    Grammar,
    OverBudget,
    Sampler,
    SamplingParams,
)
from fairlane.policy import LlmPlan, Priority, SeqOutput, StepResult

__all__ = ["EngineConfig", "EngineError", "LlamaEngine", "SamplingParams", "TokenEvent"]

lc = import_llama_cpp()
_LOGGER = logging.getLogger(__name__)


class EngineError(RuntimeError):
    """The engine could not do what was asked (bad model, context overflow, decode failure)."""


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
    sampler: Any  # llama_sampler_p: its chain (top-k/p, temperature, draw)
    grammar: Grammar | None = None  # its output grammar, apart from the chain
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
    priority: Priority = Priority.CHAT  # its class, from its chunks
    rng: np.random.Generator = field(default_factory=np.random.default_rng)  # its draws

    @property
    def generated(self) -> int:
        return len(self.tokens) - self.prompt_len


@dataclass(frozen=True)
class EngineConfig:
    model_path: Path
    n_ctx: int = 8192
    n_seq_max: int = 8
    n_batch: int = 2048
    n_threads: int = 0  # 0: the cores this process may use
    # On automatic threads, a CPU engine gives a thread up while another process holds one of
    # its cores (fairlane.engines.cores).
    give_way: bool = False
    n_gpu_layers: int = 0  # 0: CPU only; -1 or a large number: everything on the GPU
    # Cells kept for finished sequences' tokens, reused by a later prompt that starts the same
    # way (Home Assistant's system prompt and tools, the second call of a tool turn). They are
    # outside the policy's KV budget, which is n_ctx minus these. 0: no prefix cache.
    prefix_cache_tokens: int = 0
    prefix_cache_slots: int = 4
    # A sequence's grammar work in one step, at most (engines.sampling): past it the request
    # ends with an error, and the step goes on for everyone else.
    grammar_budget_s: float = 0.5


# Tokens a prompt gives back from a cached entry's spelling to find a cut the tokenizer shares.
CUT_BACKOFF = 8


class Batch:
    """llama.cpp's batch over arrays the engine owns, filled with numpy slices.

    A prompt chunk of 512 tokens is five slice assignments instead of 2,560 ctypes element
    writes; a decode of 32 sequences is five gathers. Every token belongs to one sequence, so
    `seq_id[i]` points once and for all at `seq[i]`."""

    def __init__(self, capacity: int) -> None:
        self.token = np.zeros(capacity, np.int32)
        self.pos = np.zeros(capacity, np.int32)
        self.n_seq_id = np.ones(capacity, np.int32)
        self.seq = np.zeros(capacity, np.int32)
        self.logits = np.zeros(capacity, np.int8)
        # One pointer per token, to its entry of `seq`.
        self._seq_ptrs = self.seq.ctypes.data + 4 * np.arange(capacity, dtype=np.uint64)
        self.struct = lc.llama_batch(
            n_tokens=0,
            token=self.token.ctypes.data_as(ctypes.POINTER(lc.llama_token)),
            embd=None,
            pos=self.pos.ctypes.data_as(ctypes.POINTER(lc.llama_pos)),
            n_seq_id=self.n_seq_id.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)),
            seq_id=self._seq_ptrs.ctypes.data_as(
                ctypes.POINTER(ctypes.POINTER(lc.llama_seq_id))
            ),
            logits=self.logits.ctypes.data_as(ctypes.POINTER(ctypes.c_int8)),
        )


def extra_buffers_safe(system_info: bytes) -> bool:
    """Whether llama.cpp's extra weight buffers may be used on this CPU: not with AMX."""
    return b"AMX_INT8 = 1" not in system_info


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
        if not extra_buffers_safe(lc.llama_print_system_info()):
            # llama.cpp's AMX buffers (its weights repacked for Intel's matrix unit) crash
            # this engine's first llama_decode (SIGSEGV, llama-cpp-python 0.3.36, Xeon with
            # AMX_INT8): the weights stay as the file has them.
            _LOGGER.warning("This CPU has AMX: llama.cpp's repacked weight buffers are off")
            model_params.use_extra_bufts = False
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
        self.batch = Batch(config.n_ctx)
        self.n_ctx = lc.llama_n_ctx(self.ctx)
        self.n_vocab = lc.llama_vocab_n_tokens(self.vocab)
        self._piece = ctypes.create_string_buffer(256)
        self.sampling = Sampler(self.vocab, self.ctx, self.n_vocab, config.grammar_budget_s)
        self.free_ids = list(range(config.n_seq_max - 1, -1, -1))
        cache_ids = list(range(config.n_seq_max + cache_slots - 1, config.n_seq_max - 1, -1))
        self.prefixes = PrefixCache(
            config.prefix_cache_tokens,
            cache_ids,
            lambda source, target, n: lc.llama_memory_seq_cp(self.memory, source, target, 0, n),
            lambda seq_id, start: lc.llama_memory_seq_rm(self.memory, seq_id, start, -1),
        )
        self.sequences: dict[str, Sequence] = {}
        self.threads = threads
        # On automatic threads, a CPU engine may give a core's thread up while another process
        # holds that core (fairlane.engines.cores).
        adapts = config.give_way and not config.n_threads and threads > 1
        self.cores = CoreShare(threads) if adapts and self.placement.got == "cpu" else None
        if self.cores is not None:
            self.cores.start()

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

    def tokenize_prompt(self, text: str) -> list[int]:
        """A chat prompt's tokens, its leading text spelt as the prefix cache spells it.

        A reply the model sampled comes back in the next turn's prompt as the same text, but
        not always as the same tokens: the model may sample apart what the tokenizer merges
        (`"}}` and a newline, where the tokenizer writes `"}}\\n`), and the prefix cache would
        break there and prefill the rest of the reply again. So the prompt takes the tokens of
        the cached entry that spells the most of its leading text (whole tokens), followed by
        the tokenizer's tokens for the rest, when those are also the last of the prompt's own
        tokens (the cut is a token boundary, as before the chat template's `<|im_end|>`): the
        same text, with the model's own tokens for its own words."""
        tokens = self.tokenize(text)
        data = text.encode("utf-8")
        with self.prefixes.lock:
            entries = [(e, list(e.tokens)) for e in self.prefixes.entries]
        best: tuple[list[int], list[int]] | None = None  # the entry's tokens and their ends
        for entry, cached in entries:
            spelt, ends = self._spelling(entry, cached)
            count = bisect.bisect_right(ends, _common_bytes(spelt, data))
            if count > common_prefix(cached, tokens) and (
                best is None or ends[count - 1] > best[1][-1]
            ):
                best = (cached[:count], ends[:count])
        if best is None:
            return tokens
        cached, ends = best
        # Back off a few tokens where the entry's cut is not one of the tokenizer's.
        for count in range(len(cached), max(len(cached) - CUT_BACKOFF, 0), -1):
            try:
                rest = self.tokenize(data[ends[count - 1] :].decode("utf-8"))
            except UnicodeDecodeError:  # the cut is inside a character
                continue
            if not rest or (len(rest) <= len(tokens) and tokens[-len(rest) :] == rest):
                return cached[:count] + rest
        return tokens

    def _spelling(self, entry: CachedPrefix, tokens: list[int]) -> tuple[bytes, list[int]]:
        """The text of `tokens` (an entry's, copied; special tokens as written) and where each
        ends in it; kept on the entry for as many tokens as it then had.
        On the HTTP side's threads, outside the cache's lock (the device loop takes it), so
        with a buffer of its own."""
        count, spelt, ends = entry.spelt
        if count != len(tokens):
            buf = ctypes.create_string_buffer(256)
            pieces, ends, at = [], [], 0
            for token in tokens:
                size = lc.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, True)
                pieces.append(buf.raw[: max(size, 0)])
                at += max(size, 0)
                ends.append(at)
            spelt = b"".join(pieces)
            entry.spelt = (len(tokens), spelt, ends)
        return spelt, ends

    @property
    def cache(self) -> list[CachedPrefix]:
        """The prefix cache's entries (engines.prefix_cache)."""
        return self.prefixes.entries

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
        if params.grammar is not None:
            sampler = lc.llama_sampler_init_grammar(self.vocab, params.grammar.encode(), b"root")
            if not sampler:
                lc.llama_sampler_free(seq.sampler)
                raise EngineError("the output grammar does not parse")
            seq.grammar = Grammar(sampler, params.grammar_triggers)
        if params.seed is not None:  # the same seed, the same draws
            seq.rng = np.random.default_rng(params.seed & 0xFFFFFFFF)
        with self.prefixes.lock:
            entry, reused = self.prefixes.longest(prompt)
            if entry is not None:
                entry.pins += 1
                entry.hits += 1
                entry.shared = max(entry.shared, reused)
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
        if seq.grammar is not None:
            seq.grammar.close()

    def _drop_kv(self, seq: Sequence) -> None:
        if seq.seq_id is not None:
            lc.llama_memory_seq_rm(self.memory, seq.seq_id, -1, -1)
            self.free_ids.append(seq.seq_id)
            seq.seq_id = None

    # --- the prefix cache --------------------------------------------------------------------

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

    def _keep_prefix(self, seq: Sequence) -> None:
        """Keep the cells of a finished sequence's tokens (every token but the last sampled,
        which was never fed) for a later prompt that starts the same way."""
        tokens = seq.tokens[: min(len(seq.tokens) - 1, self.prefixes.budget)]
        if len(tokens) < MIN_PREFIX_REUSE or seq.seq_id is None:
            return
        with self.prefixes.lock:
            self.prefixes.store(
                tokens, seq.seq_id, seq.priority, seq.started_from, seq.reuse_tokens
            )

    def _unpin(self, seq: Sequence) -> None:
        with self.prefixes.lock:
            if seq.reuse is not None:
                seq.reuse.pins -= 1
                seq.reuse = None

    def grammar_parses(self, grammar: str) -> bool:
        """Whether llama.cpp accepts this GBNF grammar (rule `root`) for this model's vocabulary."""
        sampler = lc.llama_sampler_init_grammar(self.vocab, grammar.encode(), b"root")
        if not sampler:
            return False
        lc.llama_sampler_free(sampler)
        return True

    def _sampler(self, params: SamplingParams) -> Any:
        chain = lc.llama_sampler_chain_init(lc.llama_sampler_chain_default_params())
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
        sampling: list[Sequence] = []  # in batch order, as llama.cpp keeps their logits
        positions: list[int] = []  # where each one's last token sits in the batch
        for chunk in plan.chunks:
            seq = self.sequences[chunk.request_id]
            seq.priority = chunk.priority
            if seq.seq_id is None:
                seq.seq_id = self.free_ids.pop()
            if chunk.start == 0:  # a fresh start or a recompute: no stale cells
                self._unpin(seq)
                lc.llama_memory_seq_rm(self.memory, seq.seq_id, -1, -1)
            elif seq.reuse is not None and chunk.start == seq.reuse_tokens:
                self._start_from_cache(seq)  # the first chunk after a cached prefix
            end = n + chunk.num_tokens
            if chunk.num_tokens == 1:
                batch.token[n] = seq.tokens[chunk.start]
                batch.pos[n] = chunk.start
            else:
                batch.token[n:end] = seq.tokens[chunk.start : chunk.start + chunk.num_tokens]
                batch.pos[n:end] = np.arange(chunk.start, chunk.start + chunk.num_tokens)
            batch.seq[n:end] = seq.seq_id
            batch.logits[n:end] = 0
            if chunk.samples:
                batch.logits[end - 1] = 1
                sampling.append(seq)
                positions.append(end - 1)
            n = end
        batch.struct.n_tokens = n
        if n == 0:  # only preemptions: nothing to compute
            return StepResult(0.0, ()), []
        if self.cores is not None:
            self._use_threads(self.cores.threads())
        start = clock()
        status = lc.llama_decode(self.ctx, batch.struct)
        decoded = clock()
        if status != 0:
            raise EngineError(f"llama_decode failed with status {status} on {n} tokens")
        tokens = self.sampling.sample(sampling, positions, self._logits(len(sampling)))
        outputs: list[SeqOutput] = []
        events: list[TokenEvent] = []
        for seq, token in zip(sampling, tokens, strict=True):
            if isinstance(token, OverBudget):  # its grammar is too slow: it ends, no one waits
                seq.finish_reason = GRAMMAR_OVER_BUDGET
                event = TokenEvent(seq.request_id, "", f"{GRAMMAR_OVER_BUDGET}: {token}")
            else:
                event = self._emit(seq, token)
            events.append(event)
            outputs.append(SeqOutput(seq.request_id, 1, event.finish_reason is not None))
        return StepResult(clock() - start, tuple(outputs), decoded - start), events

    def thread_use(self) -> dict[str, Any]:
        """The threads the last step ran on; `others_cores`: the CPU other processes used on
        this process's cores (automatic threads only; `fixed`: `llm.threads` was set)."""
        if self.cores is None:
            return {"threads": self.threads, "fixed": True}
        return {**self.cores.as_dict(), "threads": self.threads, "fixed": False}

    def _use_threads(self, threads: int) -> None:
        if threads != self.threads:
            lc.llama_set_n_threads(self.ctx, threads, threads)
            self.threads = threads

    def _logits(self, outputs: int) -> Any:
        """The last decode's logits, `outputs` rows of the vocabulary, as a numpy view."""
        address = ctypes.cast(lc.llama_get_logits(self.ctx), ctypes.c_void_p).value or 0
        buffer = (ctypes.c_float * (outputs * self.n_vocab)).from_address(address)
        return np.frombuffer(buffer, np.float32).reshape(outputs, self.n_vocab)

    def _emit(self, seq: Sequence, token: int) -> TokenEvent:
        """Append a sampled token; return the text that can be sent and whether it ended."""
        seq.tokens.append(token)
        if lc.llama_vocab_is_eog(self.vocab, token):
            seq.finish_reason = "stop"
            text, seq.held = seq.held + seq.decoder.decode(b"", final=True), ""
            return TokenEvent(seq.request_id, text, "stop")
        piece = self._piece
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
        if self.cores is not None:
            self.cores.stop()
        for request_id in list(self.sequences):
            self.release(request_id)
        self.prefixes.close()
        lc.llama_free(self.ctx)
        lc.llama_model_free(self.model)


def _common_bytes(a: bytes, b: bytes) -> int:
    """How many leading bytes `a` and `b` share (slices compared in C, halving)."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        middle = (low + high + 1) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


def _stop_prefix_len(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest tail of `text` that is the start of a stop string."""
    longest = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), 0, -1):
            if text.endswith(stop[:size]):
                longest = max(longest, size)
                break
    return longest
