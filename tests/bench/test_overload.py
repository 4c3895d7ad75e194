"""The overload and soak figures count what they say (no server: outcomes as a client saw them)."""

from __future__ import annotations

from fairlane.bench.overload import BACKGROUND_CLIENTS, Outcome, Report, overload_jobs


def test_the_summary_counts_each_kind_of_failure_once() -> None:
    report = Report(
        outcomes=[
            Outcome("chat", 0.0, status=200, first=0.5, done=1.0),
            Outcome("chat", 0.0, status=429, first=0.01, done=0.01, code="refused"),
            Outcome("chat", 0.0, status=429, first=30.0, done=30.0, code="deadline_exceeded"),
            Outcome("voice", 0.0, error="hung"),
            Outcome("voice", 0.0, status=200, first=3.0, error="slow"),
            Outcome("voice", 0.0, error="reset"),
            Outcome("voice", 0.0, status=200, first=0.2, error="cut off"),
            Outcome("voice", 0.0, status=503, first=0.1, done=0.1, code="busy"),
            Outcome("documents", 0.0, status=202, first=0.3, done=0.3),
        ],
        health_s=[0.01, 0.02, 0.5],
        rss_mb=[1000.0, 1010.0, 1010.0, 1012.0, 1015.0, 1020.0],
    )
    summary = report.summary()
    assert (summary["5xx"], summary["hung"], summary["resets"]) == (1, 1, 2)
    assert summary["slow"] == 1
    # Time to a refusal counts admission's refusals, not requests that waited and expired.
    assert summary["refusal_max_s"] == 0.01
    assert summary["health_max_s"] == 0.5
    assert summary["rss_growth_mb"] == 10.0  # from the first fifth of the run on
    assert summary["statuses"]["429 deadline_exceeded"] == 1
    assert summary["by_kind"]["documents"]["served"] == 1  # a 202 is an answer
    assert summary["by_kind"]["chat"] == {
        "sent": 3, "served": 1, "first_p50_s": 0.5, "first_p95_s": 0.5
    }


def test_overload_is_three_times_each_interactive_queue_and_background_clients() -> None:
    jobs = overload_jobs({"voice": 32, "chat": 128, "background": 10**6}, 3.0)
    assert [(count, name, args) for count, name, args in jobs] == [
        (96, "chat", ("voice", 64)),
        (384, "chat", ("chat", 64)),
        (BACKGROUND_CLIENTS, "embed", (16, "background")),
    ]


def test_the_soak_compares_chat_with_the_idle_server_and_times_expiries() -> None:
    report = Report(
        outcomes=[
            Outcome("chat", 0.0, status=200, first=0.6, done=1.0),
            Outcome("chat", 0.0, status=429, first=30.5, done=30.5, code="deadline_exceeded"),
        ],
        idle_chat_s=[0.3, 0.3, 0.3],
    )
    summary = report.summary()
    assert summary["idle_chat_first_p50_s"] == 0.3
    assert summary["chat_vs_idle_p50"] == 2.0
    assert summary["expired_after_s"] == {"chat": {"p50": 30.5, "max": 30.5}}
