"""Targets: export a QGraph into an artifact and prove the artifact in its real runtime."""
