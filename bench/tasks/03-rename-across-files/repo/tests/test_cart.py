from shop.cart import Cart


def test_total():
    cart = Cart()
    cart.add("tea", 250, quantity=2)
    cart.add("book", 1000, band="zero")
    assert cart.total_cents() == 1600
