"""Tiny single-purpose apps for the SVG snapshot tests, each showing one part of the UI with fixed data."""
