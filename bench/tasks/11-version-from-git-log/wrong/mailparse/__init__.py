"""Parse the headers of e-mail messages."""

__version__ = "2.0.0"
