"""Screens of the app, each with its sibling .tcss file."""
