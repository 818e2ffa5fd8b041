"""`corral secrets`: a billing project's secrets, which its jobs mount
read-only (a job spec's `secrets`).

`create NAME --project P --from-file [KEY=]PATH ...` reads each file (its
name is the file's, or KEY) and stores them as one secret; `list` shows
names, file names and who made them when; `delete` removes one. No command
prints a secret's contents: the server never returns them.
"""

from __future__ import annotations

import argparse
import datetime
from pathlib import Path
from typing import Any

from corral.batch.v1 import secret_pb2
from corral.cli_common import open_client, print_json, with_json
from corral.errors import UsageError
from corral.refusal_words import Option, option_words


def read_files(specs: list[str]) -> dict[str, bytes]:
    """`--from-file` values, `PATH` or `KEY=PATH`, as file name to content."""
    files: dict[str, bytes] = {}
    for spec in specs:
        key, sep, path = spec.partition("=")
        if not sep:
            key, path = Path(spec).name, spec
        if not key or not path:
            raise UsageError(f"--from-file {spec!r}: give PATH or KEY=PATH")
        if key in files:
            raise UsageError(f"--from-file: two files named {key!r}; name one with KEY=PATH")
        files[key] = Path(path).expanduser().read_bytes()
    return files


def secret_line(secret: secret_pb2.Secret) -> str:
    created = datetime.datetime.fromtimestamp(secret.created_at.seconds, datetime.timezone.utc)
    return (f"{secret.name}  files={','.join(secret.keys)}  created={created:%Y-%m-%d %H:%M:%S}Z  "
            f"by={secret.created_by}")


def _secrets(args: argparse.Namespace) -> int:
    with open_client(args) as client:
        if args.action == "create":
            secrets = [client.create_secret(args.project, args.name, read_files(args.from_file or []),
                                            replace=args.replace)]
        elif args.action == "list":
            secrets = list(client.secrets(args.project))
        else:
            client.delete_secret(args.project, args.name)
            if not args.json:
                print(f"deleted secret {args.name} of billing project {args.project}")
            return 0
    if args.json:
        print_json(secrets)
    elif not secrets:
        print(f"billing project {args.project} has no secrets")
    else:
        for secret in secrets:
            print(secret_line(secret))
    return 0


def add_commands(commands: Any) -> None:
    """Add `secrets` with its subcommands."""
    secrets = commands.add_parser("secrets", help="a billing project's secrets, mounted read-only into its jobs")
    actions = secrets.add_subparsers(title="actions", dest="action", metavar="ACTION", required=True)
    create = with_json(actions.add_parser("create", help="store a secret from files (members and admins)"))
    create.add_argument("name", help="the secret's name: lower-case letters, digits, '-', '_'")
    create.add_argument("--from-file", action="append", metavar="[KEY=]PATH", required=True,
                        help="a file of the secret, named KEY or as PATH is (repeatable)")
    create.add_argument("--replace", action="store_true", help="replace the secret if the name is taken")
    with_json(actions.add_parser("list", help="the project's secrets: names and files, never contents"))
    delete = with_json(actions.add_parser("delete", help="delete a secret (members and admins)"))
    delete.add_argument("name")
    for action in (create, actions.choices["list"], delete):
        action.add_argument("--project", required=True, help="the billing project")
    secrets.set_defaults(run=_secrets, words=option_words({
        "name": Option("NAME"), "files": Option("--from-file"), "replace": Option("--replace", flag=True),
        "billing_project": Option("--project")}))
