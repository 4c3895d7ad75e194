"""What a grammar costs a decode step: the engine's way (the free choice checked against the
grammar, the vocabulary masked only when it is refused) against masking every step (llama.cpp's
grammar-first chain, what the engine did before), on the default model, one sequence.

    .venv/bin/python scripts/grammar-steps.py [--rounds 4]

Each round runs the same two replies under each way, interleaved (A B A B): a JSON-mode answer
(`json_object`) and a tool call under its tools' grammar (`tool_choice` required). Prints each
round's median step (decode + sampling) and the ratio. Nothing else should run meanwhile.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid

from fairlane.api.response_format import llama_grammar
from fairlane.api.tool_calls import tool_call_grammar
from fairlane.engines import llm, models, sampling
from fairlane.engines.chat_template import ChatTemplate
from fairlane.policy import Chunk, LlmPlan, Priority

TOOLS = [{"type": "function", "function": {
    "name": "HassTurnOn", "description": "Turns on a device",
    "parameters": {"type": "object", "properties": {
        "name": {"type": "string"}, "area": {"type": "string"},
        "domain": {"type": "array", "items": {"type": "string", "enum": ["light", "switch"]}}}}}}]


def reply_steps(engine: llm.LlamaEngine, prompt: list[int], grammar: str) -> list[float]:
    """Each decode step's seconds for one greedy reply under `grammar`."""
    engine.add("g", prompt, llm.SamplingParams(max_tokens=48, temperature=0, grammar=grammar))
    try:
        _, events = engine.execute(
            LlmPlan((Chunk("g", 0, len(prompt), True, False, Priority.CHAT),), (), 0.0, 0))
        steps = []
        while not events[-1].finish_reason:
            seq = engine.sequences["g"]
            start = time.perf_counter()
            _, events = engine.execute(LlmPlan(
                (Chunk("g", len(seq.tokens) - 1, 1, True, True, Priority.CHAT),), (), 0.0, 0))
            steps.append(time.perf_counter() - start)
        return steps
    finally:
        engine.release("g")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    engine = llm.LlamaEngine(llm.EngineConfig(models.resolve_llm(models.DEFAULT_LLM),
                                              n_ctx=2048, n_seq_max=1, n_batch=512))
    template = ChatTemplate(engine.metadata("tokenizer.chat_template"), engine.bos_text,
                            engine.eos_text)
    tool_grammar, _ = tool_call_grammar(TOOLS, "required", engine.grammar_parses)
    assert tool_grammar is not None
    cases = {
        "json_object": (str(llama_grammar.JSON_GBNF), None, "Describe Paris as a JSON object."),
        "tool call": (tool_grammar, TOOLS, "Turn on the kitchen light."),
    }
    checked_first = sampling.Candidates.allows

    def never(self: sampling.Candidates, grammar: object, token: int) -> bool:
        return False  # every step masks the whole vocabulary, as the grammar-first chain did

    print(f"{'case':12} {'round':>5} {'mask every step ms':>19} {'checked first ms':>17} "
          f"{'ratio':>6}")
    for case, (grammar, tools, ask) in cases.items():
        ratios = []
        for round_ in range(args.rounds + 1):  # round 0 warms both up, and is not printed
            medians = {}
            for way in ("mask", "check"):
                sampling.Candidates.allows = never if way == "mask" else checked_first  # type: ignore[method-assign]
                text = template.render(
                    [{"role": "user", "content": f"({uuid.uuid4().hex[:8]}) {ask}"}], tools)
                medians[way] = statistics.median(reply_steps(engine, engine.tokenize(text),
                                                             grammar)) * 1000
            sampling.Candidates.allows = checked_first  # type: ignore[method-assign]
            if round_:
                ratios.append(medians["mask"] / medians["check"])
                print(f"{case:12} {round_:5} {medians['mask']:19.1f} {medians['check']:17.1f} "
                      f"{ratios[-1]:6.2f}")
        print(f"{case:12} ratio min / median / max: {min(ratios):.2f} / "
              f"{statistics.median(ratios):.2f} / {max(ratios):.2f}")
    engine.close()


if __name__ == "__main__":
    main()
