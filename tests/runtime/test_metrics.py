from __future__ import annotations

import pytest

from fairlane.runtime.metrics import jain, normalize_words, percentile, word_error_rate


def test_numbers_and_punctuation_are_normalised_before_counting_words() -> None:
    assert normalize_words("Set it to 21°, please!") == ["set", "it", "to", "twenty", "one",
                                                        "please"]
    assert normalize_words("Dim to 50%") == ["dim", "to", "fifty", "percent"]
    assert word_error_rate(["set a timer for 10 minutes"], ["Set a timer for ten minutes."]) == 0


def test_word_error_rate_counts_substitutions_insertions_and_deletions() -> None:
    assert word_error_rate(["a b c d"], ["a x c"]) == pytest.approx(0.5)  # 1 sub + 1 del
    assert word_error_rate(["a b"], ["a b c"]) == pytest.approx(0.5)  # 1 insertion
    assert word_error_rate(["a b", "c d"], ["a b", "c"]) == pytest.approx(0.25)  # pooled


def test_percentile_and_jain() -> None:
    assert percentile([], 50) is None
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert jain([1, 1, 1]) == 1.0 and jain([1, 0, 0]) == pytest.approx(1 / 3)
