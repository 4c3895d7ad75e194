"""OpenAI embeddings on the packaged MiniLM, planned by the policy in token-budgeted batches."""

from __future__ import annotations

import base64
import threading
import time

import numpy as np
import openai
import pytest

from fairlane.policy import Kind, Priority
from fairlane.server import BackgroundServer
from tests.server.conftest import TOKEN
from tests.server.test_chat_api import QUESTION, http
from tests.server.test_speech import FIXTURES

HOUSEHOLD = {
    "dishwasher": "The dishwasher's eco programme washes at 45 degrees and takes three hours.",
    "school": "The school trip to the museum is on Friday; children need a packed lunch.",
    "bread": "Banana bread: mash three ripe bananas, add flour, sugar and bake for an hour.",
    "boiler": "The boiler was serviced in March; the next service is due next spring.",
    "car": "The car insurance renews on the first of June with a new premium.",
}


def client(server: BackgroundServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=TOKEN, max_retries=0)


def test_single_text_and_a_batch_of_500_come_back_normalised_in_order(server) -> None:
    one = client(server).embeddings.create(model="all-minilm-l6-v2", input="Hello, house.")
    vector = np.array(one.data[0].embedding)
    assert vector.shape == (384,) and np.linalg.norm(vector) == pytest.approx(1, abs=1e-4)
    assert one.usage.prompt_tokens > 2

    texts = [f"Note {i}: {list(HOUSEHOLD.values())[i % 5]}" for i in range(500)]
    many = client(server).embeddings.create(model="all-minilm-l6-v2", input=texts)
    assert [d.index for d in many.data] == list(range(500))
    vectors = np.array([d.embedding for d in many.data])
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-4)
    # The same text embeds the same whichever micro-batch it landed in.
    assert np.dot(vectors[0], vectors[5]) > 0.95


def test_base64_encoding_carries_the_same_floats(server) -> None:
    status, floats = http(server, "POST", "/v1/embeddings", {"input": "kitchen light"})
    status, packed = http(server, "POST", "/v1/embeddings",
                          {"input": "kitchen light", "encoding_format": "base64"})
    decoded = np.frombuffer(base64.b64decode(packed["data"][0]["embedding"]), dtype=np.float32)
    # Exactly: the float list is written in float32's shortest form, which reads back as the
    # same float32 values.
    as_float32 = np.array(floats["data"][0]["embedding"], dtype=np.float32)
    assert status == 200 and np.array_equal(decoded, as_float32)


def test_the_nearest_document_answers_the_question(server) -> None:
    keys = list(HOUSEHOLD)
    docs = client(server).embeddings.create(model="x", input=list(HOUSEHOLD.values()))
    matrix = np.array([d.embedding for d in docs.data])
    queries = {"How long does the eco wash take?": "dishwasher",
               "What do the kids need for the museum trip?": "school",
               "When is the heating checked again?": "boiler",
               "How do I bake with old bananas?": "bread"}
    answers = client(server).embeddings.create(model="x", input=list(queries),
                                               extra_body={"fairlane_class": "chat"})
    for (query, expected), item in zip(queries.items(), answers.data, strict=True):
        assert keys[int(np.argmax(matrix @ np.array(item.embedding)))] == expected, query


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"input": []}, "must not be empty"),
        ({"input": ""}, "empty text"),
        ({"input": ["fine", "  "]}, "input.1: empty text"),
        ({"input": 42}, "string or a list of strings"),
        ({"input": [[101, 2023]]}, "string or a list of strings"),
        ({"input": "x", "dimensions": 128}, "cannot shorten"),
        ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
        ({"input": ["x"] * 3000}, "at most 2048"),
        ({}, "input"),
    ],
)
def test_bad_input_gets_a_4xx(server, body, message) -> None:
    status, reply = http(server, "POST", "/v1/embeddings", body)
    assert status == 400 and message in reply["error"]["message"]


def test_chat_during_a_large_ingestion_is_planned_at_the_next_boundary(server) -> None:
    device = server.services.device
    texts = [f"Manual page {i}: " + HOUSEHOLD["boiler"] * 6 for i in range(2000)]
    ingest = threading.Thread(target=lambda: client(server).embeddings.create(model="x",
                                                                              input=texts))
    ingest.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(
        r.kind is Kind.EMBED for r in list(device.records)[-5:]
    ):
        time.sleep(0.005)
    reply = client(server).chat.completions.create(model="x", messages=QUESTION, max_tokens=2)
    command = FIXTURES / "command-06.wav"
    spoken = client(server).audio.transcriptions.create(model="x", file=command.open("rb"))
    ingest.join(timeout=300)
    assert "timer" in spoken.text.lower()
    stt_arrival = [r for r in server.services.telemetry.done if r.kind is Kind.STT][-1].arrival
    stt_step = next(r for r in device.records if r.kind is Kind.STT and r.start >= stt_arrival)
    assert [r for r in device.records if stt_arrival <= r.start < stt_step.start] == []
    assert any(r.kind is Kind.EMBED and r.start > stt_step.end for r in device.records)
    arrival = [r for r in server.services.telemetry.done if r.kind is Kind.LLM][-1].arrival
    records = list(device.records)
    first_chat_step = next(r for r in records if reply.id in r.request_ids)
    assert [r for r in records if arrival <= r.start < first_chat_step.start] == []
    embed_steps = [r for r in records if r.kind is Kind.EMBED]
    assert any(r.start > first_chat_step.end for r in embed_steps)  # ingestion went on
    # Background micro-batches stay within the slice (predicted) while the chat is in flight,
    # so it waits one at most; with nobody talking they may grow to arrival_wait_s (rule 2).
    config = device.policy.config
    chat_end = max(r.end for r in records if reply.id in r.request_ids)
    for r in embed_steps:
        if Priority.BACKGROUND in r.classes and len(r.request_ids) > 1:
            bound = config.slice_s if arrival <= r.start <= chat_end else config.arrival_wait_s
            assert r.predicted_s <= bound + 1e-9


def test_more_texts_than_the_class_queue_holds_is_a_400_not_a_429(server) -> None:
    """Each text waits as one request of its class: 129 texts at class chat could never be
    admitted (its queue holds 128), even on an idle server. Before, a 429 to retry forever."""
    from tests.server.test_chat_api import http

    texts = [f"note {i}" for i in range(129)]
    status, body = http(server, "POST", "/v1/embeddings",
                        {"input": texts, "fairlane_class": "chat"})
    assert status == 400 and body["error"]["code"] == "does_not_fit"
    assert "at most 128 texts" in body["error"]["message"]
    status, body = http(server, "POST", "/v1/embeddings",
                        {"input": texts[:128], "fairlane_class": "chat"})
    assert status == 200 and len(body["data"]) == 128
    status, _ = http(server, "POST", "/v1/embeddings", {"input": texts})  # background
    assert status == 200
