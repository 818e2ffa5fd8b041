"""Which service identities may call which internal method.

The rule lives in the contracts: each internal RPC names its callers with
the `corral.authz.v1.allowed_callers` method option (protos/corral/authz/v1).
`RequestInterceptor` asks `refusal` on every call, so no servicer has to
remember to check:

- on an internal (mutual TLS) listener, a caller whose role the method does
  not name is refused, and a method that names nobody is refused to all
  (deny by default: a public method served on an internal port is not a
  back door for a worker's certificate);
- on a public listener, a method that names callers is internal and refused
  to every bearer token, whatever its user's kind or roles.
"""

from __future__ import annotations

import functools

from google.protobuf import descriptor_pool

from corral.authz.v1 import authz_pb2
from services.common.identity import Principal


@functools.lru_cache(maxsize=None)
def allowed_callers(full_method: str) -> frozenset[str]:
    """The roles a method names ('/pkg.Service/Method'); empty for a public method or one unknown."""
    service_name, _, method_name = full_method.lstrip("/").partition("/")
    try:
        service = descriptor_pool.Default().FindServiceByName(service_name)
    except KeyError:
        return frozenset()
    method = service.methods_by_name.get(method_name)
    if method is None:
        return frozenset()
    return frozenset(method.GetOptions().Extensions[authz_pb2.allowed_callers])


def refusal(full_method: str, internal: bool, principal: Principal | None) -> str | None:
    """Why the caller may not call the method on this kind of listener, or None if it may."""
    callers = allowed_callers(full_method)
    if not internal:
        if callers:
            return f"{full_method} is internal: only corral services call it, over mutual TLS"
        return None
    if principal is None or principal.role not in callers:
        who = principal.name if principal is not None else "an anonymous caller"
        allowed = ", ".join(sorted(callers)) or "no service"
        return f"{who} may not call {full_method} (allowed: {allowed})"
    return None
