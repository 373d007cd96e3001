"""Small text statistics used by the weekly report."""
