"""Parse the headers of e-mail messages."""

__version__ = "1.6.0"
