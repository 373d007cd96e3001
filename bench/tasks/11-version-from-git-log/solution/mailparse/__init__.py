"""Parse the headers of e-mail messages."""

__version__ = "1.8.1"
