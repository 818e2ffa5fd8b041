"""The worker: one per machine, runs jobs for the leading driver (see docs/workers.md)."""
