"""A server's refusal said in the words the user typed.

The API names what it refuses by the request's field path and in its own
units (`limit_micro_usd`, `jobs[0].resources.cores_mcpu`), which is right
for API users and wrong for someone who typed `corral billing limit tiny -5`
or `cores: 100`. Each command says which request field each of its options
sets (`Option`), `corral submit` knows where its batch file wrote each field
(corral.batch_file_words), and this module rewrites the refusal's field
violations with those names and units. The error itself keeps the server's
field paths (`CorralError.field_violations`), and `corral --debug` prints
them: only the line the CLI prints changes.

A server that cannot be reached is said as a sentence too
(`unreachable_words`), not as gRPC's "failed to connect to all addresses".
Pure: no I/O, no gRPC calls.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping

import grpc

from corral.errors import CorralError, FieldViolation
from corral.sizes import binary_size

GENERIC_MESSAGES = ("invalid request", "request fields over their limits")
"""Messages that say nothing the violations do not (services.common.errors' default, and the field limits'
of services.common.server): the line is the violations alone."""


@dataclasses.dataclass(frozen=True)
class Unit:
    """How a whole number in the server's unit is said in the user's (cores for millicores, USD for micro-USD)."""

    say: Callable[[int], str]
    server_suffix: str
    """How the server's names of this unit end: a setting named in parentheses, `(max_cores_mcpu)`, counts in
    the server's unit, so it is left out where the numbers are said in the user's."""


CORES = Unit(lambda mcpu: f"{mcpu / 1000:g}", "_mcpu")
USD = Unit(lambda micro_usd: f"{micro_usd / 1e6:,.2f}".removesuffix(".00"), "_micro_usd")
SIZE = Unit(binary_size, "_bytes")

_NUMBER = re.compile(r"(?<![\w.,[])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?![\w.]|,\d)")
"""A whole number standing alone (`64000`, `1,000`), not part of a name, a decimal or `1e9`."""


def in_unit(description: str, unit: Unit | None) -> str:
    """`description` with each whole number said in `unit`, and settings named in the server's unit dropped."""
    if unit is None:
        return description
    said = _NUMBER.sub(lambda m: unit.say(int(m.group().replace(",", ""))), description)
    return re.sub(rf"\s*\(\w+{re.escape(unit.server_suffix)}\)", "", said)


@dataclasses.dataclass(frozen=True)
class Option:
    """How a command line sets one request field."""

    name: str
    """The option or argument as the user types or reads it: `--ttl-days`, `the limit in USD`."""
    unit: Unit | None = None
    """The unit the user gives it in, when the field's is another."""
    flag: bool = False
    """A switch (`--replace`): a message's `FIELD: true` is this option."""


def option_words(options: Mapping[str, Option]) -> Callable[[CorralError], str | None]:
    """The refusal line of a command whose options set the request fields `options` names."""
    return lambda error: option_refusal(error, options)


def option_refusal(error: CorralError, options: Mapping[str, Option]) -> str | None:
    """`error`'s line with each request field one of `options` sets named as the option and said in its unit;
    None when no field of the refusal is one of them (the line stays the server's)."""
    message = error.message
    changed = False
    for field, option in options.items():
        if option.flag:
            message, n = re.subn(rf"\b{re.escape(field)}: true\b", option.name, message)
            changed = changed or bool(n)
    violations = []
    for v in error.field_violations:
        option = options.get(v.field)
        if option is not None:
            violations.append(FieldViolation(option.name, in_unit(v.description, option.unit)))
            changed = True
        else:
            violations.append(v)
    if not changed:
        return None
    return line(message, violations)


def line(message: str, violations: list[FieldViolation]) -> str:
    """The message and the violations as one line, as CorralError says them (a generic message left out)."""
    said = "; ".join(f"{v.field}: {v.description}" if v.field else v.description for v in violations)
    if not said:
        return message
    return said if message in GENERIC_MESSAGES else f"{message} ({said})"


# ------------------------------------------------------------------ servers that cannot be reached

UP_HINT = "is corral up running?"
NOT_TRUSTED = "its TLS certificate is not trusted (check the profile's CA certificate, --ca-cert)"
TLS_FAILED = "the TLS handshake failed (is it corral's TLS port, and the profile's CA certificate its CA?)"
REFUSED = "connection refused"
_CAUSES = (
    # (what gRPC's details say, in lower case; the words for it)
    ("connection refused", REFUSED),
    ("dns resolution failed", "no such host (DNS lookup failed)"),
    ("errors resolving", "no such host (DNS lookup failed)"),
    ("name or service not known", "no such host (DNS lookup failed)"),
    ("certificate_verify_failed", NOT_TRUSTED),
    ("certificate verify failed", NOT_TRUSTED),
    ("handshake", TLS_FAILED),
    ("ssl", TLS_FAILED),
    ("timed out", "the connection timed out"),
    ("network is unreachable", "the network is unreachable"),
    ("no route to host", "no route to host"),
    ("connection reset", "the connection was reset"),
    ("socket closed", "the connection was closed"),
)
_CONNECTING = ("failed to connect to all addresses", "errors resolving", "dns resolution failed", "ssl handshake",
               "tls handshake", "connections to all backends failing")
"""How gRPC's own details begin when the channel never reached a server. A server's own UNAVAILABLE (its
database or the auth service away) begins otherwise, whatever it says after: it is left as the server said it."""


def unreachable_words(address: str, code: grpc.StatusCode, details: str,
                      probe: Callable[[str], str | None] | None = None) -> str | None:
    """A sentence for a call that never reached corral at `address` (UNAVAILABLE from the channel itself,
    DEADLINE_EXCEEDED), or None for an answer of the server's (its own UNAVAILABLE says why in its words).
    `probe(address)` may find a better cause where gRPC says the connection was refused or the handshake
    failed (corral.reachability: gRPC names only the last address it tried, and not always why)."""
    lowered = details.lower()
    if code == grpc.StatusCode.DEADLINE_EXCEEDED and lowered == "deadline exceeded":  # gRPC's, not a server's
        return f"cannot reach corral at {address}: no answer in time (deadline exceeded); {UP_HINT}"
    if code != grpc.StatusCode.UNAVAILABLE or not lowered.startswith(_CONNECTING):
        return None
    cause = next((words for found, words in _CAUSES if found in lowered), "the connection failed")
    if cause in (REFUSED, TLS_FAILED) and probe is not None:  # gRPC's words for the last address it tried
        cause = probe(address) or cause
    hint = "" if "TLS" in cause else f"; {UP_HINT}"
    return f"cannot reach corral at {address}: {cause}{hint}"
