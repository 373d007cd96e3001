"""A link shortener."""
