"""The load `fairlane bench family` plays: prompts of a given size, each unique (a nonce first)
unless the workload shares a prefix, and the recordings of the spoken commands."""

from __future__ import annotations

import random
import uuid
from pathlib import Path

from fairlane.engines import models
from fairlane.policy import Kind
from fairlane.sim.workload import Job, Workload

_HOUSEHOLD = (
    "kitchen light lamp door window heating boiler garden evening morning family dinner "
    "school music timer weather garage hallway bedroom water washing dishes shopping list "
    "calendar reminder holiday trip bread milk coffee energy battery solar meter sensor "
    "motion camera alarm doorbell blinds curtain fan oven fridge freezer dryer robot vacuum "
    "plant tomato sprinkler lawn bike car charger parcel letter bill insurance doctor dentist"
)
WORDS = tuple(_HOUSEHOLD.split(" "))
COUNT = " Then count from 1 to 1000, separated by commas."



class Prompts:
    """Texts of an exact token count for the default model (its tokenizer, no weights)."""

    def __init__(self, seed: int = 0) -> None:
        from fairlane.engines.native import import_llama_cpp

        self._llama = import_llama_cpp().Llama(
            str(models.resolve_llm(models.DEFAULT_LLM)), vocab_only=True, verbose=False
        )
        self._rng = random.Random(seed)
        self._prefixes: dict[tuple[str, int], str] = {}

    def tokens(self, text: str) -> int:
        return len(self._llama.tokenize(text.encode(), add_bos=False, special=False))

    def filler(self, count: int, rng: random.Random) -> str:
        """About `count` tokens of household words (each word one token or two)."""
        if count <= 0:
            return ""
        words = [rng.choice(WORDS) for _ in range(count)]
        text = " ".join(words)
        while self.tokens(text) > count and len(words) > 1:
            words = words[: max(1, len(words) * count // self.tokens(text) - 1)]
            text = " ".join(words)
        return text

    def prefix(self, group: str, count: int) -> str:
        """The system prompt every request of `group` shares (Home Assistant's, for voice)."""
        key = (group, count)
        if key not in self._prefixes:
            head = "You are the voice assistant of a household. Devices: "
            body = self.filler(count - self.tokens(head), random.Random(group))
            self._prefixes[key] = head + body
        return self._prefixes[key]

    def messages(self, job: Job, said: str = "") -> list[dict[str, str]]:
        """The job's turn: its shared prefix, then a nonce and unique words, then the ask."""
        rng = random.Random(self._rng.random())
        nonce = f"[{uuid.uuid4().hex[:12]}] "
        unique = job.prompt_tokens - job.prefix_tokens - self.tokens(nonce + said + COUNT)
        user = nonce + (said + ". " if said else "") + self.filler(unique, rng) + COUNT
        turn = [{"role": "user", "content": user}]
        if job.prefix_tokens:
            return [{"role": "system", "content": self.prefix(job.group, job.prefix_tokens)}, *turn]
        return turn

    def chunks(self, jobs: tuple[Job, ...]) -> list[str]:
        """A document's chunks, one text per embedding job, each its drawn size."""
        rng = random.Random(self._rng.random())
        nonce = uuid.uuid4().hex[:12]
        return [f"{nonce} {self.filler(job.prompt_tokens - 8, rng)}" for job in jobs]


def recordings(workload: Workload, audio_dir: Path | None) -> dict[int, bytes]:
    """Each spoken command's recording (by the job's identity): the workload's own, or else
    the folder's files in turn."""
    files = sorted(audio_dir.glob("*.wav")) if audio_dir else []
    recordings: dict[int, bytes] = {}
    spoken = [job for job in workload.jobs if job.kind is Kind.STT]
    for index, job in enumerate(spoken):
        if job.audio_file is None and not files:
            raise ValueError("the workload's spoken commands need recordings: --audio-dir")
        path = Path(job.audio_file) if job.audio_file else files[index % len(files)]
        recordings[id(job)] = path.read_bytes()
    return recordings
