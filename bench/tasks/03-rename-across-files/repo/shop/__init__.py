"""A very small shop: prices with VAT and a shopping cart."""
