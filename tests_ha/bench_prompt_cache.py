"""How much of each turn's prompt the server finds in its prefix cache, for turns 5–30 s apart
(a benchmark, not a test).

    .venv-ha/bin/pytest -c tests_ha/pytest.ini tests_ha/bench_prompt_cache.py -s

Home Assistant writes the time, to the second, into the system prompt when the agent's LLM API
offers no clock tool (a third-party tool pack; any agent on releases before the `GetDateTime`
tool). The chat template writes the tools after the system prompt, so everything after the
time is new to the cache on every turn. The agent moves the time to the newest user message
(`stable_first`). Two agents' set-ups, each with that move on and off, separated by 5–30 s of
real time (so the clock in the prompt really changes). The conditions run in blocks, not
alternating: what is measured is the cache's content, and two prompt layouts taking turns
would evict each other's entries (a household runs one of them), so each block starts with a
warm-up turn of its own:

- **Assist** (this release offers `GetDateTime`, so no time is written);
- **a household tool pack** without a clock tool (three tools), where the time is written.

Per turn: the first model call's prompt tokens and cached tokens (from the server's `usage`).
Not collected by `make test` (the name does not start with `test_`).
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import uuid
from collections.abc import AsyncIterator
from typing import Any

import voluptuous as vol
from homeassistant.components import conversation
from homeassistant.const import CONF_LLM_HASS_API
from homeassistant.core import Context, HomeAssistant
from homeassistant.helpers import llm
from homeassistant.util.json import JsonObjectType
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.fairlane import entity as fairlane_entity
from tests_ha.conftest import add_kitchen_light, set_agent

AGENT = "conversation.fairlane"
GAPS_S = (5, 12, 20, 30, 8, 25)  # between consecutive turns of one condition
QUESTIONS = (
    "Is the kitchen light on?",
    "What should I cook tonight?",
    "How warm is it in the living room?",
    "When was the boiler serviced?",
    "Is the front door locked?",
    "What is on the calendar tomorrow?",
)


class _Lookup(llm.Tool):
    def __init__(self, name: str, description: str) -> None:
        self.name = name
        self.description = description
        self.parameters = vol.Schema({vol.Required("query"): str})

    async def async_call(
        self, hass: HomeAssistant, tool_input: llm.ToolInput, llm_context: llm.LLMContext
    ) -> JsonObjectType:
        return {"result": "nothing found"}


class HouseholdTools(llm.API):
    """A tool pack like the community's: its own prompt and tools, no clock tool."""

    async def async_get_api_instance(self, llm_context: llm.LLMContext) -> llm.APIInstance:
        rooms = "".join(
            f"- {room}: light, thermostat, window sensor\n"
            for room in ("kitchen", "living room", "bedroom", "hallway", "office", "garage")
        )
        return llm.APIInstance(
            api=self,
            api_prompt="Use the household tools to answer. The rooms:\n" + rooms,
            llm_context=llm_context,
            tools=[
                _Lookup("SearchDocuments", "Search the household's documents and manuals"),
                _Lookup("ReadCalendar", "Read the family calendar for a day"),
                _Lookup("GetWeather", "The weather forecast for a day"),
            ],
        )


def _commit() -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, check=False).stdout.strip()


async def _turn(hass: HomeAssistant, text: str, usages: list[dict[str, Any]]) -> dict[str, Any]:
    before = len(usages)
    await conversation.async_converse(
        hass, text, uuid.uuid4().hex, Context(), agent_id=AGENT, device_id="kitchen-satellite"
    )
    return usages[before]  # the turn's first model call


async def test_bench_prompt_cache(hass: HomeAssistant, entry: MockConfigEntry) -> None:
    await add_kitchen_light(hass)
    llm.async_register_api(hass, HouseholdTools(hass=hass, id="household", name="Household tools"))
    client = entry.runtime_data.client
    usages: list[dict[str, Any]] = []
    plain_stream = client.chat_stream

    async def chat_stream(body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        body = {**body, "stream_options": {"include_usage": True}}
        async for chunk in plain_stream(body):
            if chunk.get("usage"):
                usages.append(chunk["usage"])
            yield chunk

    client.chat_stream = chat_stream  # type: ignore[method-assign]
    moving = fairlane_entity.stable_first
    rows: list[tuple[str, str, int, float]] = []
    for api in (llm.LLM_API_ASSIST, "household"):
        await set_agent(hass, entry, **{CONF_LLM_HASS_API: [api]})
        client = entry.runtime_data.client
        plain_stream = client.chat_stream
        client.chat_stream = chat_stream  # type: ignore[method-assign]
        for condition in ("moved", "in place"):
            fairlane_entity.stable_first = moving if condition == "moved" else (lambda m: m)
            await _turn(hass, "Hello", usages)  # warm-up
            for i, gap in enumerate(GAPS_S):
                await asyncio.sleep(gap)
                usage = await _turn(hass, QUESTIONS[i], usages)
                cached = usage["prompt_tokens_details"]["cached_tokens"]
                share = cached / usage["prompt_tokens"]
                rows.append((api, condition, usage["prompt_tokens"], share))
                print(f"{api:9} {condition:8} after {gap:2d} s: {cached:5d} of "
                      f"{usage['prompt_tokens']:5d} prompt tokens cached ({share:.0%})", flush=True)
    fairlane_entity.stable_first = moving
    print(f"\ncommit {_commit()}; first model call of each turn, turns {min(GAPS_S)}–"
          f"{max(GAPS_S)} s apart")
    print(f"{'LLM API':10} {'time in the prompt':20} {'turns':>6} {'cached p50':>11} "
          f"{'min':>6} {'prompt tokens':>14}")
    for api in (llm.LLM_API_ASSIST, "household"):
        for condition in ("moved", "in place"):
            mine = [r for r in rows if r[0] == api and r[1] == condition]
            shares = [r[3] for r in mine]
            print(f"{api:10} {condition:20} {len(mine):>6} {statistics.median(shares):>10.0%} "
                  f"{min(shares):>6.0%} {statistics.median(r[2] for r in mine):>14.0f}")
