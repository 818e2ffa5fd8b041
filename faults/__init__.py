"""Faults, injected into a real `corral up` and counted.

`python -m faults NAME [--short] [options]` starts `corral up` on a data
directory of its own, submits work, injects the fault NAME while the work
runs, waits for every batch to complete and then audits it (faults/audit.py):
jobs lost, completions recorded twice, attempts left open, and what the
invariant checker finds. It prints its figures, one `name: value unit` line
each, then `N lost, M duplicated`, and exits 1 if anything the fault must
not break broke (2 if it could not run). `--short` runs a version of seconds
(what the test suite runs); without it, the long version.

Each fault's module says what it does and what it checks; docs/operations.md
(Faults) has the last figures.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import sys
from pathlib import Path
from types import ModuleType

from faults.audit import Audit
from faults.stack import UP_ARGS, running

FAULTS = ("leader-kill", "paused-leader", "frontend-kill", "database-restart", "slow-database", "partition",
          "disk-full", "restore", "upgrade", "chaos")
"""The fault programs, by name (the module is the name with '_' for '-')."""


@dataclasses.dataclass
class Outcome:
    """What a fault program found."""

    figures: list[tuple[str, float, str]] = dataclasses.field(default_factory=list)
    """(name, value, unit) of each figure, in the order measured."""
    audit: Audit | None = None
    broken: list[str] = dataclasses.field(default_factory=list)
    """Promises of this fault that did not hold (besides the audit's)."""

    def figure(self, name: str, value: float, unit: str) -> None:
        value = round(value, 2) if isinstance(value, float) else value
        self.figures.append((name, value, unit))
        print(f"{name}: {value} {unit}", flush=True)

    @property
    def ok(self) -> bool:
        return not self.broken and (self.audit is None or self.audit.ok)


def module(name: str) -> ModuleType:
    """The module of the fault NAME."""
    if name not in FAULTS:
        raise KeyError(name)
    return importlib.import_module(f"faults.{name.replace('-', '_')}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m faults", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="fault", required=True, metavar="NAME")
    for name in FAULTS:
        fault = module(name)
        sub = commands.add_parser(name, help=fault.HELP, description=fault.__doc__)
        sub.add_argument("--short", action="store_true", help="the version of seconds the test suite runs")
        sub.add_argument("--work-dir", type=Path, help="run corral up in this directory and keep it (its logs are "
                                                       "in data/logs); default: a temporary one, removed after")
        fault.add_arguments(sub)
    args = parser.parse_args(argv)
    fault = module(args.fault)
    if getattr(fault, "OWN_DEPLOYMENT", False):  # it starts the corral ups it needs itself
        outcome: Outcome = fault.inject(None, args)
    else:
        with running(*UP_ARGS, work_dir=args.work_dir) as stack:
            outcome = fault.inject(stack, args)
    if outcome.audit is not None:
        for line in outcome.audit.lines():
            print(line)
    for promise in outcome.broken:
        print(f"BROKEN: {promise}")
    print("ok" if outcome.ok else "FAILED", flush=True)
    return 0 if outcome.ok else 1


if __name__ == "__main__":
    sys.exit(main())
