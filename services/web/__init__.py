"""The web UI."""
