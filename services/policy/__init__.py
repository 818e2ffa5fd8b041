"""Scheduling policy as pure functions: fair share, lock contention and the
planner. No I/O, no clock, no randomness: callers read a snapshot from the
database and pass it in. The driver's scheduler acts on the planner's
placements; the frontend's ExplainJob reports the planner's reason for one
job, from the same kind of snapshot, so the two cannot disagree.
"""
