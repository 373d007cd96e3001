"""The n-gram prompt-lookup drafter against a brute-force search, and its incremental indexing."""

from __future__ import annotations

import numpy as np
import pytest

from engine.spec.ngram import NgramDrafter


def brute_force(tokens: list[int], num_draft: int, max_ngram: int, min_ngram: int) -> list[int]:
    """The specification: longest tail first, latest earlier occurrence with a token after it."""
    for n in range(min(max_ngram, len(tokens) - 1), min_ngram - 1, -1):
        tail = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start : start + n] == tail:
                return tokens[start + n : start + n + num_draft]
    return []


def test_copies_what_followed_the_latest_occurrence() -> None:
    drafter = NgramDrafter(max_ngram=3, min_ngram=1)
    #          0  1  2  3  4  5  6  7  8  9 10
    tokens = [5, 6, 7, 8, 1, 5, 6, 7, 9, 2, 6, 7]
    # the tail (6, 7) occurs at 1 and at 6: the later one is followed by 9, 2
    assert drafter.propose(tokens, 2).tokens == [9, 2]
    # the 3-gram (5, 6, 7) at 5 beats shorter matches
    assert drafter.propose([*tokens, 3, 5, 6, 7], 3).tokens == [9, 2, 6]


def test_nothing_to_propose() -> None:
    drafter = NgramDrafter(max_ngram=4, min_ngram=2)
    assert drafter.propose([1, 2, 3, 4, 5], 4).tokens == []  # no repeated pair
    assert drafter.propose([1, 2, 3, 4, 5, 1], 4).tokens == []  # a single token does not count with min_ngram 2
    assert drafter.propose([1, 2, 1, 2], 0).tokens == []
    assert drafter.propose([7], 3).tokens == []


def test_draft_stops_at_the_end_of_the_sequence() -> None:
    drafter = NgramDrafter(max_ngram=2, min_ngram=2)
    # (1, 2) occurs at 0; what follows it runs into the tail itself and stops at the end
    assert drafter.propose([1, 2, 3, 1, 2], 8).tokens == [3, 1, 2]


@pytest.mark.parametrize("seed", range(6))
def test_matches_brute_force_while_the_sequence_grows(seed: int) -> None:
    rng = np.random.default_rng(seed)
    drafter = NgramDrafter(max_ngram=4, min_ngram=1 + seed % 2)
    tokens = [int(t) for t in rng.integers(0, 6, size=20)]
    drafter.start(tokens)
    for _ in range(60):
        tokens.extend(int(t) for t in rng.integers(0, 6, size=int(rng.integers(1, 4))))
        num_draft = int(rng.integers(1, 6))
        expected = brute_force(tokens, num_draft, drafter.max_ngram, drafter.min_ngram)
        assert drafter.propose(tokens, num_draft).tokens == expected


def test_reindexes_a_sequence_that_is_not_an_extension() -> None:
    drafter = NgramDrafter(max_ngram=2, min_ngram=2)
    assert drafter.propose([1, 2, 3, 1, 2], 1).tokens == [3]
    # same length history, different content: the drafter must not keep the old index
    assert drafter.propose([4, 5, 6, 4, 5], 1).tokens == [6]
    assert drafter.propose([4, 5, 9], 1).tokens == []


def test_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="min_ngram"):
        NgramDrafter(max_ngram=2, min_ngram=3)
    with pytest.raises(ValueError, match="num_draft"):
        NgramDrafter().propose([1, 2], -1)
