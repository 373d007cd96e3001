"""Hidden check: merge_intervals follows its docstring."""

import pytest

from intervals import busy_hours, merge_intervals


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ([], []),
        ([(2, 4)], [(2, 4)]),
        ([(1, 3), (3, 5)], [(1, 5)]),
        ([(1, 3), (4, 5)], [(1, 3), (4, 5)]),
        ([(6, 8), (1, 2), (2, 3)], [(1, 3), (6, 8)]),
        ([(1, 10), (2, 3), (4, 5)], [(1, 10)]),
        ([(5, 5), (5, 5)], [(5, 5)]),
        ([(9, 12), (1, 4), (3, 7), (13, 14)], [(1, 7), (9, 12), (13, 14)]),
        ([(-3, -1), (-1, 2)], [(-3, 2)]),
    ],
)
def test_merge(given, expected):
    assert merge_intervals(given) == expected


def test_input_is_not_modified():
    given = [(6, 8), (1, 2), (2, 3)]
    merge_intervals(given)
    assert given == [(6, 8), (1, 2), (2, 3)]


def test_result_holds_tuples():
    assert all(type(item) is tuple for item in merge_intervals([(3, 4), (1, 2)]))


def test_start_after_end_raises():
    with pytest.raises(ValueError):
        merge_intervals([(1, 2), (5, 4)])


def test_busy_hours_counts_overlap_once():
    assert busy_hours([(9, 11), (10, 12), (14, 15)]) == 4
