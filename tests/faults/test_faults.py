"""The fault programs (faults/), each injected into a real `corral up`.

The default suite runs each fault's short version, one after the other, on
one `corral up` (each leaves it whole: killed parts restarted, locks
released, partitions healed); `-m slow` runs each long version as
`python -m faults NAME`, on a `corral up` of its own, as an operator would.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from faults import FAULTS, module
from faults.stack import UP_ARGS, Stack, running

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running(*UP_ARGS, work_dir=tmp_path_factory.mktemp("faults")) as stack:
        yield stack
    # Stopped, whichever `corral up` ran last (restore starts another): one left running outlived the suite.
    assert stack.up.process.poll() is not None, f"corral up (pid {stack.up.process.pid}) is still running"


def short_args(name: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    module(name).add_arguments(parser)
    args = parser.parse_args([])
    args.short = True
    return args


def skip_unless_possible(name: str) -> None:
    if getattr(module(name), "NEEDS_ROOT", False) and os.geteuid() != 0:
        pytest.skip(f"the {name} fault needs root (iptables, cgroups, mounts)")
    if hasattr(module(name), "unavailable") and (why := module(name).unavailable()):
        pytest.skip(why)


@pytest.mark.parametrize("name", FAULTS)
def test_short(stack: Stack, name: str) -> None:
    skip_unless_possible(name)
    outcome = module(name).inject(stack, short_args(name))
    assert outcome.audit is not None
    assert outcome.ok, (outcome.broken, outcome.audit.lines())


@pytest.mark.slow
@pytest.mark.parametrize("name", FAULTS)
def test_long(name: str, tmp_path: Path) -> None:
    skip_unless_possible(name)
    done = subprocess.run([sys.executable, "-m", "faults", name, "--work-dir", str(tmp_path)], cwd=REPO,
                          capture_output=True, text=True, timeout=5400)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 lost, 0 duplicated" in done.stdout
