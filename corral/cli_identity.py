"""`corral login`, `whoami` and `profile`: who the CLI is, and where.

The configuration file keeps named profiles (`corral.cli_config`). `corral
login USER` (with a password) or `corral login --token TOKEN` (a token you
already have) checks the credentials with the auth service, saves them as a
profile named after the user (or `--profile NAME`) and makes it current.
`corral --profile NAME COMMAND` uses another profile once; `corral profile
use NAME` switches for good, e.g. back to the `admin` profile `corral up`
writes. `$CORRAL_TOKEN` overrides any profile's token.
"""

from __future__ import annotations

import argparse
import dataclasses
import getpass
import os
import shlex
import sys
from typing import Any

import grpc

from corral.aio import channel_credentials
from corral.auth.v1 import auth_service_pb2, auth_service_pb2_grpc, user_pb2
from corral.cli_config import SETTINGS, TOKEN_VARIABLE, Config, Profile, connection
from corral.errors import UsageError, from_rpc_error
from corral.retries import channel_options

PASSWORD_VARIABLE = "CORRAL_PASSWORD"


def _ask_auth(profile: Profile, method: str, request: Any, token: str | None = None) -> Any:
    """One call to the auth service of `profile`, as `token` if given."""
    metadata = (("authorization", f"Bearer {token}"),) if token else None
    with grpc.secure_channel(profile.auth, channel_credentials(profile.ca_cert), channel_options()) as channel:
        try:
            return getattr(auth_service_pb2_grpc.AuthServiceStub(channel), method)(request, metadata=metadata)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None


NO_TERMINAL = ("no terminal to ask for a password: pipe it with --password-stdin or set "
               f"{PASSWORD_VARIABLE}")


def _password(args: argparse.Namespace) -> str:
    """The password: from stdin (`--password-stdin`), `$CORRAL_PASSWORD`, or a prompt on the terminal. Without a
    terminal getpass would read stdin after a warning, and fail at its end with EOFError."""
    if args.password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
        if not password:
            raise UsageError("--password-stdin: stdin held no password")
        return password
    if password := os.environ.get(PASSWORD_VARIABLE):
        return password
    if not _has_terminal():
        raise UsageError(NO_TERMINAL)
    return getpass.getpass(f"password for {args.username}: ")


def _has_terminal() -> bool:
    """Whether getpass can prompt: it asks on the controlling terminal (/dev/tty), whatever stdin is."""
    try:
        os.close(os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY))
    except OSError:
        return False
    return True


def _login(args: argparse.Namespace) -> int:
    if (args.username is None) == (args.token is None):
        raise UsageError("give either a username (to log in with a password) or --token TOKEN")
    if args.password_stdin and args.token is not None:
        raise UsageError("--password-stdin is for a username's password; --token - reads a token from stdin")
    config = Config.load()
    name = args.profile or args.username
    # A new profile is of the server of the current one, unless the options say otherwise.
    base = config.profiles.get(name) if name else None
    profile = dataclasses.replace(base or config.profile())
    profile.frontend = args.frontend or profile.frontend
    profile.auth = args.auth or profile.auth
    profile.ca_cert = args.ca_cert or profile.ca_cert
    if args.token is not None:
        token = sys.stdin.readline().strip() if args.token == "-" else args.token
        if not token:
            raise UsageError("the token is empty")
        user = _ask_auth(profile, "WhoAmI", auth_service_pb2.WhoAmIRequest(), token).user
    else:
        password = _password(args)
        response = _ask_auth(profile, "Login", auth_service_pb2.LoginRequest(username=args.username,
                                                                             password=password))
        token, user = response.token, response.user
    profile.token, profile.user = token, user.username
    name = name or user.username
    config.profiles[name] = profile
    config.current = name
    config.save()
    print(f"logged in as {user.username}; saved as profile {name!r} (now current) in {Config.path()}")
    return 0


def _whoami(args: argparse.Namespace) -> int:
    profile = connection(args.profile)
    user = _ask_auth(profile, "WhoAmI", auth_service_pb2.WhoAmIRequest(), profile.token).user
    roles = ",".join(user_pb2.Role.Name(r).removeprefix("ROLE_").lower() for r in user.roles)
    config = Config.load()
    source = f"${TOKEN_VARIABLE}" if os.environ.get(TOKEN_VARIABLE) else f"profile {args.profile or config.current!r}"
    print(f"{user.username}  roles={roles}  token from {source}  auth={profile.auth}")
    return 0


def _profile(args: argparse.Namespace) -> int:
    config = Config.load()
    if args.action == "env":
        profile = connection(args.name or args.profile)
        for variable, value in (("CORRAL_FRONTEND", profile.frontend), ("CORRAL_AUTH", profile.auth),
                                ("CORRAL_CA_CERT", profile.ca_cert or ""), (TOKEN_VARIABLE, profile.token)):
            print(f"export {variable}={shlex.quote(value or '')}")
        return 0
    if args.action in ("set", "unset"):
        name = args.profile or config.current
        if name is None:
            raise UsageError("no profile yet: `corral login` makes one")
        profile = config.profile(name)  # refuses an unknown name
        value = args.value if args.action == "set" else None
        setattr(profile, args.setting, value)
        config.save()
        print(f"profile {name!r}: {args.setting} " + (f"is {value}" if value is not None else "is unset"))
        return 0
    if args.action == "use":
        config.profile(args.name)  # refuses an unknown name
        config.current = args.name
        config.save()
        print(f"profile {args.name!r} is now current")
        return 0
    if not config.profiles:
        print("no profile yet: `corral login` makes one")
    for name, p in sorted(config.profiles.items()):
        mark = "*" if name == config.current else " "
        print(f"{mark} {name}  user={p.user or '?'}  frontend={p.frontend}  auth={p.auth}"
              + ("" if p.token else "  (no token)")
              + "".join(f"  {setting}={getattr(p, setting)}" for setting in SETTINGS if getattr(p, setting)))
    return 0


def add_commands(commands: argparse._SubParsersAction) -> None:
    """Add login, whoami and profile."""
    login = commands.add_parser(
        "login", help="log in (with a password, or a token you have) and save it as a profile",
        description="Check the credentials with the auth service and save them as a profile named after the "
                    "user (or `corral --profile NAME login ...`), which becomes current.")
    login.add_argument("username", nargs="?", help="log in with this user's password (from --password-stdin, "
                                                   "$CORRAL_PASSWORD or a prompt on the terminal)")
    login.add_argument("--password-stdin", action="store_true",
                       help="read the password from stdin's first line (for scripts: no terminal needed)")
    login.add_argument("--token", help="log in with this token instead ('-': read it from stdin)")
    login.add_argument("--frontend", help="host:port of the frontend (default: the current profile's)")
    login.add_argument("--auth", help="host:port of the auth service (default: the current profile's)")
    login.add_argument("--ca-cert", help="CA certificate to trust (corral up prints it)")
    login.set_defaults(run=_login)
    whoami = commands.add_parser("whoami", help="who the CLI is: the user of the token it would use")
    whoami.set_defaults(run=_whoami)
    profile = commands.add_parser(
        "profile", help="the saved profiles: list them, pick the current one, or set the pipeline library's defaults")
    actions = profile.add_subparsers(title="actions", dest="action", metavar="ACTION", required=True)
    actions.add_parser("list", help="every profile; * marks the current one")
    actions.add_parser("use", help="make a profile current").add_argument("name")
    env = actions.add_parser(
        "env", help="the profile as shell variables, for other tools: eval \"$(corral profile env)\"",
        description="Print export lines for CORRAL_FRONTEND, CORRAL_AUTH, CORRAL_CA_CERT and CORRAL_TOKEN of "
                    "the profile NAME (default: --profile, else the current one), with $CORRAL_TOKEN in place "
                    "of its token if set.")
    env.add_argument("name", nargs="?")
    setting = actions.add_parser(
        "set", help="save a default of the pipeline library in the profile (billing_project, remote_tmpdir)",
        description="Save SETTING in the profile --profile names, else the current one: the billing project and "
                    "the scratch URL (under one of the project's storage roots) that corral.pipeline's "
                    "ServiceBackend() uses when it is given none.")
    setting.add_argument("setting", choices=SETTINGS)
    setting.add_argument("value")
    unset = actions.add_parser("unset", help="remove a setting from the profile")
    unset.add_argument("setting", choices=SETTINGS)
    profile.set_defaults(run=_profile)
