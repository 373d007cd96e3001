import pytest

from calendar_utils.dates import days_in_month, is_leap_year


def test_thirty_day_months():
    assert [days_in_month(2023, month) for month in (4, 6, 9, 11)] == [30, 30, 30, 30]


def test_bad_month():
    with pytest.raises(ValueError):
        days_in_month(2023, 13)


@pytest.mark.parametrize("year", [2024, 1996, 2000, 1600, 4])
def test_leap_years(year):
    assert is_leap_year(year)


@pytest.mark.parametrize("year", [2023, 2019, 1900, 2100, 1800, 1])
def test_common_years(year):
    assert not is_leap_year(year)


def test_february():
    assert days_in_month(2000, 2) == 29
    assert days_in_month(1900, 2) == 28
