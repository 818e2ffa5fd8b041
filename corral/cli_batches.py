"""`corral login`, `submit`, `ls`, `status`, `cancel`, `wait`: the batch commands.

Connection settings live in a small JSON file (default
`~/.config/corral/config.json`, or `$CORRAL_CONFIG`): the frontend and auth
addresses, the CA to trust, and the token `corral login` obtained. Human
output by default, `--json` for scripts.
"""

from __future__ import annotations

import argparse
import dataclasses
import getpass
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import yaml
from google.protobuf import json_format

from corral.aio import channel_credentials
from corral.auth.v1 import auth_service_pb2, auth_service_pb2_grpc
from corral.batch.v1 import batch_pb2
from corral.builder import BatchBuilder, JobHandle
from corral.client import Client
from corral.errors import CorralError, from_rpc_error


@dataclasses.dataclass
class Settings:
    """The contents of the config file."""

    frontend: str = "localhost:7443"
    auth: str = "localhost:7444"
    ca_cert: str | None = None
    token: str | None = None

    @staticmethod
    def path() -> Path:
        return Path(os.environ.get("CORRAL_CONFIG", "~/.config/corral/config.json")).expanduser()

    @classmethod
    def load(cls) -> Settings:
        path = cls.path()
        return cls(**json.loads(path.read_text())) if path.exists() else cls()

    def save(self) -> None:
        path = self.path()
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # it holds a token
        with os.fdopen(fd, "w") as f:
            json.dump(dataclasses.asdict(self), f, indent=2)


def open_client() -> Client:
    """A client with the CLI's settings (frontend, auth, CA, token)."""
    settings = Settings.load()
    if not settings.token:
        raise CorralError("not logged in: run `corral login`")
    return Client(settings.frontend, settings.token, settings.ca_cert, auth_address=settings.auth)


def guarded(command: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Run a command; a CorralError becomes `error: ...` on stderr and exit code 1."""
    def run(args: argparse.Namespace) -> int:
        try:
            return command(args)
        except CorralError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1

    return run


def _print_batch(batch: batch_pb2.Batch) -> None:
    c = batch.counts
    state = batch_pb2.BatchState.Name(batch.state).removeprefix("BATCH_STATE_").lower()
    if batch.HasField("cancellation"):
        state += f" (cancelled by {batch.cancellation.cancelled_by}: {batch.cancellation.reason})"
    print(f"batch {batch.batch_id}  {state}  user={batch.user}  project={batch.billing_project}  "
          f"jobs={c.n_jobs} pending={c.n_pending} ready={c.n_ready} running={c.n_running} "
          f"succeeded={c.n_succeeded} failed={c.n_failed} errored={c.n_errored} cancelled={c.n_cancelled}  "
          f"cost=${batch.cost_micro_usd / 1e6:.6f}")


def _emit(args: argparse.Namespace, batches: list[batch_pb2.Batch]) -> None:
    if args.json:
        print(json.dumps([json_format.MessageToDict(b) for b in batches], indent=2))
    else:
        for batch in batches:
            _print_batch(batch)


def builder_from_yaml(document: dict[str, Any]) -> BatchBuilder:
    """A batch file: billing_project, attributes, and jobs with local names for parents."""
    if not isinstance(document, dict) or "billing_project" not in document:
        raise CorralError("the batch file needs a billing_project and a list of jobs")
    builder = BatchBuilder(document["billing_project"], attributes=document.get("attributes"),
                           callback_url=document.get("callback_url"),
                           cancel_after_n_failures=document.get("cancel_after_n_failures"))
    named: dict[str, JobHandle] = {}
    for i, job in enumerate(document.get("jobs") or []):
        try:
            parents = [named[p] for p in job.get("parents", [])]
        except KeyError as e:
            raise CorralError(f"jobs[{i}]: parent {e.args[0]!r} is not the name of an earlier job") from None
        handle = builder.job(
            job.get("image", ""), job.get("command", []), parents=parents,
            accept=job.get("accept", ("succeeded",)), always_run=job.get("always_run", False),
            cores=job.get("cores", 1.0), memory_bytes=job.get("memory_bytes", 0),
            storage_bytes=job.get("storage_bytes", 0), env=job.get("env"),
            attributes=job.get("attributes"), timeout_s=job.get("timeout_s"), priority=job.get("priority", 0))
        if "name" in job:
            named[job["name"]] = handle
    return builder


def _login(args: argparse.Namespace) -> int:
    settings = Settings.load()
    settings.frontend = args.frontend or settings.frontend
    settings.auth = args.auth or settings.auth
    settings.ca_cert = args.ca_cert or settings.ca_cert
    password = os.environ.get("CORRAL_PASSWORD") or getpass.getpass(f"password for {args.username}: ")
    with grpc.secure_channel(settings.auth, channel_credentials(settings.ca_cert)) as channel:
        try:
            response = auth_service_pb2_grpc.AuthServiceStub(channel).Login(
                auth_service_pb2.LoginRequest(username=args.username, password=password))
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
    settings.token = response.token
    settings.save()
    print(f"logged in as {response.user.username}; token saved in {Settings.path()}")
    return 0


def _submit(args: argparse.Namespace) -> int:
    builder = builder_from_yaml(yaml.safe_load(Path(args.file).read_text()))
    with open_client() as client:
        batch = client.submit(builder)
    if args.quiet:
        print(batch.batch_id)  # for scripts: batch=$(corral submit -q FILE)
    else:
        _emit(args, [batch])
    return 0


def _ls(args: argparse.Namespace) -> int:
    with open_client() as client:
        batches = []
        for batch in client.list_batches(" ".join(args.query)):
            batches.append(batch)
            if len(batches) >= args.limit:
                break
        _emit(args, batches)
    return 0


def _status(args: argparse.Namespace) -> int:
    with open_client() as client:
        _emit(args, [client.get_batch(args.batch_id)])
    return 0


def _cancel(args: argparse.Namespace) -> int:
    with open_client() as client:
        batch = client.cancel_batch(args.batch_id, args.reason)
    if not args.json and not batch.HasField("cancellation"):  # it had finished: the server cancelled nothing
        print(f"batch {batch.batch_id} is already complete: nothing to cancel")
    _emit(args, [batch])
    return 0


WAIT_NOT_ALL_SUCCEEDED = 3
"""`corral wait`'s exit code when the batch completed but not every job succeeded."""


def _wait(args: argparse.Namespace) -> int:
    with open_client() as client:
        batch = client.wait(args.batch_id, progress=not args.quiet)
    _emit(args, [batch])
    return 0 if batch.counts.n_succeeded == batch.counts.n_jobs else WAIT_NOT_ALL_SUCCEEDED


def add_commands(commands: argparse._SubParsersAction) -> None:
    """Add login, submit, ls, status, cancel and wait."""
    login = commands.add_parser("login", help="log in and remember the token")
    login.add_argument("username")
    login.add_argument("--frontend", help="host:port of the frontend")
    login.add_argument("--auth", help="host:port of the auth service")
    login.add_argument("--ca-cert", help="CA certificate to trust (corral up prints it)")
    login.set_defaults(run=guarded(_login))

    def with_json(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        parser.add_argument("--json", action="store_true", help="machine-readable output")
        return parser

    submit = with_json(commands.add_parser("submit", help="submit a batch described in YAML"))
    submit.add_argument("file")
    submit.add_argument("-q", "--quiet", action="store_true", help="print only the new batch's id")
    submit.set_defaults(run=guarded(_submit))
    ls = with_json(commands.add_parser("ls", help="list batches matching a query (newest first)"))
    ls.add_argument("query", nargs="*", help="e.g. state=running name=~align")
    ls.add_argument("--limit", type=int, default=50)
    ls.set_defaults(run=guarded(_ls))
    status = with_json(commands.add_parser("status", help="show one batch"))
    status.add_argument("batch_id", type=int)
    status.set_defaults(run=guarded(_status))
    cancel = with_json(commands.add_parser("cancel", help="cancel a batch"))
    cancel.add_argument("batch_id", type=int)
    cancel.add_argument("--reason", default="cancelled from the command line")
    cancel.set_defaults(run=guarded(_cancel))
    wait = with_json(commands.add_parser(
        "wait", help="wait until a batch completes, showing progress; exit 0 if every job succeeded, "
                     f"{WAIT_NOT_ALL_SUCCEEDED} if not"))
    wait.add_argument("batch_id", type=int)
    wait.add_argument("--quiet", action="store_true", help="no progress line on stderr")
    wait.set_defaults(run=guarded(_wait))
