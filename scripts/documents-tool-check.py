"""How the household documents tool behaves with the default models: the figures behind
`DOCUMENTS_RELEVANT`, `search_first` and the tool result's instructions
(custom_components/fairlane/llm_api.py). Not a timing: the numbers are similarity scores and
counts of what the model did, so the load on the machine does not change them.

    .venv/bin/python scripts/documents-tool-check.py

1. Similarity of the best passage for household questions and for other turns (commands,
   small talk, general questions), from the server's own search.
2. How often the model calls the search tool for household questions, given the tool and the
   API's prompt alone (each question with 4 different times of day in the prompt, as Home
   Assistant writes it).
3. What the model does after a search result, with and without the result's instructions,
   with no tools offered (as `search_first` leaves it).
"""

from __future__ import annotations

import ast
import json
import random
import sys
import time
from pathlib import Path

import openai

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.server.conftest import TOKEN, server_config
from tests.server.test_chat_api import http

from fairlane.server import BackgroundServer

DOCUMENTS = {
    "Dishwasher warranty": "Warranty certificate for the Bosch dishwasher bought in March "
    "2024. The warranty ends on 14 March 2029 and covers parts and labour.",
    "Boiler service": "The boiler is serviced every October by Hughes Heating. The pressure "
    "gauge should read between 1 and 1.5 bar.",
    "School trip": "The class trip to the science museum is on Friday. Children need a packed "
    "lunch and a raincoat.",
    "Bins": "Bin collection: the green recycling bin goes out on Tuesday evenings, the black "
    "bin every other Friday.",
}
HOUSEHOLD = [
    "When does the dishwasher warranty end?", "How often is the boiler serviced?",
    "What do the children need for the school trip?", "Which bin goes out this week?",
    "What pressure should the boiler have?",
]
OTHER = [
    "Turn on the kitchen light", "What is the capital of France?", "Set a timer for ten minutes",
    "What's the weather like?", "Tell me a joke", "Is the front door locked?",
    "Play some music in the living room", "How many days until Christmas?",
    "Turn off all the lights downstairs",
]
HA_PROMPT = ("You are a voice assistant for Home Assistant.\nAnswer questions about the world "
             "truthfully.\nAnswer in plain text. Keep it simple and to the point.\n")
TOOL = {"type": "function", "function": {
    "name": "search_household_documents",
    "description": "Search the household's documents (manuals, warranties, letters, notes) and "
    "return the passages that best answer the query, with the title of each document.",
    "parameters": {"type": "object", "required": ["query"], "properties": {
        "query": {"type": "string", "description": "What to look for, in a few words"}}},
}}


def moment(rng: random.Random) -> str:
    return (f"(Current time is {rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:"
            f"{rng.randint(0, 59):02d}. Today's date is 2026-12-0{rng.randint(1, 9)}.)")


def integration_text(name: str) -> str:
    """A string constant of the integration's llm_api.py (it needs Home Assistant to import,
    which the server's environment does not have)."""
    source = Path(__file__).resolve().parents[1] / "custom_components/fairlane/llm_api.py"
    for node in ast.parse(source.read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == name:
            return str(ast.literal_eval(node.value))
    raise KeyError(name)


def main() -> None:
    prompt, answer_from_passages = integration_text("PROMPT"), integration_text(
        "ANSWER_FROM_PASSAGES"
    )
    rng = random.Random(7)
    with BackgroundServer(server_config()) as server:
        for title, text in DOCUMENTS.items():
            http(server, "POST", "/v1/documents", {"text": f"# {title}\n{text}", "title": title})
        time.sleep(5)  # indexing runs in the background lane
        print("1. best passage's similarity")
        for group, questions in (("household", HOUSEHOLD), ("other", OTHER)):
            scores = []
            for question in questions:
                _, found = http(server, "POST", "/v1/documents/search",
                                {"query": question, "top_k": 1})
                scores.append(found["data"][0]["score"])
                print(f"   {group:9} {scores[-1]:.3f}  {question}")
            print(f"   {group}: {min(scores):.2f}-{max(scores):.2f}")

        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=TOKEN, max_retries=0)
        calls = total = 0
        for question in HOUSEHOLD:
            for _ in range(4):
                messages = [{"role": "system", "content": HA_PROMPT + prompt},
                            {"role": "user", "content": f"{question}\n\n{moment(rng)}"}]
                reply = client.chat.completions.create(model="x", messages=messages,
                                                       tools=[TOOL], temperature=0, max_tokens=60)
                calls += bool(reply.choices[0].message.tool_calls)
                total += 1
        print(f"2. the model called the tool for {calls} of {total} household questions")

        _, found = http(server, "POST", "/v1/documents/search",
                        {"query": HOUSEHOLD[0], "top_k": 3})
        results = [{"document": h["title"], "passage": h["text"]} for h in found["data"]]
        print("3. after the search result (no tools offered):")
        for label, content in (("results only", {"results": results}),
                               ("with instructions", {"results": results,
                                                      "instructions": answer_from_passages})):
            answers = []
            for _ in range(4):
                call = {"id": "c1", "type": "function", "function": {
                    "name": "search_household_documents",
                    "arguments": json.dumps({"query": HOUSEHOLD[0]})}}
                messages = [{"role": "system", "content": HA_PROMPT + prompt},
                            {"role": "user", "content": f"{HOUSEHOLD[0]}\n\n{moment(rng)}"},
                            {"role": "assistant", "content": "", "tool_calls": [call]},
                            {"role": "tool", "tool_call_id": "c1", "content": json.dumps(content)}]
                reply = client.chat.completions.create(model="x", messages=messages,
                                                       temperature=0, max_tokens=60)
                answers.append(reply.choices[0].message.content or "")
            right = sum("2029" in a and "search_household_documents" not in a for a in answers)
            print(f"   {label}: {right} of 4 answered from the passage; e.g. {answers[0][:70]!r}")


if __name__ == "__main__":
    main()
