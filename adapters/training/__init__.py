"""Recorded episodes out as training data and demonstrations (arena export, arena demos build)."""
