"""`corral billing ...`, `corral users ...` and `corral admin ...`: billing projects, people and machines.

Members read their projects and spend; changing a project and everything
under `corral users` and `corral admin` (the pools and their instances) is
for administrators (the services refuse others with PERMISSION_DENIED).
Users and tokens go to the auth service at the address `corral login` saved.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any

from corral.auth.v1 import user_pb2
from corral.batch.v1 import fleet_pb2
from corral.billing.v1 import billing_project_pb2
from corral.cli_common import open_client, print_json, print_messages, seconds_option, usd, with_json
from corral.quantities import format_bytes, format_mcpu
from corral.errors import UsageError
from corral.refusal_words import USD, Option, option_words


BILLING_OPTIONS = {
    "name": Option("NAME"), "username": Option("USERNAME"), "members": Option("--member"),
    # `billing limit NAME USD` and `billing create --limit USD`: the API's micro-USD, said in USD.
    "limit_micro_usd": Option("the limit (USD)", USD), "max_job_duration": Option("--max-job-duration"),
    "first_day": Option("--from"), "last_day": Option("--to"), "breakdown": Option("--by"),
}
"""The request fields `corral billing ...` sets, as its options and arguments say them."""
USERS_OPTIONS = {
    "username": Option("USERNAME"), "roles": Option("--role"), "password": Option("the password"),
    "display_name": Option("--display-name"), "email": Option("--email"), "name": Option("--name"),
    "ttl": Option("--ttl-days"),
}
"""The request fields `corral users ...` sets, as its options and arguments say them."""
ADMIN_OPTIONS = {"pool": Option("--pool"), "state": Option("--state")}
"""The request fields `corral admin ...` sets, as its options say them."""


def project_line(p: billing_project_pb2.BillingProject) -> str:
    state = billing_project_pb2.BillingProjectState.Name(p.state).removeprefix("BILLING_PROJECT_STATE_").lower()
    limit = usd(p.limit_micro_usd) if p.HasField("limit_micro_usd") else "none"
    longest = ""
    if p.HasField("limit_micro_usd"):
        longest = f"  max_job_duration={p.max_job_duration.ToTimedelta().total_seconds():g}s"
    return (f"{p.name}  {state}  members={','.join(p.members)}  limit={limit}{longest}  "
            f"spend={usd(p.spend_micro_usd)}")


def _emit_projects(args: argparse.Namespace, projects: list[billing_project_pb2.BillingProject]) -> int:
    return print_messages(args, projects, project_line)


def _limit_usd(text: str) -> float | None:
    if text.lower() in ("none", "unlimited"):
        return None
    try:
        return float(text.lstrip("$"))
    except ValueError:
        raise UsageError(f"a limit is an amount in USD or 'none', not {text!r}") from None


def _billing(args: argparse.Namespace) -> int:
    with open_client(args) as client:
        action = args.action
        if action == "list":
            return _emit_projects(args, list(client.billing_projects()))
        if action == "spend":
            total, lines = client.spend(args.name, args.by, args.first_day or "", args.last_day or "")
            if args.json:
                print_json(lines)
                return 0
            print(f"{args.name}  spend={usd(total)}")
            for line in lines:
                key = line.day or line.username or (f"batch {line.batch_id}" if line.batch_id else "")
                print(f"  {key}  {usd(line.cost_micro_usd)}")
            return 0
        change = {
            "show": lambda: client.billing_project(args.name),
            "create": lambda: client.create_billing_project(args.name, args.member or (),
                                                            _limit_usd(args.limit) if args.limit else None),
            "add-member": lambda: client.add_member(args.name, args.username),
            "remove-member": lambda: client.remove_member(args.name, args.username),
            "limit": lambda: client.set_limit(args.name, _limit_usd(args.usd), args.max_job_duration),
            "close": lambda: client.close_billing_project(args.name),
            "reopen": lambda: client.reopen_billing_project(args.name),
        }[action]
        return _emit_projects(args, [change()])


def user_line(u: user_pb2.User) -> str:
    roles = ",".join(user_pb2.Role.Name(r).removeprefix("ROLE_").lower() for r in u.roles)
    kind = user_pb2.UserKind.Name(u.kind).removeprefix("USER_KIND_").lower()
    state = user_pb2.UserState.Name(u.state).removeprefix("USER_STATE_").lower()
    return f"{u.username}  {kind}  {state}  roles={roles}" + (f"  {u.display_name}" if u.display_name else "")


def _users(args: argparse.Namespace) -> int:
    with open_client(args) as client:
        if args.action == "token":
            # 0 is sent as 0, for the server to refuse: it once meant "the default", 30 days, silently.
            token, secret = client.create_token(args.name, args.username,
                                                args.ttl_days * 86400 if args.ttl_days is not None else None)
            if args.json:
                print_json([token])
            print(secret)  # shown once: the service keeps only its hash
            return 0
        if args.action == "list":
            users = list(client.users())
        elif args.action == "create":
            password = os.environ.get("CORRAL_NEW_PASSWORD") or (
                sys.stdin.readline().rstrip("\n") if args.password_stdin else None)
            users = [client.create_user(args.username, args.role or ("user",), password, args.service,
                                        args.display_name or "", args.email or "")]
        else:
            users = [client.deactivate_user(args.username)]
    if args.json:
        print_json(users)
    else:
        for u in users:
            print(user_line(u))
    return 0


def when_text(at: Any) -> str:
    """A Timestamp as `2026-01-02 03:04:05Z`; '-' when unset."""
    return f"{at.ToDatetime():%Y-%m-%d %H:%M:%S}Z" if at.seconds or at.nanos else "-"


def pool_line(p: fleet_pb2.Pool) -> str:
    machine = (f"cores={format_mcpu(p.cores_mcpu)} memory={format_bytes(p.memory_bytes)} "
               f"storage={format_bytes(p.storage_bytes)}" if p.shared else "machine per job")
    return (f"{p.name}  {p.provider}  {p.machine_type or '-'}  {machine}  spot={'yes' if p.spot else 'no'}  "
            f"max={p.max_instances}  {'enabled' if p.enabled else 'disabled'}  "
            f"pending={p.n_pending} active={p.n_active} inactive={p.n_inactive}"
            + (f"  paused by {p.paused_by} at {when_text(p.paused_at)}" if p.paused else ""))


def instance_line(i: fleet_pb2.Instance) -> str:
    state = fleet_pb2.InstanceState.Name(i.state).removeprefix("INSTANCE_STATE_").lower()
    free = format_mcpu(i.free_cores_mcpu) if i.HasField("free_cores_mcpu") else "-"
    return (f"{i.name}  {i.pool}  {state}  cores={format_mcpu(i.cores_mcpu)} free={free}  "
            f"running={i.n_running_attempts}  heartbeat={when_text(i.last_heartbeat_at)}  "
            f"created={when_text(i.created_at)}")


def _admin(args: argparse.Namespace) -> int:
    with open_client(args) as client:
        if args.action == "pools":
            found: list[Any] = client.pools()
            line: Callable[[Any], str] = pool_line
        else:
            found, line = list(client.instances(args.pool or "", args.state)), instance_line
    return print_messages(args, found, line)


def _pools(args: argparse.Namespace) -> int:
    with open_client(args) as client:
        if args.action == "ls":
            found = client.pools()
        else:
            found = [(client.pause_pool if args.action == "pause" else client.resume_pool)(args.pool)]
    return print_messages(args, found, pool_line)


def add_commands(commands: Any) -> None:
    """Add `billing`, `users` and `admin` with their subcommands."""
    billing = commands.add_parser("billing", help="billing projects: members, limits, spend")
    actions = billing.add_subparsers(title="actions", dest="action", metavar="ACTION", required=True)
    with_json(actions.add_parser("list", help="the projects you may see"))
    for name, text in (("show", "one project"), ("close", "refuse new batches (admin)"),
                       ("reopen", "accept batches again (admin)")):
        with_json(actions.add_parser(name, help=text)).add_argument("name")
    create = with_json(actions.add_parser("create", help="a new project (admin)"))
    create.add_argument("name")
    create.add_argument("--member", action="append", help="a member's username (repeatable)")
    create.add_argument("--limit", help="spending limit in USD (default: none)")
    for name, text in (("add-member", "add a member (admin)"), ("remove-member", "remove a member (admin, or yourself)")):
        parser = with_json(actions.add_parser(name, help=text))
        parser.add_argument("name")
        parser.add_argument("username")
    limit = with_json(actions.add_parser("limit", help="set the spending limit (admin)"))
    limit.add_argument("name")
    limit.add_argument("usd", help="amount in USD, or 'none'")
    limit.add_argument("--max-job-duration", type=seconds_option, metavar="DURATION",
                       help="timeout of the project's jobs that set none, while it has a limit: their worst-case "
                            "cost is reserved for it; seconds, or with a unit: 90s, 30m, 2h, 1h30m (default: kept; "
                            "1h at first)")
    spend = with_json(actions.add_parser("spend", help="what the project spent"))
    spend.add_argument("name")
    spend.add_argument("--by", choices=("day", "batch", "user"), help="split the total into lines")
    spend.add_argument("--from", dest="first_day", metavar="YYYY-MM-DD")
    spend.add_argument("--to", dest="last_day", metavar="YYYY-MM-DD")
    billing.set_defaults(run=_billing, words=option_words(BILLING_OPTIONS))

    users = commands.add_parser("users", help="people, service identities and their tokens (admin)")
    actions = users.add_subparsers(title="actions", dest="action", metavar="ACTION", required=True)
    with_json(actions.add_parser("list", help="every user"))
    create = with_json(actions.add_parser("create", help="a new user"))
    create.add_argument("username")
    create.add_argument("--role", action="append", choices=("user", "developer", "admin"),
                        help="a role (repeatable; default: user)")
    create.add_argument("--service", action="store_true", help="a service identity (no password)")
    create.add_argument("--password-stdin", action="store_true",
                        help="read an initial password from stdin (or set CORRAL_NEW_PASSWORD)")
    create.add_argument("--display-name")
    create.add_argument("--email")
    token = with_json(actions.add_parser("token", help="a new API token for a user; prints its secret"))
    token.add_argument("username")
    token.add_argument("--name", default="cli", help="the token's name")
    token.add_argument("--ttl-days", type=float,
                       help="validity in days, more than 0 and at most 366 (default: 30; a token never lasts for good)")
    deactivate = with_json(actions.add_parser("deactivate", help="deactivate a user and revoke their tokens"))
    deactivate.add_argument("username")
    users.set_defaults(run=_users, words=option_words(USERS_OPTIONS))

    admin = commands.add_parser("admin", help="the deployment's pools and instances (admin)")
    actions = admin.add_subparsers(title="actions", dest="action", metavar="ACTION", required=True)
    with_json(actions.add_parser("pools", help="every pool, with its instances' counts by state"))
    instances = with_json(actions.add_parser("instances", help="instances by name (default: all but deleted)"))
    instances.add_argument("--pool", help="only this pool's")
    instances.add_argument("--state", choices=("pending", "active", "inactive", "deleted"), help="only in this state")
    admin.set_defaults(run=_admin, words=option_words(ADMIN_OPTIONS))

    pools = commands.add_parser("pools", help="pause and resume pools (admin)")
    actions = pools.add_subparsers(title="actions", dest="action", metavar="ACTION", required=True)
    with_json(actions.add_parser("ls", help="every pool, as `corral admin pools`"))
    for action, words in (("pause", "nothing new starts in the pool and it gets no new machine; running jobs "
                                    "finish"), ("resume", "the pool's ready jobs are scheduled again")):
        with_json(actions.add_parser(action, help=words)).add_argument("pool")
    pools.set_defaults(run=_pools)
