"""Authentication as an attacker meets it, over real gRPC: guessing is slowed
down, login time does not tell who exists, an expired token is refused at
once, and a service identity's token never acts as a corral service."""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc
import pytest
from google.protobuf import duration_pb2
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from corral.auth.v1 import auth_service_pb2 as pb
from corral.auth.v1 import auth_service_pb2_grpc, user_pb2
from corral.billing.v1 import billing_service_pb2 as bpb
from corral.billing.v1 import billing_service_pb2_grpc
from services.auth.app import AuthApp, AuthConfig, start
from services.auth.client import RemoteTokenVerifier
from services.auth.login_limits import UNLIMITED, Backoff, LoginLimits
from services.auth.store import AuthStore, check_password, hash_password
from services.common.errors import PermissionDenied, Unauthenticated
from services.common.identity import BearerAuthenticator, Principal, TokenAnswer
from services.common.tls import DevCertificateAuthority
from services.db.database import DatabaseConfig
from services.frontend.app import FrontendConfig
from services.frontend.app import start as start_frontend
from tests.service.conftest import bearer, limits_for_tests, person_channel, service_channel
from tests.service.test_auth import FakeContext

UNAUTHENTICATED, EXHAUSTED = grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.RESOURCE_EXHAUSTED
PASSWORD = "correct horse"


class ManualClock:
    """Seconds that move only when the test moves them."""

    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


@pytest.fixture
async def auth_with(db_config: DatabaseConfig, certs: DevCertificateAuthority) -> AsyncIterator[Callable]:
    """`await auth_with(limits, clock_s=..., forwarded_for_header=...)`: an auth service of the test's own."""
    apps: list[AuthApp] = []

    async def make(limits: LoginLimits, clock_s: Callable[[], float] = time.monotonic,
                   forwarded_for_header: str | None = None) -> AuthApp:
        app = await start(AuthConfig(db_config.to_url(), certs.directory, login_limits=limits,
                                     forwarded_for_header=forwarded_for_header), clock_s=clock_s)
        apps.append(app)
        return app

    try:
        yield make
    finally:
        for app in apps:
            await app.stop()


async def login(stub: auth_service_pb2_grpc.AuthServiceStub, username: str, password: str,
                metadata: tuple = ()) -> tuple[grpc.StatusCode, str, float | None]:
    """The call's code, message and RetryInfo delay (seconds) if any."""
    try:
        await stub.Login(pb.LoginRequest(username=username, password=password), metadata=metadata, timeout=30)
    except grpc.aio.AioRpcError as e:
        status = rpc_status.from_call(e)
        delay = None
        for detail in status.details if status else ():
            info = error_details_pb2.RetryInfo()
            if detail.Unpack(info):
                delay = info.retry_delay.ToNanoseconds() / 1e9
        return e.code(), e.details() or "", delay
    return grpc.StatusCode.OK, "", None


async def test_the_20th_rapid_wrong_password_is_refused_until_the_delay_and_then_the_right_one_works(
        auth_with: Callable, certs: DevCertificateAuthority) -> None:
    clock = ManualClock()
    app = await auth_with(LoginLimits(per_source=Backoff(free_failures=1000)), clock_s=clock)
    await AuthStore(app.db).create_user("alice", password=PASSWORD)
    async with person_channel(certs.issue("someone"), app.public_port) as channel:
        stub = auth_service_pb2_grpc.AuthServiceStub(channel)
        answers = [await login(stub, "alice", f"guess {i}") for i in range(20)]
        assert [code for code, _, _ in answers] == [UNAUTHENTICATED] * 5 + [EXHAUSTED] * 15
        code, message, delay = answers[19]
        assert delay == 1.0 and "per_user" in message and "try again in 1 s" in message
        # While locked even the right password is refused, unchecked.
        assert (await login(stub, "alice", PASSWORD))[0] == EXHAUSTED
        clock.now_s += delay
        assert (await login(stub, "alice", PASSWORD))[0] == grpc.StatusCode.OK
        # A successful login resets: the next wrong password is merely wrong.
        assert (await login(stub, "alice", "oops"))[0] == UNAUTHENTICATED
        # Delays grow: after five failures in a row 1 s, after the sixth 2 s.
        answers = [await login(stub, "alice", "guess") for _ in range(5)]
        assert [code for code, _, _ in answers] == [UNAUTHENTICATED] * 4 + [EXHAUSTED]
        clock.now_s += 1.0
        assert (await login(stub, "alice", "guess"))[0] == UNAUTHENTICATED
        assert (await login(stub, "alice", "guess"))[:3:2] == (EXHAUSTED, 2.0)
        # An unknown username is throttled in exactly the same way: refusals tell nobody who exists.
        unknown = [await login(stub, "nobody", f"guess {i}") for i in range(20)]
        assert [(c, m, d) for c, m, d in unknown] == [(c, m, d) for c, m, d in
                                                      [await login(stub, "nobody2", f"guess {i}") for i in range(20)]]
        assert [c for c, _, _ in unknown] == [UNAUTHENTICATED] * 5 + [EXHAUSTED] * 15


async def test_one_address_spraying_usernames_is_slowed_and_the_forwarded_header_counts_only_when_trusted(
        auth_with: Callable, certs: DevCertificateAuthority) -> None:
    limits = LoginLimits(per_user=Backoff(free_failures=1000), per_source=Backoff(free_failures=3))
    direct, gateway = await auth_with(limits, ManualClock()), await auth_with(
        limits, ManualClock(), forwarded_for_header="X-Forwarded-For")
    tls = certs.issue("someone")
    async with person_channel(tls, direct.public_port) as a, person_channel(tls, gateway.public_port) as b:
        direct_stub, gateway_stub = auth_service_pb2_grpc.AuthServiceStub(a), auth_service_pb2_grpc.AuthServiceStub(b)

        def forwarded(i: int) -> tuple:
            return (("x-forwarded-for", f"198.51.100.{i}"),)

        # Not trusted by default: writing the header does not make a new source.
        codes = [(await login(direct_stub, f"user{i}", "x", forwarded(i)))[0] for i in range(4)]
        assert codes == [UNAUTHENTICATED] * 3 + [EXHAUSTED]
        message = (await login(direct_stub, "someone-else", "x"))[1]
        assert "per_source" in message and "from this address" in message
        # Trusted: each forwarded address is a source of its own...
        codes = [(await login(gateway_stub, f"user{i}", "x", forwarded(i)))[0] for i in range(4)]
        assert codes == [UNAUTHENTICATED] * 4
        # ...and its last entry is the one that counts (the gateway's), not what the client wrote first.
        codes = [(await login(gateway_stub, f"user{i}", "x", (("x-forwarded-for", f"10.9.9.{i}, 192.0.2.1"),)))[0]
                 for i in range(4)]
        assert codes == [UNAUTHENTICATED] * 3 + [EXHAUSTED]


async def test_login_takes_as_long_for_unknown_deactivated_and_service_users_as_for_a_wrong_password(
        auth_with: Callable, certs: DevCertificateAuthority) -> None:
    """Each round tries every kind once, in random order, so a loaded machine slows them alike;
    the median over rounds of each kind's difference from the wrong password in the same round
    must be under half a password hash (a leak is the whole hash: without the dummy hash an
    unknown username answers in ~1 ms against ~45 ms)."""
    app = await auth_with(UNLIMITED)
    people = AuthStore(app.db)
    await people.create_user("alice", password=PASSWORD)
    await people.create_user("dora", password=PASSWORD)
    await people.deactivate_user("dora")
    await people.create_user("pipeline", kind="service")
    kinds = {"wrong password": ("alice", "wrong"), "unknown user": ("nobody", "wrong"),
             "deactivated user": ("dora", PASSWORD), "service identity": ("pipeline", "wrong")}
    rounds: list[dict[str, float]] = []
    rng = random.Random(9)
    async with person_channel(certs.issue("someone"), app.public_port) as channel:
        stub = auth_service_pb2_grpc.AuthServiceStub(channel)
        for round_ in range(28):
            order = list(kinds)
            rng.shuffle(order)
            times = {}
            for kind in order:
                started = time.perf_counter()
                code, _, _ = await login(stub, *kinds[kind])
                times[kind] = time.perf_counter() - started
                assert code == UNAUTHENTICATED, kind
            if round_ >= 3:  # the first rounds warm up connections and caches
                rounds.append(times)
    stored = hash_password("x")
    hash_s = min(_timed(lambda: check_password("y", stored)) for _ in range(3))
    differences = {kind: statistics.median(r[kind] - r["wrong password"] for r in rounds) for kind in kinds}
    report = (", ".join(f"{kind} {1000 * statistics.median(r[kind] for r in rounds):.1f} ms" for kind in kinds)
              + f"; median differences {', '.join(f'{1000 * d:+.1f}' for d in differences.values())} ms"
              + f"; one hash {1000 * hash_s:.1f} ms")
    for difference in differences.values():
        assert abs(difference) < 0.5 * hash_s, report


def _timed(work: Callable[[], object]) -> float:
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


async def test_an_expired_token_is_refused_at_once_by_a_frontend_that_caches_tokens(
        auth_app: AuthApp, admin_token: str, db_config: DatabaseConfig, certs: DevCertificateAuthority,
        tmp_path: Path) -> None:
    frontend = await start_frontend(FrontendConfig(db_config.to_url(), certs.directory,
                                                   f"localhost:{auth_app.internal_port}",
                                                   f"file://{tmp_path / 'blobs'}", token_cache_s=60,
                                                   limits=limits_for_tests()))
    try:
        tls = certs.issue("someone")
        async with person_channel(tls, auth_app.public_port) as a, person_channel(tls, frontend.public_port) as f:
            created = await auth_service_pb2_grpc.AuthServiceStub(a).CreateToken(
                pb.CreateTokenRequest(name="brief", ttl=duration_pb2.Duration(seconds=1)), metadata=bearer(admin_token))
            billing = billing_service_pb2_grpc.BillingServiceStub(f)
            await billing.ListBillingProjects(bpb.ListBillingProjectsRequest(), metadata=bearer(created.secret))
            expires_at_s = created.token.expires_at.ToNanoseconds() / 1e9
            while time.time() < expires_at_s:  # wait for the expiry itself, not a guess at it
                await asyncio.sleep(0.02)
            with pytest.raises(grpc.aio.AioRpcError) as error:
                await billing.ListBillingProjects(bpb.ListBillingProjectsRequest(), metadata=bearer(created.secret))
            assert error.value.code() == UNAUTHENTICATED
    finally:
        await frontend.stop()


async def test_cached_answers_end_at_the_cache_time_the_verifier_allows_or_the_expiry() -> None:
    now = [1000.0]
    answers = {"long": TokenAnswer(Principal("alice", "person"), expires_at_ms=2_000_000, cache_s=5),
               "short": TokenAnswer(Principal("bob", "person"), expires_at_ms=1_002_000, cache_s=5)}
    calls: list[str] = []

    async def verify(token: str) -> TokenAnswer | None:
        calls.append(token)
        return answers.get(token)

    authenticate = BearerAuthenticator(verify, cache_s=60, clock_s=lambda: now[0])
    for token in ("long", "short"):
        await authenticate(FakeContext(bearer(token)), "/m")
    now[0] = 1001.9
    await authenticate(FakeContext(bearer("long")), "/m")
    await authenticate(FakeContext(bearer("short")), "/m")
    assert calls == ["long", "short"]  # both cached
    now[0] = 1002.0  # bob's token expires: refused at once, even though auth would still say yes
    with pytest.raises(Unauthenticated):
        await authenticate(FakeContext(bearer("short")), "/m")
    now[0] = 1005.0  # auth's cache time (5 s) is over for alice's: asked again
    await authenticate(FakeContext(bearer("long")), "/m")
    assert calls == ["long", "short", "short", "long"]
    now[0] = 900.0  # the clock went back: an answer is not stretched, it is asked again
    await authenticate(FakeContext(bearer("long")), "/m")
    assert calls[-1] == "long" and len(calls) == 5


async def test_no_bearer_token_authenticates_a_corral_service(
        auth_app: AuthApp, admin_token: str, certs: DevCertificateAuthority) -> None:
    people = AuthStore(auth_app.db)
    await people.create_user("pipeline", kind="service", roles=frozenset({"user", "admin"}))
    _, robot = await people.create_token("pipeline", "api", name="ci")
    tls = certs.issue("someone")
    async with person_channel(tls, auth_app.public_port) as public, \
            service_channel(certs.issue("frontend"), auth_app.internal_port) as internal:
        stub = auth_service_pb2_grpc.AuthServiceStub(public)
        # The service identity is itself (roles and all) where people are served...
        me = await stub.WhoAmI(pb.WhoAmIRequest(), metadata=bearer(robot))
        assert (me.user.username, me.user.kind) == ("pipeline", user_pb2.USER_KIND_SERVICE)
        # ...but may not resolve other people's tokens: VerifyToken is for corral services, by certificate.
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await stub.VerifyToken(pb.VerifyTokenRequest(token=admin_token), metadata=bearer(robot))
        assert error.value.code() == grpc.StatusCode.PERMISSION_DENIED
        # What other services make of its token: a service account, which require_service refuses.
        authenticate = BearerAuthenticator(RemoteTokenVerifier(internal))
        principal = await authenticate(FakeContext(bearer(robot)), "/m")
        assert principal is not None and (principal.name, principal.kind) == ("pipeline", "service_account")
        with pytest.raises(PermissionDenied):
            principal.require_service()

    async def claims_a_service(token: str) -> TokenAnswer:
        return TokenAnswer(Principal("driver", "service"), expires_at_ms=2**60)

    with pytest.raises(Unauthenticated):
        await BearerAuthenticator(claims_a_service)(FakeContext(bearer("x")), "/m")


async def test_overlong_credentials_are_refused_before_any_hashing(auth_app: AuthApp,
                                                                   certs: DevCertificateAuthority) -> None:
    async with person_channel(certs.issue("someone"), auth_app.public_port) as channel:
        stub = auth_service_pb2_grpc.AuthServiceStub(channel)
        code, message, _ = await login(stub, "a" * 65, "p" * 1025)
        assert code == grpc.StatusCode.INVALID_ARGUMENT
