import pytest

from calendar_utils.dates import days_in_month


def test_thirty_day_months():
    assert [days_in_month(2023, month) for month in (4, 6, 9, 11)] == [30, 30, 30, 30]


def test_bad_month():
    with pytest.raises(ValueError):
        days_in_month(2023, 13)
