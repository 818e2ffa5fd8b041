"""The worker: runs jobs for the driver (runtimes, logs, and later its session)."""
