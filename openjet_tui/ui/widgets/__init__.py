"""Widgets of the app; each keeps its own look in DEFAULT_CSS."""
