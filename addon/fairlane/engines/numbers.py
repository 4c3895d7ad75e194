"""Numbers as words: shared by the voice's text front end and the word error rate."""

from __future__ import annotations

ONES = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
]
TENS = ["_", "_", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
_SCALES = ((1_000_000_000, "billion"), (1_000_000, "million"), (1_000, "thousand"))


def number_words(n: int) -> str:
    """21 → "twenty one"; 1905 → "one thousand nine hundred five"."""
    if n < 0:
        return "minus " + number_words(-n)
    if n < 20:
        return ONES[n]
    if n < 100:
        tens, ones = divmod(n, 10)
        return TENS[tens] + (f" {ONES[ones]}" if ones else "")
    if n < 1000:
        hundreds, rest = divmod(n, 100)
        return f"{ONES[hundreds]} hundred" + (f" {number_words(rest)}" if rest else "")
    for scale, name in _SCALES:
        if n >= scale:
            high, rest = divmod(n, scale)
            return f"{number_words(high)} {name}" + (f" {number_words(rest)}" if rest else "")
    raise AssertionError("unreachable")
