"""Interactive first, on the real engine: a chat turn overtakes a long background prefill."""

from __future__ import annotations

import threading
import time

import openai
import pytest

from fairlane.policy import Priority
from fairlane.server import BackgroundServer
from tests.server.conftest import TOKEN, server_config

MANUAL = (
    "The dishwasher has three programmes. Eco washes at 45 degrees and takes three hours; "
    "Quick washes at 55 degrees in forty minutes; Intensive reaches 70 degrees for pans. "
    "Clean the filter every month and refill the rinse aid when the light is on. "
)
LONG_PROMPT = "Summarise this appliance manual for the family:\n" + MANUAL * 30  # ~1,400 tokens


def _chat_first_token_vs_background_prefill(policy: str) -> tuple[float, float]:
    with BackgroundServer(server_config(policy)) as server:
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
        deadline = time.monotonic() + 60
        while not device.records and time.monotonic() < deadline:  # its prefill has begun
            time.sleep(0.005)
        assert any(r.priority is Priority.BACKGROUND for r in device.policy.running.values())

        stream = client.chat.completions.create(
            model="x", messages=[{"role": "user", "content": "Say hello."}], max_tokens=3,
            stream=True, extra_body={"fairlane_class": "chat"},
        )
        first_token = None
        for chunk in stream:
            if first_token is None and chunk.choices and chunk.choices[0].delta.content:
                first_token = time.monotonic()
        thread.join(timeout=300)
        background_id = result["id"]
        prefill_steps = [
            r for r in device.records
            if background_id in r.request_ids and background_id not in r.decodes
        ]
        assert first_token is not None
        return first_token, max(r.end for r in prefill_steps)


@pytest.mark.model
def test_chat_gets_its_first_token_before_the_background_prefill_completes() -> None:
    first_token, prefill_done = _chat_first_token_vs_background_prefill("fairlane")
    assert first_token < prefill_done


@pytest.mark.model
def test_with_fcfs_the_chat_turn_waits_for_the_whole_background_prefill() -> None:
    first_token, prefill_done = _chat_first_token_vs_background_prefill("fcfs")
    assert first_token > prefill_done
