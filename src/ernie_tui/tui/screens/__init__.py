"""Dashboard screens."""
