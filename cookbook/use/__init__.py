"""Use what you trained."""
