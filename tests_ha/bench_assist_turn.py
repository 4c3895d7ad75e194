"""What a spoken command costs through Home Assistant on this machine (a benchmark, not a test).

    .venv-ha/bin/pytest -c tests_ha/pytest.ini tests_ha/bench_assist_turn.py -s

Turns the kitchen light on and off through Assist's tools, as a voice satellite would (class
`voice`), and asks a question without tools; prints, per kind of turn, the time to the first
streamed words as Home Assistant sees them, the whole turn and the model calls a turn took.
Not collected by `make test` (the name does not start with `test_`).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from homeassistant.components import conversation
from homeassistant.core import Context, HomeAssistant
from pytest_homeassistant_custom_component.common import MockConfigEntry

from tests_ha.conftest import add_kitchen_light, chat_session_of

AGENT = "conversation.fairlane"
ROUNDS = 4


async def _turn(hass: HomeAssistant, text: str) -> tuple[float, float, str]:
    first: list[float] = []

    def listener(_log: conversation.ChatLog, delta: dict[str, Any]) -> None:
        if delta.get("content") and not first:
            first.append(time.perf_counter())

    start = time.perf_counter()
    with (
        chat_session_of(hass) as session,
        conversation.async_get_chat_log(hass, session, None, chat_log_delta_listener=listener),
    ):
        result = await conversation.async_converse(
            hass, text, session.conversation_id, Context(), agent_id=AGENT,
            device_id="kitchen-satellite",
        )
    end = time.perf_counter()
    speech = result.response.speech.get("plain", {}).get("speech", "")
    return (first[0] if first else end) - start, end - start, speech


async def test_bench_assist_turns(hass: HomeAssistant, entry: MockConfigEntry) -> None:
    await add_kitchen_light(hass)
    client = entry.runtime_data.client
    rows = []
    for label, texts in (
        ("light on/off (Assist tools)",
         ["Turn on the kitchen light", "Turn off the kitchen light"]),
        ("question (Assist tools offered)", ["What is the capital of France?"]),
    ):
        firsts, totals, calls, worked = [], [], [], 0
        for i in range(ROUNDS):
            text = texts[i % len(texts)]
            before = (await client.stats())["classes"]["voice"]["requests"]
            first, total, _speech = await _turn(hass, text)
            after = (await client.stats())["classes"]["voice"]["requests"]
            firsts.append(first)
            totals.append(total)
            calls.append(after - before)
            state = hass.states.get("light.kitchen_light").state
            worked += ("turn on" in text.lower() and state == "on") or (
                "turn off" in text.lower() and state == "off"
            ) or "light" not in text.lower()
        rows.append((label, statistics.median(firsts), statistics.median(totals),
                     statistics.mean(calls), worked))
    stats = await client.stats()
    print(f"\n{'turn':34} {'first words':>12} {'whole turn':>11} {'model calls':>12} {'done':>5}")
    for label, first, total, n_calls, worked in rows:
        print(f"{label:34} {first:10.2f} s {total:9.2f} s {n_calls:12.1f} {worked:>3}/{ROUNDS}")
    voice = stats["classes"]["voice"]
    ttft, itl = voice["ttft_ms"], voice["itl_ms"]
    print(f"server, voice lane: TTFT p50 {ttft['p50']} ms, p95 {ttft['p95']} ms; "
          f"ITL p50 {itl['p50']} ms; device busy {stats['device']['busy']:.0%}")
