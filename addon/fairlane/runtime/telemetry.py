"""What people feel, measured at the server: TTFT, ITL, E2E per class, plus throughput.

Times are taken where the client is served (when a token is handed to the HTTP response), with
the definitions of fairlane.runtime.metrics. `/v1/stats` reads a sliding window; `/metrics`
exports the same observations as Prometheus histograms.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from fairlane.policy import Kind, PolicyConfig, Priority
from fairlane.runtime.metrics import RequestRecord, percentile
from fairlane.runtime.turns import breakdown

_LATENCY_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.1,
    0.2,
    0.3,
    0.5,
    0.75,
    1,
    1.5,
    2,
    3,
    5,
    8,
    13,
    20,
    30,
    60,
    120,
)


class Telemetry:
    def __init__(
        self,
        config: PolicyConfig,
        window_s: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.window_s = window_s
        self.clock = clock
        self.started_at = clock()
        self.done: deque[RequestRecord] = deque()
        self.refused: dict[Priority, int] = dict.fromkeys(Priority, 0)
        self.registry = CollectorRegistry()
        labels = ["class"]
        self.ttft = Histogram(
            "fairlane_ttft_seconds",
            "Arrival to first token (STT: transcript)",
            labels,
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.itl = Histogram(
            "fairlane_itl_seconds",
            "Gap between consecutive streamed tokens",
            labels,
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.e2e = Histogram(
            "fairlane_e2e_seconds",
            "Arrival to last token or result",
            labels,
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.tokens = Counter(
            "fairlane_output_tokens", "Tokens generated", labels, registry=self.registry
        )
        self.prompt_tokens = Counter(
            "fairlane_prompt_tokens", "Prompt tokens admitted", labels, registry=self.registry
        )
        self.cached_tokens = Counter(
            "fairlane_prompt_tokens_cached",
            "Prompt tokens found in the prefix cache",
            labels,
            registry=self.registry,
        )
        # Since start: LLM prompt tokens admitted, and those the prefix cache already held.
        self.prompt_seen: dict[Priority, int] = dict.fromkeys(Priority, 0)
        self.prompt_cached: dict[Priority, int] = dict.fromkeys(Priority, 0)
        self.requests = Counter(
            "fairlane_requests", "Requests by outcome", ["class", "outcome"], registry=self.registry
        )
        self.queue = Gauge(
            "fairlane_queue_depth", "Requests waiting", labels, registry=self.registry
        )
        self.running = Gauge(
            "fairlane_running_sequences", "Sequences holding KV", labels, registry=self.registry
        )
        self.kv = Gauge(
            "fairlane_kv_used_ratio", "Fraction of KV blocks in use", registry=self.registry
        )
        self.rtf = Histogram(
            "fairlane_stt_real_time_factor",
            "Seconds from end of audio to transcript, per second of audio",
            labels,
            buckets=(0.01, 0.03, 0.1, 0.2, 0.3, 0.5, 1, 2, 5),
            registry=self.registry,
        )
        self.speech_rtf: deque[tuple[float, Priority, float]] = deque(maxlen=2000)
        self.prediction = Gauge(
            "fairlane_prediction_error_ratio",
            "The cost model's |predicted - measured| / measured step time, last 5 minutes",
            ["device", "step", "quantile"],
            registry=self.registry,
        )

    # --- observations ------------------------------------------------------------------------

    def begin(
        self,
        kind: Kind,
        priority: Priority,
        client: str,
        prompt_tokens: int,
        arrival: float,
        cached_tokens: int = 0,
    ) -> RequestRecord:
        self.prompt_tokens.labels(priority.label).inc(prompt_tokens)
        if kind is Kind.LLM:
            self.cached_tokens.labels(priority.label).inc(cached_tokens)
            self.prompt_seen[priority] += prompt_tokens
            self.prompt_cached[priority] += cached_tokens
        return RequestRecord(kind, priority, client, kind.value, arrival, prompt_tokens)

    def token(self, record: RequestRecord, at: float) -> None:
        label = record.priority.label
        if record.token_times:
            self.itl.labels(label).observe(at - record.token_times[-1])
        else:
            self.ttft.labels(label).observe(at - record.arrival)
        record.token_times.append(at)
        self.tokens.labels(label).inc()

    def finish(self, record: RequestRecord, at: float, outcome: str = "finished") -> None:
        record.finished_at = at
        self.requests.labels(record.priority.label, outcome).inc()
        if outcome == "finished":
            self.e2e.labels(record.priority.label).observe(at - record.arrival)
            self.done.append(record)

    def speech(self, priority: Priority, latency_s: float, audio_s: float) -> None:
        """One transcript: its real-time factor (latency over audio length)."""
        factor = latency_s / audio_s if audio_s > 0 else 0.0
        self.rtf.labels(priority.label).observe(factor)
        self.speech_rtf.append((self.clock(), priority, factor))

    def refuse(self, priority: Priority) -> None:
        self.refused[priority] += 1
        self.requests.labels(priority.label, "refused").inc()

    # --- reports -----------------------------------------------------------------------------

    def _window(self, now: float) -> list[RequestRecord]:
        while self.done and (self.done[0].finished_at or 0) < now - self.window_s:
            self.done.popleft()
        return list(self.done)

    def stats(self, device: dict[str, Any]) -> dict[str, Any]:
        """Per-class latency percentiles over the window, throughput, queues and KV use."""
        now = self.clock()
        span = min(self.window_s, max(now - self.started_at, 1e-6))
        records = self._window(now)
        classes: dict[str, Any] = {}
        for priority in Priority:
            mine = [r for r in records if r.priority is priority and r.kind is Kind.LLM]
            speech = [r for r in records if r.priority is priority and r.kind is Kind.STT]
            spoken = [r for r in records if r.priority is priority and r.kind is Kind.TTS]
            factors = [f for at, p, f in self.speech_rtf if p is priority and at >= now - span]
            slo = self.config.slo[priority]
            classes[priority.label] = {
                "requests": len(mine),
                "ttft_ms": _quantiles([t for r in mine if (t := r.ttft) is not None]),
                "itl_ms": _quantiles([g for r in mine for g in r.itl]),
                "e2e_ms": _quantiles([t for r in mine if (t := r.e2e) is not None]),
                "slo": {"ttft_ms": slo.ttft_ms, "itl_ms": slo.itl_ms},
                "slo_met": round(sum(r.met(slo) for r in mine) / len(mine), 3) if mine else None,
                "output_tokens_per_s": round(sum(len(r.token_times) for r in mine) / span, 2),
                "requests_per_s": round(len(mine) / span, 3),
                "refused": self.refused[priority],
                "stt": {
                    "requests": len(speech),
                    # STT's TTFT: end of audio → transcript.
                    "ttft_ms": _quantiles([t for r in speech if (t := r.ttft) is not None]),
                    "real_time_factor": _quantiles_raw(factors),
                    "slo_met": round(sum(r.met(slo) for r in speech) / len(speech), 3)
                    if speech
                    else None,
                },
                "tts": {
                    "requests": len(spoken),
                    # Speech synthesis: text in → first sentence's audio out.
                    "first_audio_ms": _quantiles([t for r in spoken if (t := r.ttft) is not None]),
                    "e2e_ms": _quantiles([t for r in spoken if (t := r.e2e) is not None]),
                },
                # LLM prompts since start: tokens, and the share found in the prefix cache.
                "prefix_cache": {
                    "prompt_tokens": self.prompt_seen[priority],
                    "cached_tokens": self.prompt_cached[priority],
                },
                "waiting": device["waiting"][priority.label],
                "running": device["running"][priority.label],
            }
            self.queue.labels(priority.label).set(device["waiting"][priority.label])
            self.running.labels(priority.label).set(device["running"][priority.label])
        total = device["kv_total_blocks"] or 1
        self.kv.set(device["kv_used_blocks"] / total)
        return {
            "window_s": round(span, 1),
            "classes": classes,
            "kv": {
                "used_blocks": device["kv_used_blocks"],
                "total_blocks": total,
                "block_size": device["kv_block_size"],
            },
            # Where spoken turns' time goes: transcript, agent, model calls, tool, first audio.
            "spoken_turns": breakdown(records, self.config.turn_gap_s),
            "cost_fit": device["cost_fit"],
            # Terms whose online correction was refused as implausible (a model-form error).
            "cost_form_errors": device.get("cost_form_errors", {}),
        }

    def prediction_error(self, errors: dict[str, dict[str, dict[str, Any]]]) -> None:
        """Export `fairlane.runtime.prediction`'s figures (median and p95 per step kind)."""
        self.prediction.clear()
        for device, kinds in errors.items():
            for step, figures in kinds.items():
                for quantile, key in (("0.5", "median"), ("0.95", "p95")):
                    if figures[key] is not None:
                        self.prediction.labels(device, step, quantile).set(figures[key])

    def prometheus(self, device: dict[str, Any]) -> bytes:
        self.stats(device)  # refresh the gauges
        return generate_latest(self.registry)


def _quantiles(values: list[float]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for q in (50, 95, 99):
        value = percentile(values, q)
        out[f"p{q}"] = None if value is None else round(value * 1000, 1)
    return out


def _quantiles_raw(values: list[float]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for q in (50, 95):
        value = percentile(values, q)
        out[f"p{q}"] = None if value is None else round(value, 3)
    return out
