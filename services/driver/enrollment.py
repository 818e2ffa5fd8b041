"""WorkerEnrollmentService: a new machine's worker gets its certificate without a key being shipped to it.

The autoscaler records each instance with a fresh activation token, and the
cloud provider puts only that token (and the deployment CA's certificate) in
the machine's boot data (services.driver.providers.worker_metadata). The
worker makes its key on the machine and calls Enroll with the token and a
certificate signing request; the driver checks the request, consumes the
token in the database (one conditional UPDATE: once, even under concurrent
calls; procedure enroll_instance) and signs a short-lived certificate for
`worker-INSTANCE` with the worker issuer. Before the certificate expires the
worker calls Renew over mutual TLS with it, and gets a new one for the same
name while its instance is live.

Who may call Enroll: the caller has no certificate yet. It comes through the
internal gateway's enrollment listener (TLS, no client certificate), which
forwards this one method to the drivers under the gateway's own certificate;
or, where there is no gateway, to the driver's own enrollment listener, which
serves this service alone. The token is what authenticates it; every refusal
of a token says the same thing, so a caller learns nothing of which instances
exist or why.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import re

import grpc
from google.protobuf import timestamp_pb2

from corral.driver.v1 import worker_enrollment_service_pb2 as pb
from corral.driver.v1 import worker_enrollment_service_pb2_grpc
from services.common.errors import FieldViolation, InvalidRequest, PermissionDenied
from services.common.identity import Principal, current_principal
from services.common.tls import MAX_CSR_BYTES, BadRequest, WorkerIssuer, checked_request
from services.db.database import PermissionDeniedError
from services.driver.store import DriverStore

log = logging.getLogger(__name__)

SERVICE_NAME = "corral.driver.v1.WorkerEnrollmentService"
ENROLL_METHOD = f"/{SERVICE_NAME}/Enroll"
"""The one method a caller without a certificate reaches (through the gateway's enrollment listener)."""
ENROLLEE_ROLE = "enrollee"
"""The role of a caller on a driver's own enrollment listener (no certificate): it may call Enroll only."""

INSTANCE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
"""An instance name: it goes into the certificate's URI (spiffe://corral/worker/NAME), so nothing else."""
TOKEN = re.compile(r"[\x21-\x7e]{1,100}")
"""An activation token: printable ASCII without spaces, at most instances.activation_token's 100."""
REFUSED = "activation token refused: it is wrong, already used, expired, or its instance is gone"
"""The one answer to every bad token (no oracle of which instances exist or why)."""


@dataclasses.dataclass(frozen=True)
class EnrollmentSettings:
    """How long tokens and workers' certificates last."""

    token_ttl_s: float = 900.0
    """An activation token enrolls only within this long of its instance's creation (a machine boots and
    enrolls in a minute or two; the rest is margin for a slow boot)."""
    certificate_validity_s: float = 24 * 3600.0
    """How long an enrolled worker's certificate is valid; it renews at two thirds of that."""


async def enrollee(context: grpc.aio.ServicerContext, method: str) -> Principal:
    """The authenticator of a driver's own enrollment listener: whoever calls is an enrollee, whose token
    the method itself checks (and which may call nothing but Enroll: services.common.authz)."""
    return Principal(name=ENROLLEE_ROLE, kind=ENROLLEE_ROLE, role=ENROLLEE_ROLE)


def _timestamp(when: datetime.datetime) -> timestamp_pb2.Timestamp:
    out = timestamp_pb2.Timestamp()
    out.FromDatetime(when)
    return out


def _checked_csr(csr_pem: str, field: str = "csr_pem") -> bytes:
    raw = csr_pem.encode()
    if len(raw) > MAX_CSR_BYTES:
        raise InvalidRequest(FieldViolation(field, f"at most {MAX_CSR_BYTES} bytes, not {len(raw)}"))
    try:
        checked_request(raw)
    except BadRequest as e:
        raise InvalidRequest(FieldViolation(field, str(e))) from None
    return raw


class EnrollmentServicer(worker_enrollment_service_pb2_grpc.WorkerEnrollmentServiceServicer):
    """See the module docstring. Without a worker issuer (a driver not given one) every call is refused."""

    def __init__(self, store: DriverStore, issuer: WorkerIssuer | None,
                 settings: EnrollmentSettings = EnrollmentSettings()):
        self._store = store
        self._issuer = issuer
        self._settings = settings

    def _validity(self) -> datetime.timedelta:
        return datetime.timedelta(seconds=self._settings.certificate_validity_s)

    def _require_issuer(self) -> WorkerIssuer:
        if self._issuer is None:
            raise PermissionDenied("this driver issues no worker certificates (it has no worker issuer)")
        return self._issuer

    async def Enroll(self, request: pb.EnrollRequest, context: grpc.aio.ServicerContext) -> pb.EnrollResponse:
        violations = []
        if not INSTANCE_NAME.fullmatch(request.instance_name):
            violations.append(FieldViolation("instance_name", "1 to 100 letters, digits, '.', '_' or '-', "
                                                              "starting with a letter or digit"))
        if not TOKEN.fullmatch(request.activation_token):
            violations.append(FieldViolation("activation_token", "1 to 100 printable characters, no spaces"))
        if violations:
            raise InvalidRequest(violations)
        # The request is checked before the token is consumed: a bad one must not use the token up.
        csr = _checked_csr(request.csr_pem)
        issuer = self._require_issuer()
        try:
            await self._store.enroll_instance(request.instance_name, request.activation_token,
                                              int(self._settings.token_ttl_s * 1000))
        except PermissionDeniedError:
            log.warning("enrollment refused for instance %r", request.instance_name)
            raise PermissionDenied(REFUSED) from None
        chain, expires = issuer.sign_request(request.instance_name, csr, self._validity())
        log.info("enrolled %s: certificate valid until %s", request.instance_name, expires.isoformat())
        return pb.EnrollResponse(certificate_chain_pem=chain.decode(), not_after=_timestamp(expires))

    async def Renew(self, request: pb.RenewRequest, context: grpc.aio.ServicerContext) -> pb.RenewResponse:
        principal = current_principal()
        instance = principal.name.removeprefix("worker-")
        if principal.role != "worker" or not INSTANCE_NAME.fullmatch(instance):
            raise PermissionDenied(f"{principal.name} is not a worker")
        csr = _checked_csr(request.csr_pem)
        issuer = self._require_issuer()
        if await self._store.instance_state(instance) not in ("pending", "active"):
            raise PermissionDenied(f"instance {instance} is no longer live: its certificate is not renewed")
        chain, expires = issuer.sign_request(instance, csr, self._validity())
        log.info("renewed the certificate of %s until %s", instance, expires.isoformat())
        return pb.RenewResponse(certificate_chain_pem=chain.decode(), not_after=_timestamp(expires))
