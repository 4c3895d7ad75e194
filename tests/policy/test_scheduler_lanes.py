"""How the background lanes share the device when nobody is talking."""

from __future__ import annotations

from fairlane.policy import EmbedPlan, LlmPlan
from tests.policy.helpers import BACKGROUND, embed, llm, make, step


def test_documents_are_indexed_while_summaries_run() -> None:
    """Found by `bench family`: a document to index waited 22 s behind two summaries' long
    prompts (background lanes were ranked LLM first, always). Background lanes now take the
    device by least recent device time, so the embedding lane runs within a few steps."""
    policy = make()
    for i in range(2):
        policy.add(llm(f"summary{i}", BACKGROUND, client="summaries", prompt=20_000), 0.0)
    plan, _, now = step(policy, 0.0)
    assert isinstance(plan, LlmPlan)
    for i in range(4):
        policy.add(embed(f"chunk{i}", tokens=256, client="documents"), now)
    kinds = []
    for _ in range(3):
        plan, _, now = step(policy, now)
        kinds.append(type(plan))
    assert EmbedPlan in kinds
    # ... and the summaries are not starved by a long document backlog either.
    for i in range(4, 400):
        policy.add(embed(f"chunk{i}", tokens=256, client="documents"), now)
    kinds = []
    for _ in range(20):
        plan, _, now = step(policy, now)
        kinds.append(type(plan))
    assert kinds.count(LlmPlan) >= 5 and kinds.count(EmbedPlan) >= 5
