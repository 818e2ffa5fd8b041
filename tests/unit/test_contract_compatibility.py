"""The contracts only add, from release to release: `buf breaking` (buf.yaml's FILE rules) of this
checkout's protos against those of the release an upgrade starts from (faults/upgrade.py's default: the
commit before the newest migration), so that a worker and a driver of adjacent releases understand each
other for the length of a rolling upgrade (docs/operations.md, Upgrades)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from faults import upgrade

REPO = Path(__file__).resolve().parents[2]
BUF = REPO / ".tools" / "node_modules" / ".bin" / "buf"


def test_the_contracts_only_add_since_the_release_an_upgrade_starts_from() -> None:
    if why := upgrade.unavailable():
        pytest.skip(why)
    previous = upgrade.previous_release()
    depth = int(subprocess.run(["git", "rev-list", "--count", f"{previous}..HEAD"], cwd=REPO, check=True,
                               capture_output=True, text=True).stdout) + 2
    done = subprocess.run([str(BUF), "breaking", "--against", f".git#ref={previous},depth={depth}"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"against {previous[:12]}:\n{done.stdout}{done.stderr}"
