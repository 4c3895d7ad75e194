"""The speech-synthesis engine: a Piper (VITS) voice on ONNX Runtime, one batch per planned step.

Piper voices are trained on eSpeak NG's phonemes, and eSpeak NG is GPL-3.0; Fairlane's default
install stays Apache-2.0-compatible, so the text is turned into phonemes here instead:

    text → `normalize` (numbers, times, symbols as words) → `split_sentences` (each sentence is
    one bounded unit of work) → words → the pronunciation lexicon (misaki's US gold and silver
    dictionaries, Apache-2.0, 183k entries) with English suffix rules and a letter-by-letter
    fallback → misaki's phoneme symbols rewritten as the eSpeak IPA the voice knows → ids.

A step synthesises the sentences the scheduler planned, one ONNX call each. Piper's exported
VITS graph takes a padded batch but returns no per-sentence lengths, and a shorter sentence's
padded tail comes back as low noise, not silence, so it cannot be cut reliably; on this CPU a
padded batch of four sentences also took longer (0.81 s) than the four one by one (0.55 s). So
`policy.tts_max_batch` is 1 by default: each sentence is its own short step, and the voice lane
interleaves them with the LLM's iterations.
"""

from __future__ import annotations

import io
import json
import re
import time
import wave
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from fairlane.engines.numbers import ONES, number_words
from fairlane.engines.placement import onnx_placement, onnx_session_options
from fairlane.policy import SeqOutput, StepResult, TtsPlan

MAX_SENTENCE_CHARS = 240  # a longer sentence is cut at a comma or a space: one step stays short
MAX_INPUT_CHARS = 4096  # OpenAI's limit for /v1/audio/speech input
SENTENCE_PAUSE_S = 0.2  # silence after each sentence: without it, sentences run together


class TextError(ValueError):
    """Text that cannot be spoken (empty, too long, unknown voice); the message says why."""


# --- text normalisation --------------------------------------------------------------------

MAX_NUMBER_DIGITS = 12  # up to hundreds of billions in words; longer numbers digit by digit


def _decimal(match: re.Match[str]) -> str:
    whole, _, fraction = match.group(0).replace(",", "").partition(".")
    if len(whole) > MAX_NUMBER_DIGITS:
        # An account or serial number, read as its digits: in words, each group of a
        # 300-digit number repeats "billion" up to 33 times (the text grew 40-fold).
        spoken = " ".join(ONES[int(d)] for d in whole)
    else:
        spoken = number_words(int(whole)) if whole else "zero"
    if fraction:
        spoken += " point " + " ".join(ONES[int(d)] for d in fraction)
    return f" {spoken} "


def _clock(match: re.Match[str]) -> str:
    hours, minutes = int(match.group(1)), int(match.group(2))
    if minutes == 0:
        return f" {number_words(hours)} o'clock "
    spoken = number_words(minutes) if minutes >= 10 else f"oh {number_words(minutes)}"
    return f" {number_words(hours)} {spoken} "


_SYMBOLS = {
    "%": " percent ",
    "°C": " degrees Celsius ",
    "°F": " degrees Fahrenheit ",
    "°": " degrees ",
    "&": " and ",
    "+": " plus ",
    "=": " equals ",
    "@": " at ",
    "€": " euros ",
    "$": " dollars ",
    "£": " pounds ",
    "/": " slash ",
}
_ABBREVIATIONS = {"mr": "mister", "mrs": "missus", "dr": "doctor", "st": "saint", "vs": "versus"}


def normalize(text: str) -> str:
    """Spell out what a reader would say: numbers, clock times, symbols, abbreviations."""
    text = text.replace("’", "'").replace("“", '"').replace("”", '"')
    text = re.sub(r"\b(\d{1,2}):(\d{2})\b", _clock, text)
    for symbol, spoken in _SYMBOLS.items():
        text = text.replace(symbol, spoken)
    text = re.sub(
        r"\b(" + "|".join(_ABBREVIATIONS) + r")\.",
        lambda m: _ABBREVIATIONS[m.group(1).lower()],
        text,
        flags=re.IGNORECASE,
    )
    text = re.sub(r"(?<![\d.])\d[\d,]*(?:\.\d+)?", _decimal, text)
    return re.sub(r"[ \t]+", " ", text).strip()


def split_sentences(text: str, max_chars: int = MAX_SENTENCE_CHARS) -> list[str]:
    """Sentences (at . ! ? ; : or a line break), each cut to at most `max_chars`."""
    pieces = re.split(r"(?<=[.!?;:])\s+|\n+", text.strip())
    sentences: list[str] = []
    for piece in (p.strip() for p in pieces):
        while len(piece) > max_chars:
            cut = piece.rfind(",", 0, max_chars) + 1 or piece.rfind(" ", 0, max_chars) or max_chars
            sentences.append(piece[:cut].strip())
            piece = piece[cut:].strip()
        if re.search(r"\w", piece):
            sentences.append(piece)
    return sentences


# --- words to phonemes -----------------------------------------------------------------------

# misaki writes diphthongs and affricates as one symbol each; the voice was trained on eSpeak's
# spelling of them.
_TO_ESPEAK = {
    "A": "eɪ",
    "I": "aɪ",
    "W": "aʊ",
    "Y": "ɔɪ",
    "O": "oʊ",
    "ʤ": "dʒ",
    "ʧ": "tʃ",
    "ᵊ": "ə",
}
_LONG = {"i": "iː", "u": "uː", "ɑ": "ɑː", "ɔ": "ɔː"}
_LETTERS = {
    "a": "ˈA",
    "b": "bˈi",
    "c": "sˈi",
    "d": "dˈi",
    "e": "ˈi",
    "f": "ˈɛf",
    "g": "ʤˈi",
    "h": "ˈAʧ",
    "i": "ˈI",
    "j": "ʤˈA",
    "k": "kˈA",
    "l": "ˈɛl",
    "m": "ˈɛm",
    "n": "ˈɛn",
    "o": "ˈO",
    "p": "pˈi",
    "q": "kjˈu",
    "r": "ˈɑɹ",
    "s": "ˈɛs",
    "t": "tˈi",
    "u": "jˈu",
    "v": "vˈi",
    "w": "dˈʌbəljˌu",
    "x": "ˈɛks",
    "y": "wˈI",
    "z": "zˈi",
}
# Words whose dictionary entry is the citation form ("a" as the letter); in a sentence they are
# weak forms.
_WEAK = {"a": "ɐ", "the": "ðə", "to": "tə", "of": "ʌv", "and": "ænd", "an": "ɐn", "for": "fɔɹ"}
_VOICELESS = set("ptkfθsʃʧ")
_SIBILANT = set("szʃʒʧʤ")


def to_espeak(phonemes: str) -> str:
    """misaki's symbols → eSpeak NG's IPA (en-us), which Piper voices are trained on."""
    out = phonemes.replace("ɜɹ", "ɜː").replace("əɹ", "ɚ")
    out = "".join(_TO_ESPEAK.get(ch, ch) for ch in out)
    # Long vowels are marked in eSpeak's en-us, except unstressed at the end of a word
    # ("happy" hˈæpi, "reading" ɹˈiːdɪŋ).
    return re.sub(
        r"[iuɑɔ](?!ː)", lambda m: m.group(0) if m.end() == len(out) else _LONG[m.group(0)], out
    )


class Lexicon:
    """Pronunciations from misaki's US dictionaries (gold first, then silver)."""

    def __init__(self, entries: dict[str, str]) -> None:
        self.entries = entries

    @classmethod
    def load(cls) -> Lexicon:
        return _packaged_lexicon()

    def word(self, word: str) -> str:
        """One word's phonemes (misaki symbols); never fails: unknown words are spelled."""
        return (
            self._lookup(word)
            or self._with_suffix(word)
            or self._compound(word.lower())
            or "".join(_LETTERS.get(ch, "") for ch in word.lower())
        )

    def _lookup(self, word: str) -> str | None:
        return self.entries.get(word) or self.entries.get(word.lower())

    def _with_suffix(self, word: str) -> str | None:
        lower = word.lower()
        for suffix, stems in (
            ("'s", (lower[:-2],)),
            ("s", (lower[:-1],)),
            ("es", (lower[:-2],)),
            ("ies", (lower[:-3] + "y",)),
            ("ed", (lower[:-2], lower[:-1], lower[:-3])),
            ("ing", (lower[:-3], lower[:-3] + "e", lower[:-4])),
            ("ly", (lower[:-2],)),
        ):
            if not lower.endswith(suffix) or len(lower) <= len(suffix) + 1:
                continue
            for stem in stems:
                base = self._lookup(stem)
                if base:
                    return base + _suffix_sound(suffix, base)
        return None

    def _compound(self, word: str) -> str | None:
        """A word made of two dictionary words ("doorbell", "dishwasher")."""
        for cut in range(len(word) - 3, 2, -1):
            head, tail = self._lookup(word[:cut]), self._lookup(word[cut:])
            if head and tail:
                return head + tail.replace("ˈ", "ˌ")
        return None


def _suffix_sound(suffix: str, base: str) -> str:
    last = base.rstrip("ˈˌ")[-1:]
    if suffix in ("s", "'s", "es", "ies"):
        if suffix == "ies":
            return "iz"
        if last in _SIBILANT:
            return "ɪz"
        return "s" if last in _VOICELESS else "z"
    if suffix == "ed":
        if last in "td":
            return "ɪd"
        return "t" if last in _VOICELESS else "d"
    return {"ing": "ɪŋ", "ly": "li"}[suffix]


@lru_cache(maxsize=1)
def _packaged_lexicon() -> Lexicon:
    from importlib.resources import files

    data = files("misaki").joinpath("data")
    entries: dict[str, str] = {}
    for name in ("us_silver.json", "us_gold.json"):  # gold last: it wins
        raw: dict[str, str | dict[str, str | None]] = json.loads(
            data.joinpath(name).read_text(encoding="utf-8")
        )
        for word, value in raw.items():
            spoken = value.get("DEFAULT") if isinstance(value, dict) else value
            if spoken:
                entries[word] = spoken
    return Lexicon(entries)


_WORD = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)?|[,.;:!?\-]")


def phonemize(sentence: str, lexicon: Lexicon) -> str:
    """One normalised sentence → eSpeak IPA, words separated by spaces, punctuation kept."""
    words: list[str] = []
    for token in _WORD.findall(sentence):
        if not token[0].isalpha():
            if words:
                words[-1] += token if token != "-" else ""
            continue
        weak = _WEAK.get(token.lower())
        words.append(to_espeak(weak if weak else lexicon.word(token)))
    return " ".join(words)


# --- the voice -------------------------------------------------------------------------------


@dataclass(frozen=True)
class TtsConfig:
    model_path: Path  # a Piper voice: <name>.onnx with <name>.onnx.json beside it
    threads: int = 1
    device: str = "cpu"  # "cuda": ONNX Runtime's CUDA provider, if installed
    length_scale: float | None = None  # speaking rate (larger: slower); None: the voice's own


@dataclass(frozen=True)
class Speech:
    """One sentence to synthesise."""

    text: str
    ids: tuple[int, ...]
    speed: float = 1.0

    @property
    def phonemes(self) -> int:
        return len(self.ids)


@dataclass(frozen=True)
class AudioEvent:
    """One sentence's audio: 16-bit mono PCM at the voice's sample rate."""

    request_id: str
    pcm: bytes
    sample_rate: int
    finish_reason: str = "stop"


class PiperVoice:
    """A Piper voice: the sentences of a planned step, synthesised one by one."""

    def __init__(self, config: TtsConfig, lexicon: Lexicon | None = None) -> None:
        import onnxruntime as ort

        self.config = config
        meta = json.loads(Path(f"{config.model_path}.json").read_text(encoding="utf-8"))
        self.name = Path(config.model_path).name.removesuffix(".onnx")
        self.sample_rate = int(meta["audio"]["sample_rate"])
        self.language = str(meta.get("language", {}).get("code", "en_US"))
        self.id_map: dict[str, list[int]] = meta["phoneme_id_map"]
        inference = meta.get("inference", {})
        self.scales = (
            float(inference.get("noise_scale", 0.667)),
            float(config.length_scale or inference.get("length_scale", 1.0)),
            float(inference.get("noise_w", 0.8)),
        )
        options = onnx_session_options(config.threads)
        providers = ["CPUExecutionProvider"]
        if config.device.startswith("cuda"):
            providers.insert(0, "CUDAExecutionProvider")
        self.session = ort.InferenceSession(str(config.model_path), options, providers=providers)
        self.placement = onnx_placement("tts", config.device, self.session.get_providers())
        self.lexicon = lexicon or Lexicon.load()
        self.pending: dict[str, Speech] = {}

    @property
    def voices(self) -> list[str]:
        return [self.name]

    def prepare(self, text: str, speed: float = 1.0) -> Speech:
        """One sentence → the voice's phoneme ids (BOS, each phoneme followed by a pad, EOS)."""
        phonemes = phonemize(text, self.lexicon)
        ids = list(self.id_map["^"])
        for symbol in phonemes:
            if symbol in self.id_map:
                ids += self.id_map[symbol] + self.id_map["_"]
        ids += self.id_map["$"]
        return Speech(text, tuple(ids), speed)

    def add(self, request_id: str, speech: Speech) -> None:
        self.pending[request_id] = speech

    def release(self, request_id: str) -> None:
        self.pending.pop(request_id, None)

    def synthesize(self, speech: Speech) -> np.ndarray:
        """One sentence → float32 audio at the voice's sample rate."""
        noise, length, noise_w = self.scales
        inputs = {
            "input": np.array([speech.ids], dtype=np.int64),
            "input_lengths": np.array([speech.phonemes], dtype=np.int64),
            "scales": np.array([noise, length / speech.speed, noise_w], dtype=np.float32),
        }
        audio = np.asarray(self.session.run(None, inputs)[0], dtype=np.float32).reshape(-1)
        pause = np.zeros(int(SENTENCE_PAUSE_S * self.sample_rate / speech.speed), np.float32)
        return np.concatenate([audio, pause])

    def execute(
        self, plan: TtsPlan, clock: Callable[[], float] = time.perf_counter
    ) -> tuple[StepResult, list[AudioEvent]]:
        start = clock()
        ids = list(plan.request_ids)
        events = [
            AudioEvent(rid, pcm16(self.synthesize(self.pending.pop(rid))), self.sample_rate)
            for rid in ids
        ]
        outputs = tuple(SeqOutput(rid, finished=True) for rid in ids)
        return StepResult(clock() - start, outputs), events


def pcm16(audio: np.ndarray) -> bytes:
    return bytes((np.clip(audio, -1.0, 1.0) * 32767).astype("<i2").tobytes())


def wav_bytes(chunks: Iterable[bytes], sample_rate: int) -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(sample_rate)
        for chunk in chunks:
            wav.writeframes(chunk)
    return buffer.getvalue()
