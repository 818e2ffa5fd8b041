"""Ctrl-C for a command a test starts: the test run itself may have been started with SIGINT ignored (a
shell's `cmd &` does that), and a child inherits the ignoring, so Python in it would never raise
KeyboardInterrupt. `as_at_a_terminal` undoes it in the child before it runs, as a terminal would have it."""

from __future__ import annotations

import signal


def as_at_a_terminal() -> None:
    """For `preexec_fn`: SIGINT back to its default, so the child's Python installs its own handler."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
