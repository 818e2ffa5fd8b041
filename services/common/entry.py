"""What every service's `python -m` entry point does before it runs.

- Files it creates are private to its own account (umask 077): specs, logs,
  ports files, keys. Where another account must read something (a job's
  working directory), the code that makes it says so with an explicit mode.
- The database URL, which carries the service's password, comes from
  `$CORRAL_DATABASE_URL` rather than the command line: every local account
  can read a process's arguments (`ps`), and only the process's own account
  (and root) its environment.
"""

from __future__ import annotations

import argparse
import os

from services.common.image_refs import InvalidImageReference, Mirror

DATABASE_URL_VARIABLE = "CORRAL_DATABASE_URL"


def private_files() -> None:
    """Make every file and directory this process creates readable by its own account only."""
    os.umask(0o077)


def add_database_url(parser: argparse.ArgumentParser) -> None:
    """`--database-url`, defaulting to $CORRAL_DATABASE_URL; one of the two is required."""
    parser.add_argument("--database-url", default=os.environ.get(DATABASE_URL_VARIABLE),
                        required=DATABASE_URL_VARIABLE not in os.environ,
                        help=f"mysql://USER:PASSWORD@HOST/DB (default: ${DATABASE_URL_VARIABLE}, which keeps "
                             "the password off the command line)")


STORAGE_ROOT_HELP = ("a URL jobs' input and output files may lie under, {project} standing for the billing project "
                     "(e.g. file:///var/lib/corral/storage/{project}/); repeatable")
CALLBACK_NETWORKS_HELP = "networks completion callbacks may reach although not public (e.g. 10.0.0.0/8)"


def add_url_settings(parser: argparse.ArgumentParser, default_roots: list[str] | None = None,
                     roots_default_help: str = "none: jobs may name no files") -> None:
    """`--storage-root` (repeatable) and `--callback-allow-networks`, the URL rules of docs/security.md;
    the frontend and the drivers must be given the same values."""
    parser.add_argument("--storage-root", action="append", default=default_roots, metavar="URL_TEMPLATE",
                        help=f"{STORAGE_ROOT_HELP} ({roots_default_help})")
    parser.add_argument("--callback-allow-networks", default="", metavar="CIDR,...", help=CALLBACK_NETWORKS_HELP)


def allowed_networks(text: str) -> tuple[str, ...]:
    """The networks of a `--callback-allow-networks` value."""
    return tuple(a for a in text.split(",") if a)


ALLOWED_REGISTRIES_HELP = ("registries (HOST[:PORT], as image references name them; http://HOST:PORT: plain HTTP) "
                           "jobs' images may come from although they are not public, e.g. one on the deployment's "
                           "private network; the own registry and the mirrors are always allowed (docs/images.md)")


def add_allowed_registries(parser: argparse.ArgumentParser) -> None:
    """`--allowed-registries`: the registries jobs may pull from although they are not public (the frontend
    checks submissions against them, the workers each pull); the frontend and the drivers must be given the
    same value, and the drivers hand it to their workers."""
    parser.add_argument("--allowed-registries", default="", metavar="HOST[:PORT],...", help=ALLOWED_REGISTRIES_HELP)


def allowed_registries(text: str) -> tuple[str, ...]:
    """The registries of an `--allowed-registries` value."""
    return tuple(a.strip() for a in text.split(",") if a.strip())


OWN_REGISTRY_HELP = ("corral's own registry, what image references name localhost/...: http://HOST:PORT (plain HTTP) "
                     "or https://HOST[:PORT] (docs/images.md)")
REGISTRY_MIRROR_HELP = ("REGISTRY=URL[/PREFIX]: pulls of REGISTRY's images ask the mirror first "
                        "(URL/PREFIX/REPOSITORY), then REGISTRY itself, e.g. docker.io=http://127.0.0.1:5000/docker.io; "
                        "repeatable (docs/images.md)")


def registry_mirror(text: str) -> Mirror:
    """argparse's type of `--registry-mirror`."""
    try:
        return Mirror.parse(text)
    except InvalidImageReference as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_registry_mirrors(parser: argparse.ArgumentParser) -> None:
    """`--registry-mirror REGISTRY=URL` (repeatable): the mirrors workers pull from first."""
    parser.add_argument("--registry-mirror", dest="registry_mirrors", action="append", type=registry_mirror,
                        default=[], metavar="REGISTRY=URL", help=REGISTRY_MIRROR_HELP)
