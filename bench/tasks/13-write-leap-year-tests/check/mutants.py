"""A pytest plugin that swaps is_leap_year for a wrong version chosen by the LEAP_MUTANT variable.

Loaded with `-p mutants` before the agent's tests are collected, so `from calendar_utils.dates import is_leap_year`
in those tests picks up the mutant, and days_in_month (which calls it through the module) does too.
"""

import os

import calendar_utils.dates as dates

MUTANTS = {
    "every-fourth": lambda year: year % 4 == 0,
    "no-400-rule": lambda year: year % 4 == 0 and year % 100 != 0,
    "inverted": lambda year: not (year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)),
}

_name = os.environ.get("LEAP_MUTANT")
if _name:
    dates.is_leap_year = MUTANTS[_name]
