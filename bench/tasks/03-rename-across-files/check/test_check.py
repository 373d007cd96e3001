"""Hidden check: calc is renamed to gross_price everywhere and behaves the same."""

import pathlib
import re

import pytest

from shop import cart, pricing


def test_gross_price_exists_and_calc_is_gone():
    assert hasattr(pricing, "gross_price")
    assert not hasattr(pricing, "calc")


@pytest.mark.parametrize(
    ("net", "band", "gross"),
    [(1000, "standard", 1200), (999, "reduced", 1049), (10, "reduced", 11), (1234, "zero", 1234), (0, "standard", 0)],
)
def test_gross_price_values(net, band, gross):
    assert pricing.gross_price(net, band) == gross


def test_gross_price_default_band_and_unknown_band():
    assert pricing.gross_price(500) == 600
    with pytest.raises(KeyError):
        pricing.gross_price(500, "luxury")


def test_cart_total_and_receipt():
    shopping = cart.Cart()
    shopping.add("tea", 250, quantity=2)
    shopping.add("book", 1000, band="zero")
    shopping.add("soap", 199, band="reduced")
    assert shopping.total_cents() == 600 + 1000 + 209
    assert shopping.receipt().splitlines() == [
        "2 x tea: £6.00",
        "1 x book: £10.00",
        "1 x soap: £2.09",
        "total: £18.09",
    ]


def test_no_file_mentions_calc():
    for path in pathlib.Path("shop").glob("*.py"):
        assert not re.search(r"\bcalc\b", path.read_text()), f"{path} still mentions calc"
