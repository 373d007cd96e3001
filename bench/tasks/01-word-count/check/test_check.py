"""Hidden check: the word counter treats any run of whitespace as one separator."""

import pytest

from textstats.words import average_word_length, count_words, longest_word


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("the quick brown fox", 4),
        ("one\ntwo\tthree", 3),
        ("", 0),
        ("   ", 0),
        ("\n\n", 0),
        ("  padded   words  ", 2),
        ("single", 1),
        ("line one\r\nline two\n", 4),
    ],
)
def test_count_words(text, expected):
    assert count_words(text) == expected


def test_longest_word_unchanged():
    assert longest_word("a bb ccc dd eee") == "ccc"
    assert longest_word("") == ""


def test_average_word_length():
    assert average_word_length("ab  abcd") == 3.0
    assert average_word_length("x\ny\n\nzzz ") == pytest.approx(5 / 3)
    assert average_word_length(" ") == 0.0
