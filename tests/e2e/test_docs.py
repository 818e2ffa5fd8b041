"""The docs run as written: every shell and Python block of README.md and
docs/*.md, in order, against one fresh `corral up` started with the README's
run command.

A block is skipped only where the line before it says why
(`<!-- not run: REASON -->`); the README's run command (marked `<!-- run
command ... -->`) is the one that starts the system. Shell blocks run with
`bash -euo pipefail` in a scratch directory that holds the checkout's
`.venv`, `.tools` and programs, as its top folder would, with `~` a scratch
home whose `.local/share/corral` is the system's data directory. A page's
Python blocks run one after the other in one interpreter, sharing their
names, as a reader pasting them into one session would. Some blocks' output
is checked too (`CHECKS`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.e2e import cluster as up
from tests.e2e import new_user

PAGES = [up.REPO_DIR / "README.md", *sorted((up.REPO_DIR / "docs").glob("*.md"))]
RUNNABLE = {"sh", "python"}
NOT_RUN = re.compile(r"<!-- not run: (?P<reason>\S.*?) -->")
RUN_COMMAND = "<!-- run command"
LINKED_FROM_CHECKOUT = (".venv", ".tools", "scripts", "faults", "bench", "services", "corral", "sql", "protos")
BLOCK_SEPARATOR = "\n----- end of block -----\n"


@dataclasses.dataclass
class Block:
    page: Path
    line: int
    language: str
    code: str
    marker: str
    """The HTML comment on the line before the opening fence, if any."""

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(up.REPO_DIR)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """Every fenced block of `page`, with its language and the comment before it."""
    text = page.read_text()
    found = []
    for match in re.finditer(r"^```(\w*)\n(.*?)^```$", text, re.S | re.M):
        before = text[:match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        found.append(Block(page, text.count("\n", 0, match.start()) + 1, match.group(1), match.group(2),
                           before if before.startswith("<!--") else ""))
    return found


def to_run(all_blocks: list[Block]) -> list[Block]:
    return [b for b in all_blocks if b.language in RUNNABLE and not NOT_RUN.fullmatch(b.marker)
            and not b.marker.startswith(RUN_COMMAND)]


def check_readme_quickstart(out: str) -> None:
    assert "logged in as alice" in out
    assert re.search(r"batch \d+ +complete +user=alice .*jobs=4 .*succeeded=4", out), out
    assert len(re.findall(r"^job \d+ +succeeded", out, re.M)) == 4, out
    assert out.rstrip().endswith("says HELLO"), out  # the log of job 2


def check_readme_rest_quickstart(out: str) -> None:
    lines = out.splitlines()
    assert json.loads(lines[0])["user"]["username"] == "alice", out                  # whoami
    answers = [json.loads(line) for line in lines[1:] if line.startswith("{")]
    events = [answer["event"] for answer in answers if "event" in answer]
    assert events and "batchCompleted" in events[-1], out                           # the stream, to its end
    assert sum("jobStateChanged" in e for e in events) >= 4, out                    # two jobs, two changes each
    assert "says HELLO" in out and out.rstrip().endswith("cancelled by alice"), out   # the log; the cancel


def check_client_first_example(out: str) -> None:
    batch_id, n_jobs = out.split()[:2]
    assert n_jobs == "102", out
    # The listing names states, not numbers: the new batch (running or, if cancelled by then, not listed).
    assert all(line.split()[1].startswith("BATCH_STATE_") for line in out.splitlines()[1:]), out


def check_client_events(out: str) -> None:
    assert out.splitlines() == ["1 of 3 succeeded", "job 1 failed"], out


def check_client_calls(out: str) -> None:
    lines = out.splitlines()
    assert lines[0] == "1 3 exited with code 3", out                  # the failed job
    assert lines[1].startswith("parent job 1 ended failed"), out      # who cancelled job 2
    assert "fetching" in out and "index" in out, out                      # the two logs


def check_pipeline_scatter(out: str) -> None:
    assert "alice 5\nbob 3\ncarol 5\n" in out, out  # the gathered counts, sorted


def check_pipeline_service(out: str) -> None:
    assert re.search(r"^\d+ success$", out, re.M), out                 # the batch's handle
    assert "2.0\n" in out and "alice 5\nbob 3\ncarol 5" in out, out     # the gather job's log; its output file


def check_pipeline_pool(out: str) -> None:
    assert out.rstrip().endswith("[0, 1, 4]"), out


def check_traces(out: str) -> None:
    counts = [int(line.split()[0]) for line in out.splitlines()]
    assert counts and all(n >= 1 for n in counts), out  # each batch's job.run spans share a trace


def check_buf_curl(out: str) -> None:
    # Through the gateway, grpcurl's list then buf curl's: the frontend's services and auth's.
    lists = out[:out.index("{")].splitlines()
    for service in ("corral.batch.v1.BatchService", "corral.auth.v1.AuthService"):
        assert lists.count(service) == 2, out
    assert json.loads(out[out.index("{"):])["batch"]["batchId"] == "1", out


def check_batch_file_files(out: str) -> None:
    assert out.rstrip().endswith("3"), out  # the output file the job wrote into storage: ref.fa's lines


def check_cli_access(out: str) -> None:
    """What docs/cli.md says a non-member and a member who is not the owner are told, as they are told."""
    lines = out.splitlines()
    for said in ("error: no batch 1", "exit 5", "error: batch 1 belongs to alice", "exit 7"):
        assert said in lines, out
    assert lines.index("exit 5") < lines.index("error: batch 1 belongs to alice"), out


CHECKS: dict[tuple[str, str], Callable[[str], None]] = {
    # (page, the start of the block's first line): what its output must show
    ("README.md", "# corral up made the CLI its administrator"): check_readme_quickstart,
    ("README.md", 'eval "$(corral profile env)"'): check_readme_rest_quickstart,
    ("docs/batch-file.md", 'storage="$(realpath'): check_batch_file_files,
    ("docs/cli.md", "# bob, a user in no project yet"): check_cli_access,
    ("docs/client.md", "import corral"): check_client_first_example,
    ("docs/client.md", "import sys"): check_client_events,
    ("docs/client.md", "batch_id = batch.batch_id"): check_client_calls,
    ("docs/operations.md", "cat ~/.local/share/corral/traces/"): check_traces,
    ("docs/pipeline.md", "import os\nimport tempfile"): check_pipeline_scatter,
    ("docs/pipeline.md", "import shutil"): check_pipeline_service,
    ("docs/pipeline.md", "with hb.BatchPoolExecutor"): check_pipeline_pool,
    ("docs/operations.md", 'eval "$(corral profile env)"'): check_buf_curl,
}


def check_of(block: Block) -> Callable[[str], None] | None:
    page = str(block.page.relative_to(up.REPO_DIR))
    found = [check for (p, start), check in CHECKS.items() if p == page and block.code.startswith(start)]
    assert len(found) <= 1, f"{block.where}: more than one check"
    return found[0] if found else None


def test_every_block_runs_or_says_why_not() -> None:
    """Each skipped block gives its reason, there is one run command, and every check names a block that
    runs (a moved block must move its check)."""
    all_blocks = [b for page in PAGES for b in blocks(page)]
    for block in all_blocks:
        if block.marker.startswith("<!-- not run"):
            assert NOT_RUN.fullmatch(block.marker), f"{block.where}: say why it is not run: {block.marker}"
    assert [b.where for b in all_blocks if b.marker.startswith(RUN_COMMAND)] == ["README.md:19"]
    for page in PAGES:
        languages = {b.language for b in to_run(blocks(page))}
        assert languages != RUNNABLE, f"{page}: the test runs a page's Python blocks after its shell blocks"
    runnable = to_run(all_blocks)
    checked = [check_of(b) for b in runnable]
    assert sorted(map(id, filter(None, checked))) == sorted(map(id, CHECKS.values())), "a check finds no block"
    assert len(runnable) >= 8, [b.where for b in runnable]


def run_command() -> list[str]:
    [block] = [b for b in blocks(PAGES[0]) if b.marker.startswith(RUN_COMMAND)]
    [line] = [line for line in block.code.splitlines() if line.strip()]
    return [str(up.REPO_DIR / word) if word.startswith("scripts/") else word for word in line.split()]


def scratch_checkout(work: Path, data_dir: Path) -> Path:
    """A folder where the docs' relative paths (`.venv/bin/python`, `.tools/...`) resolve, and a home whose
    default data directory is the running system's."""
    work.mkdir()
    for name in LINKED_FROM_CHECKOUT:
        (work / name).symlink_to(up.REPO_DIR / name)
    home = work / "home"
    (home / ".local" / "share").mkdir(parents=True)
    (home / ".local" / "share" / "corral").symlink_to(data_dir)
    return home


def python_runner(blocks_: list[Block]) -> str:
    """One program running `blocks_` in one namespace, printing BLOCK_SEPARATOR after each."""
    sources = [(b.where, b.code) for b in blocks_]
    return (f"import sys\nnamespace = {{'__name__': '__main__'}}\n"
            f"for where, code in {sources!r}:\n"
            f"    exec(compile(code, where, 'exec'), namespace)\n"
            f"    sys.stdout.flush()\n"
            f"    print({BLOCK_SEPARATOR!r}, end='', flush=True)\n")


@dataclasses.dataclass
class System:
    """The README's `corral up`, and where the docs' blocks run: `work` as the checkout's top folder, `env`
    with `~` a scratch home whose `.local/share/corral` is the system's data directory."""

    cluster: up.Cluster
    work: Path
    env: dict[str, str]
    pages_run: set[Path] = dataclasses.field(default_factory=set)

    def run_page(self, page: Path) -> None:
        """Every block of `page` that runs, its shell blocks then its Python ones, checking what they print."""
        runnable = to_run(blocks(page))
        for block in (b for b in runnable if b.language == "sh"):
            result = subprocess.run(["bash", "-euo", "pipefail", "-c", block.code], cwd=self.work, env=self.env,
                                    capture_output=True, text=True, timeout=300)
            assert result.returncode == 0, f"{block.where}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
            if check := check_of(block):
                check(result.stdout)
        python = [b for b in runnable if b.language == "python"]
        if python:
            result = subprocess.run([sys.executable, "-c", python_runner(python)], cwd=self.work, env=self.env,
                                    capture_output=True, text=True, timeout=300)
            outputs = result.stdout.split(BLOCK_SEPARATOR)
            assert result.returncode == 0, (f"{python[len(outputs) - 1].where}\nstdout:\n{result.stdout}\n"
                                            f"stderr:\n{result.stderr}")
            for block, out in zip(python, outputs):
                if check := check_of(block):
                    check(out)
        self.pages_run.add(page)


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory, module_host_ip_forwarding: None) -> Iterator[System]:
    """The README's run command (its corral up runs jobs in containers where it can), once for the module.
    It builds the four base images at its first start on this machine (a minute or two; then they are in
    the machine's cache, tests/conftest.py)."""
    tmp_path = tmp_path_factory.mktemp("docs")
    cluster = up.start(tmp_path, "--trace", command=run_command(), timeout_s=600)
    try:
        work = tmp_path / "checkout"
        home = scratch_checkout(work, cluster.data_dir)
        env = {**cluster.env, "HOME": str(home), "CORRAL_PASSWORD": "choose-a-password",
               "PATH": f"{up.REPO_DIR / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}"}
        yield System(cluster, work, env)
    finally:
        cluster.stop()
    assert cluster.process.returncode == 0


@pytest.mark.timeout(900)
def test_the_docs_run_as_written(system: System) -> None:
    for page in PAGES:
        system.run_page(page)


@pytest.mark.timeout(300)
def test_a_new_user_after_the_readme_is_told_each_mistake_in_one_line_of_their_words(system: System) -> None:
    """Issue 36, acceptance 3: after the README (run above, or here if this test runs alone), a new member
    of `default` makes the mistakes of `tests/e2e/new_user.py` through the CLI. Each is one `error:` line
    holding the words expected, with the exit code docs/cli.md gives for its kind; and a log followed
    before its job starts waits for it."""
    if PAGES[0] not in system.pages_run:
        system.run_page(PAGES[0])
    documented = new_user.documented_exit_codes()
    cluster, work = system.cluster, system.work / "carol"
    work.mkdir()
    env = {k: v for k, v in system.env.items() if k not in ("CORRAL_PASSWORD", "CORRAL_TOKEN")}

    def corral(*argv: str, stdin: str | None = None, config: Path = work / "config.json",
               ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["corral", *argv], cwd=work, env={**env, "CORRAL_CONFIG": str(config)},
                              input=stdin, capture_output=True, text=True, timeout=120)

    admin = {"config": Path(cluster.env["CORRAL_CONFIG"])}
    for argv, stdin in ((("--profile", "admin", "users", "create", "carol", "--password-stdin"), "carols-secret\n"),
                        (("--profile", "admin", "billing", "add-member", "default", "carol"), None)):
        done = corral(*argv, stdin=stdin, **admin)
        assert done.returncode == 0, done.stderr
    where = ("--frontend", cluster.endpoints["frontend"], "--auth", cluster.endpoints["auth"],
             "--ca-cert", cluster.endpoints["ca_cert"])
    down_config = work / "down.json"  # carol's profile, as it is once corral up has stopped
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        down_port = closed.getsockname()[1]

    first_batch = ""
    for mistake in new_user.MISTAKES:
        if mistake.argv[:1] == ("login",):
            said = corral(*mistake.argv, *where, stdin=mistake.stdin)
        else:
            if mistake.batch_file:
                (work / "batch.yaml").write_text(mistake.batch_file)
            said = corral(*mistake.argv, config=down_config if mistake.down else work / "config.json")
        expected = mistake.said.format(batch=first_batch, port=down_port)
        assert said.returncode == mistake.exit_code and mistake.exit_code in documented, (mistake.what, said)
        assert said.stderr.splitlines() == [said.stderr.strip()] and said.stderr.startswith("error: "), \
            (mistake.what, said.stderr)
        assert expected in said.stderr, (mistake.what, expected, said.stderr)
        if mistake.argv[:1] == ("login",):  # then the way the line says
            logged_in = corral("login", "carol", "--password-stdin", *where, stdin="carols-secret\n")
            assert logged_in.returncode == 0, logged_in.stderr
            profile = json.loads((work / "config.json").read_text())["profiles"]["carol"]
            down_config.write_text(json.dumps({"current": "carol", "profiles": {"carol": {
                **profile, "frontend": f"localhost:{down_port}", "auth": f"localhost:{down_port}"}}}))
            (work / "batch.yaml").write_text(new_user.FIRST_TOKEN_FILE)
            first = corral("submit", "-q", "batch.yaml")
            assert first.returncode == 0, first.stderr
            first_batch = first.stdout.strip()
            again = corral("submit", "-q", "batch.yaml")  # the same file, the same token: the same batch
            assert (again.returncode, again.stdout.strip()) == (0, first_batch), again

    (work / "batch.yaml").write_text(new_user.PENDING_LOG_FILE)
    submitted = corral("submit", "-q", "batch.yaml")
    assert submitted.returncode == 0, submitted.stderr
    followed = corral("logs", "-f", submitted.stdout.strip(), "2")
    assert followed.returncode == 0, followed
    assert "after the slow one" in followed.stdout, followed
