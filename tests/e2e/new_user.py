"""A new user's first hour after the README: the mistakes people make, each
of which must be said in one line, in the words they typed, with the exit
code docs/cli.md documents (issue 36, acceptance 3).

`tests/e2e/test_docs.py` runs these on the `corral up` its docs ran on,
after the README: `carol` is a new member of the project `default`, with a
configuration file of her own, and makes each mistake through the CLI.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

CLI_PAGE = Path(__file__).resolve().parents[2] / "docs" / "cli.md"

EXIT_MISTAKE = 2       # found before any call
EXIT_REFUSED = 4       # INVALID_ARGUMENT, FAILED_PRECONDITION, ALREADY_EXISTS, ...
EXIT_PERMISSION = 7    # PERMISSION_DENIED
EXIT_UNREACHABLE = 8   # the server could not be reached


def documented_exit_codes() -> dict[int, str]:
    """docs/cli.md's exit-code table: code -> meaning."""
    section = CLI_PAGE.read_text().split("## Exit codes", 1)[1]
    return {int(m.group(1)): m.group(2) for m in re.finditer(r"^\| (\d+) \| (.+) \|$", section, re.M)}


@dataclasses.dataclass(frozen=True)
class Mistake:
    what: str
    argv: tuple[str, ...]
    """`corral ARGV`, in a folder where `batch.yaml` holds `batch_file`."""
    exit_code: int
    said: str
    """What the one `error:` line must hold (after `{batch}` and `{port}` are filled in)."""
    batch_file: str = ""
    stdin: str | None = None
    down: bool = False
    """Run against a profile whose server is not running."""


def job_file(job: str, token: str = "") -> str:
    token_line = f"idempotency_token: {token}\n" if token else ""
    return f"billing_project: default\n{token_line}jobs:\n  - name: first\n{job}"


MISTAKES = (
    Mistake("login from a script, no terminal for the password", ("login", "carol"), EXIT_MISTAKE,
            "no terminal to ask for a password: pipe it with --password-stdin or set CORRAL_PASSWORD", stdin=""),
    Mistake("a typo in a key", ("submit", "batch.yaml"), EXIT_MISTAKE,
            "batch.yaml:5:5: jobs[0]: unknown key 'imag'; did you mean 'image'?",
            job_file("    command: [echo, hi]\n    imag: busybox\n")),
    Mistake("a unit people write for gigabytes", ("submit", "batch.yaml"), EXIT_MISTAKE,
            'batch.yaml:6:13: jobs[0].memory: "4GB": unknown unit "GB"; use Ki, Mi, Gi, Ti',
            job_file("    image: busybox\n    command: [echo, hi]\n    memory: 4GB\n")),
    Mistake("more cores than any machine", ("submit", "batch.yaml"), EXIT_REFUSED,
            "jobs[0] (name: first): cores: must be between 0 and 64",
            job_file("    image: busybox\n    command: [echo, hi]\n    cores: 100\n")),
    Mistake("a machine type corral up cannot make", ("submit", "batch.yaml"), EXIT_REFUSED,
            "jobs[0] (name: first): machine_type: n2-highmem-8: no pool of this deployment offers it",
            job_file("    image: busybox\n    command: [echo, hi]\n    machine_type: n2-highmem-8\n")),
    Mistake("a batch of no jobs", ("submit", "batch.yaml"), EXIT_MISTAKE,
            "batch.yaml:2:7: jobs: an empty list: a batch needs at least one job",
            "billing_project: default\njobs: []\n"),
    Mistake("a query with a slip of a key", ("ls", "stat=running"), EXIT_REFUSED,
            "unknown key 'stat'; did you mean state?"),
    Mistake("cancelling someone else's batch", ("cancel", "1"), EXIT_PERMISSION, "batch 1 belongs to alice"),
    Mistake("a changed file under a token already used", ("submit", "batch.yaml"), EXIT_REFUSED,
            'idempotency token "carol-nightly" was used for batch {batch} with a different request; use a new '
            "token to submit a changed batch",
            job_file("    image: busybox\n    command: [echo, changed]\n", token="carol-nightly")),
    Mistake("the server is down", ("ls",), EXIT_UNREACHABLE,
            "cannot reach corral at localhost:{port}: connection refused; is corral up running?", down=True),
)
"""Each mistake, in the order a new user meets them. The token mistake's first, unchanged submission is
`FIRST_TOKEN_FILE`, submitted before it."""

FIRST_TOKEN_FILE = job_file("    image: busybox\n    command: [echo, first]\n", token="carol-nightly")

PENDING_LOG_FILE = ("billing_project: default\njobs:\n"
                    "  - name: slow\n    image: busybox\n    command: [sleep, '3']\n"
                    "  - name: after\n    image: busybox\n    command: [echo, after the slow one]\n"
                    "    parents: [slow]\n")
"""A job whose log the user follows before it starts (`corral logs -f BATCH 2`): it waits, then follows."""
