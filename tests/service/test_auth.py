"""The auth service over real gRPC: TLS for people, mutual TLS for services."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from google.protobuf import duration_pb2
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from grpc_status import rpc_status

from corral.auth.v1 import auth_service_pb2 as pb
from corral.auth.v1 import auth_service_pb2_grpc, user_pb2
from services.auth.app import AuthApp
from services.auth.client import RemoteTokenVerifier
from services.common.identity import BearerAuthenticator
from services.common.tls import DevCertificateAuthority
from tests.service.conftest import bearer, person_channel, service_channel


@pytest.fixture
async def stub(auth_app: AuthApp, certs: DevCertificateAuthority):
    async with person_channel(certs.issue("someone"), auth_app.public_port) as channel:
        yield auth_service_pb2_grpc.AuthServiceStub(channel)


async def create_alice(stub, admin_token: str) -> str:
    await stub.CreateUser(pb.CreateUserRequest(username="alice", password="correct horse",
                                               roles=[user_pb2.ROLE_USER]), metadata=bearer(admin_token))
    login = await stub.Login(pb.LoginRequest(username="alice", password="correct horse"))
    return login.token


async def user_count(auth_app: AuthApp) -> int:
    row = await auth_app.db.fetchone("SELECT COUNT(*) AS n FROM users")
    return int(row["n"])


async def test_login_whoami_logout(stub, admin_token: str) -> None:
    token = await create_alice(stub, admin_token)
    me = await stub.WhoAmI(pb.WhoAmIRequest(), metadata=bearer(token))
    assert (me.user.username, list(me.user.roles)) == ("alice", [user_pb2.ROLE_USER])
    await stub.Logout(pb.LogoutRequest(), metadata=bearer(token))
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await stub.WhoAmI(pb.WhoAmIRequest(), metadata=bearer(token))
    assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED


@pytest.mark.parametrize("credentials", ["anonymous", "garbage", "expired"])
async def test_every_rpc_refuses_bad_credentials(stub, auth_app: AuthApp, admin_token: str, credentials: str) -> None:
    metadata: tuple = ()
    if credentials == "garbage":
        metadata = bearer("not-a-token")
    elif credentials == "expired":
        short = await stub.CreateToken(pb.CreateTokenRequest(name="short", ttl=duration_pb2.Duration(nanos=1_000_000)),
                                       metadata=bearer(admin_token))
        await asyncio.sleep(0.01)
        metadata = bearer(short.secret)
    before = await user_count(auth_app)
    calls = [
        stub.WhoAmI(pb.WhoAmIRequest(), metadata=metadata),
        stub.Logout(pb.LogoutRequest(), metadata=metadata),
        stub.CreateUser(pb.CreateUserRequest(username="mallory"), metadata=metadata),
        stub.GetUser(pb.GetUserRequest(username="root"), metadata=metadata),
        stub.ListUsers(pb.ListUsersRequest(), metadata=metadata),
        stub.DeactivateUser(pb.DeactivateUserRequest(username="root"), metadata=metadata),
        stub.CreateToken(pb.CreateTokenRequest(name="x"), metadata=metadata),
        stub.ListTokens(pb.ListTokensRequest(), metadata=metadata),
        stub.RevokeToken(pb.RevokeTokenRequest(token_id="x"), metadata=metadata),
    ]
    for call in calls:
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await call
        assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert await user_count(auth_app) == before


async def test_non_admin_cannot_administer(stub, auth_app: AuthApp, admin_token: str) -> None:
    token = await create_alice(stub, admin_token)
    before = await user_count(auth_app)
    for call in [
        stub.CreateUser(pb.CreateUserRequest(username="bob"), metadata=bearer(token)),
        stub.ListUsers(pb.ListUsersRequest(), metadata=bearer(token)),
        stub.DeactivateUser(pb.DeactivateUserRequest(username="root"), metadata=bearer(token)),
        stub.GetUser(pb.GetUserRequest(username="root"), metadata=bearer(token)),
        stub.CreateToken(pb.CreateTokenRequest(username="root"), metadata=bearer(token)),
        # VerifyToken is for corral services (mutual TLS), not people.
        stub.VerifyToken(pb.VerifyTokenRequest(token=admin_token), metadata=bearer(token)),
    ]:
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await call
        assert error.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert await user_count(auth_app) == before


async def test_bad_user_is_invalid_argument_with_field_violations(stub, auth_app: AuthApp, admin_token: str) -> None:
    before = await user_count(auth_app)
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await stub.CreateUser(pb.CreateUserRequest(username="Not Valid!", password="short"),
                              metadata=bearer(admin_token))
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    status = rpc_status.from_call(error.value)
    assert status is not None
    bad_request = error_details_pb2.BadRequest()
    assert status.details[0].Unpack(bad_request)
    assert sorted(v.field for v in bad_request.field_violations) == ["password", "username"]
    assert await user_count(auth_app) == before


async def test_tokens_and_passwords_are_stored_hashed(stub, auth_app: AuthApp, admin_token: str) -> None:
    token = await create_alice(stub, admin_token)
    rows = await auth_app.db.fetchall("SELECT * FROM tokens")
    users = await auth_app.db.fetchall("SELECT * FROM users")
    stored = repr(rows) + repr(users)
    assert token not in stored and token.split(".")[1] not in stored
    assert admin_token.split(".")[1] not in stored
    assert "correct horse" not in stored


async def test_services_verify_tokens_over_mutual_tls(auth_app: AuthApp, certs: DevCertificateAuthority,
                                                      stub, admin_token: str) -> None:
    token = await create_alice(stub, admin_token)
    async with service_channel(certs.issue("frontend"), auth_app.internal_port) as channel:
        verifier = RemoteTokenVerifier(channel)
        answer = await verifier(token)
        assert answer is not None
        assert (answer.principal.name, answer.principal.kind, answer.principal.roles) == (
            "alice", "person", frozenset({"user"}))
        assert await verifier("nope") is None

        # Other services cache answers briefly: one VerifyToken per token per period.
        calls = []

        async def counting(secret: str):
            calls.append(secret)
            return await verifier(secret)

        now = [0.0]
        authenticate = BearerAuthenticator(counting, cache_s=10, clock_s=lambda: now[0])
        context = FakeContext(bearer(token))
        assert (await authenticate(context, "/m")).name == "alice"
        assert (await authenticate(context, "/m")).name == "alice"
        now[0] = 11.0
        assert (await authenticate(context, "/m")).name == "alice"
        assert calls == [token, token]


class FakeContext:
    """Only what BearerAuthenticator reads of a servicer context."""

    def __init__(self, metadata: tuple) -> None:
        self._metadata = metadata

    def invocation_metadata(self) -> tuple:
        return self._metadata


async def test_internal_listener_refuses_a_caller_without_certificate(auth_app: AuthApp,
                                                                      certs: DevCertificateAuthority,
                                                                      admin_token: str) -> None:
    async with person_channel(certs.issue("someone"), auth_app.internal_port) as channel:
        stub = auth_service_pb2_grpc.AuthServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await stub.VerifyToken(pb.VerifyTokenRequest(token=admin_token), timeout=5)
        assert error.value.code() == grpc.StatusCode.UNAVAILABLE
    # A certificate from another CA is refused too.
    other = DevCertificateAuthority(certs.directory.parent / "other-ca").issue("frontend")
    mixed = grpc.ssl_channel_credentials(certs.ca_cert_path.read_bytes(), other.key.read_bytes(),
                                         other.cert.read_bytes())
    async with grpc.aio.secure_channel(f"localhost:{auth_app.internal_port}", mixed) as channel:
        stub = auth_service_pb2_grpc.AuthServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await stub.VerifyToken(pb.VerifyTokenRequest(token=admin_token), timeout=5)
        assert error.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_health_and_reflection_on_both_listeners(auth_app: AuthApp, certs: DevCertificateAuthority) -> None:
    tls = certs.issue("frontend")
    for channel in (person_channel(tls, auth_app.public_port), service_channel(tls, auth_app.internal_port)):
        async with channel:
            health = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service="corral.auth.v1.AuthService"))
            assert health.status == health_pb2.HealthCheckResponse.SERVING
            reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
            responses = reflection.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
            names = [s.name async for r in responses for s in r.list_services_response.service]
            assert "corral.auth.v1.AuthService" in names and "grpc.health.v1.Health" in names
