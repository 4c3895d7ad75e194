"""The random-weight models of the GPU evidence (scripts/random-gguf.py): llama.cpp loads them,
they tokenize and template prompts exactly as the real model they copy the tokenizer of, and
one prefill and one decode step run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from fairlane.engines import models
from fairlane.engines.chat_template import ChatTemplate
from fairlane.engines.llm import EngineConfig, LlamaEngine, SamplingParams
from fairlane.policy import Chunk, LlmPlan, Priority

ROOT = Path(__file__).resolve().parents[1]
SENTENCE = "The boiler is serviced every October; the pressure should read 1.5 bar."


def test_a_tiny_random_model_runs_and_tokenizes_like_the_real_one(tmp_path: Path) -> None:
    real = models.resolve_llm(models.DEFAULT_LLM)
    script = ROOT / "scripts" / "random-gguf.py"
    tokenizer = tmp_path / "tokenizer.json.gz"
    subprocess.run([sys.executable, str(script), "--export-tokenizer", str(tokenizer),
                    "--from", str(real)], check=True)
    assert tokenizer.stat().st_size < 4 * 1024 * 1024  # small enough to carry
    model = tmp_path / "tiny.gguf"
    subprocess.run([sys.executable, str(script), "--shape", "tiny", "--tokenizer",
                    str(tokenizer), str(model)], check=True)

    random = LlamaEngine(EngineConfig(model, n_ctx=512, n_seq_max=2, n_threads=1))
    original = LlamaEngine(EngineConfig(real, n_ctx=512, n_seq_max=2, n_threads=1))
    try:
        assert random.tokenize(SENTENCE) == original.tokenize(SENTENCE)
        template = random.metadata("tokenizer.chat_template")
        assert template == original.metadata("tokenizer.chat_template")
        prompt = random.tokenize(
            ChatTemplate(template, random.bos_text, random.eos_text).render(
                [{"role": "user", "content": SENTENCE}]
            )
        )
        random.add("a", prompt, SamplingParams(max_tokens=4, temperature=0))
        plan = LlmPlan((Chunk("a", 0, len(prompt), True, False, Priority.CHAT),), (), 0.0, 0)
        _, events = random.execute(plan)
        step = LlmPlan((Chunk("a", len(prompt), 1, True, True, Priority.CHAT),), (), 0.0, 0)
        _, more = random.execute(step)
        assert events and more  # a token each step: the random weights run
    finally:
        random.close()
        original.close()
