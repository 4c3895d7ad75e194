"""The voice's text front end (numbers, sentences, the lexicon) and the Piper voice itself."""

from __future__ import annotations

import numpy as np
import pytest

from fairlane.engines import models
from fairlane.engines.numbers import number_words
from fairlane.engines.tts import (
    Lexicon,
    PiperVoice,
    TtsConfig,
    normalize,
    phonemize,
    split_sentences,
    to_espeak,
)
from fairlane.voice.synthesis import SentenceBuffer, sentences_of


@pytest.mark.parametrize(
    ("n", "words"),
    [(0, "zero"), (21, "twenty one"), (100, "one hundred"),
     (1905, "one thousand nine hundred five"), (2_000_000, "two million")],
)
def test_number_words(n, words) -> None:
    assert number_words(n) == words


def test_normalize_speaks_numbers_times_and_symbols() -> None:
    assert normalize("It is 21.5°C at 7:05, 80% humid & dry.") == (
        "It is twenty one point five degrees Celsius at seven oh five , eighty percent humid "
        "and dry."
    )
    assert normalize("Dr. Who at 10:00") == "doctor Who at ten o'clock"


def test_sentences_are_split_and_long_ones_cut_at_a_comma() -> None:
    text = "Lights on. Door locked!\nDone"
    assert split_sentences(text) == ["Lights on.", "Door locked!", "Done"]
    long = "word, " * 100
    pieces = split_sentences(long, max_chars=60)
    assert all(len(p) <= 60 for p in pieces) and len(pieces) > 5


def test_streamed_text_yields_each_sentence_once_it_is_complete() -> None:
    buffer = SentenceBuffer()
    assert buffer.add("The lights are ") == []
    assert buffer.add("on. The door") == ["The lights are on."]
    assert buffer.add(" is 3.5 m wide") == []  # a decimal point does not end a sentence
    assert buffer.flush() == ["The door is three point five m wide"]


def test_whole_text_limits() -> None:
    with pytest.raises(ValueError, match="no words"):
        sentences_of(" ?! ")
    with pytest.raises(ValueError, match="limit"):
        sentences_of("a" * 5000)


def test_lexicon_words_suffixes_compounds_and_spelling() -> None:
    lexicon = Lexicon.load()
    assert to_espeak(lexicon.word("kitchen")) == "kˈɪtʃən"
    assert lexicon.word("degrees").endswith("z")  # degree + s, voiced
    assert lexicon.word("xqz") == "ˈɛkskjˈuzˈi"  # no entry, no parts: spelled
    assert "ˌ" in lexicon.word("doorbellwasher")  # two entries joined, the second unstressed
    assert phonemize("Turn on the lights.", lexicon) == "tˈɜːn ˌɔːn ðə lˈaɪts."


def test_the_packaged_voice_verifies_and_speaks() -> None:
    voice = PiperVoice(TtsConfig(models.resolve_voice(models.DEFAULT_VOICE)))
    speech = voice.prepare("The front door is locked.")
    audio = voice.synthesize(speech)
    assert voice.sample_rate == 22050 and 0.6 < audio.size / voice.sample_rate < 3
    assert np.abs(audio).max() > 0.1


def test_a_voice_file_that_is_not_a_voice_is_refused(tmp_path) -> None:
    (tmp_path / "x.onnx").write_bytes(b"nope")
    with pytest.raises(models.ModelError, match=r"onnx\.json"):
        models.resolve_voice(str(tmp_path / "x.onnx"))


def test_a_packaged_voice_whose_digest_differs_is_refused(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("FAIRLANE_MODEL_DIR", str(tmp_path))
    monkeypatch.setitem(models.VOICE_SHA256, models.DEFAULT_VOICE, "0" * 64)
    with pytest.raises(models.ModelError, match="sha256"):
        models.resolve_voice(models.DEFAULT_VOICE)
