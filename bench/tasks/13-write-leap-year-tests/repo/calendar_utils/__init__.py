"""Date helpers for the billing calendar."""
