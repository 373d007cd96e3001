"""Warehouse stock reports from the nightly CSV export."""
