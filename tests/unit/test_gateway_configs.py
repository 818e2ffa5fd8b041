"""The generated Envoy configs: current in envoy/, accepted by the real Envoy (`--mode validate`), and
routing what the descriptor set says (no route written by hand)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from google.api import annotations_pb2
from google.protobuf import descriptor_pb2

from services.common.identity import GATEWAY_TOKEN_HEADER
from services.common.tls import DevCertificateAuthority
from services.gateway import prepare, write_configs
from services.gateway.__main__ import LOCAL
from services.gateway.__main__ import main as regenerate
from services.gateway.configs import internal_config, public_config
from services.gateway.deployment import Deployment
from services.gateway.descriptors import gateway_descriptor_set, package_descriptor_set, write_descriptor_set
from services.gateway.envoy_process import validate
from services.gateway.routing import internal_services, public_services

REPO = Path(__file__).resolve().parents[2]


def test_the_checked_in_configs_are_current() -> None:
    assert regenerate(["--check"]) == 0, "run: python -m services.gateway"


def test_the_check_sees_a_stale_config(tmp_path: Path) -> None:
    (tmp_path / "local.yaml").write_bytes(LOCAL.read_bytes())
    assert regenerate(["--deployment", str(tmp_path / "local.yaml")]) == 0
    assert regenerate(["--deployment", str(tmp_path / "local.yaml"), "--check"]) == 0
    stale = tmp_path / "envoy-public.yaml"
    stale.write_text(stale.read_text().replace("8443", "8080"))
    assert regenerate(["--deployment", str(tmp_path / "local.yaml"), "--check"]) == 1


def data_dir_for(deployment: Deployment, directory: Path) -> None:
    """The files `deployment` names, laid out under `directory` as corral up's data directory holds them."""
    ca = DevCertificateAuthority(directory / "ca")
    issued = ca.issue("gateway")
    for source, target in ((issued.ca_cert, deployment.tls.ca_cert), (issued.cert, deployment.tls.cert),
                           (issued.key, deployment.tls.key)):
        (directory / target).parent.mkdir(parents=True, exist_ok=True)
        (directory / target).write_bytes(source.read_bytes())
    write_descriptor_set(directory / deployment.descriptor_set)
    (directory / deployment.access_log).parent.mkdir(parents=True, exist_ok=True)


@pytest.mark.parametrize("name", ["public", "internal"])
def test_every_checked_in_config_passes_envoy_validate(name: str, tmp_path: Path) -> None:
    data_dir_for(Deployment.load(LOCAL), tmp_path)
    validate(REPO / "envoy" / f"envoy-{name}.yaml", cwd=tmp_path)


def test_envoy_validate_refuses_a_broken_config(tmp_path: Path) -> None:
    """The check above can fail: a cluster no route knows and a missing descriptor set are caught."""
    deployment = Deployment.load(LOCAL)
    data_dir_for(deployment, tmp_path)
    config = public_config(deployment)
    clusters = config["static_resources"]["clusters"]
    clusters.remove(next(c for c in clusters if c["name"] == "frontend"))
    (tmp_path / "broken.yaml").write_text(yaml.safe_dump(config))
    with pytest.raises(ValueError, match="frontend"):
        validate(tmp_path / "broken.yaml", cwd=tmp_path)
    (tmp_path / deployment.descriptor_set).unlink()
    write_configs(deployment, tmp_path / "configs")
    with pytest.raises(ValueError, match="descriptors"):
        validate(tmp_path / "configs" / "envoy-public.yaml", cwd=tmp_path)


def test_prepare_writes_what_envoy_needs_and_validates_it(tmp_path: Path) -> None:
    """What `corral up` will call: the descriptor set where the description says (relative to Envoy's
    working directory), both configs, each passed by `envoy --mode validate`."""
    deployment = Deployment.load(LOCAL)
    data_dir_for(deployment, tmp_path)
    (tmp_path / deployment.descriptor_set).unlink()
    configs = prepare(deployment, tmp_path / "gateway", cwd=tmp_path)
    assert sorted(configs) == ["internal", "public"]
    assert configs["public"].read_text() == (REPO / "envoy" / "envoy-public.yaml").read_text().replace(
        "from local.yaml", "from a deployment description")
    assert (tmp_path / deployment.descriptor_set).read_bytes() == gateway_descriptor_set()


def routes_of(config: dict) -> list[dict]:  # type: ignore[type-arg]
    listener = config["static_resources"]["listeners"][0]
    manager = listener["filter_chains"][0]["filters"][0]["typed_config"]
    return manager["route_config"]["virtual_hosts"][0]["routes"]


def test_every_annotated_service_is_routed_and_streams_have_no_timeout() -> None:
    deployment = dataclasses.replace(Deployment.load(LOCAL), webs=())
    routes = routes_of(public_config(deployment))
    # The one route that is no upstream's: the OpenAPI document, from its file.
    [document] = [r for r in routes if "direct_response" in r]
    assert document["match"]["path"] == "/api/v1/openapi.json"
    assert document["direct_response"]["body"]["filename"] == "gateway/openapi.json"
    by_match = {r["match"].get("prefix") or r["match"]["path"]: r["route"] for r in routes if "route" in r}
    files = package_descriptor_set().file
    for file in files:
        for service in file.service:
            name = f"{file.package}.{service.name}"
            if file.package in ("corral.driver.v1", "corral.worker.v1"):
                assert f"/{name}/" not in by_match  # internal: never on the public gateway
                continue
            assert by_match[f"/{name}/"]["timeout"] == "65s"
            for method in service.method:
                if method.server_streaming or method.client_streaming:
                    # A stream is a long request, not an idle one: no call timeout, no idle timeout.
                    assert by_match[f"/{name}/{method.name}"]["timeout"] == "0s"
                    assert by_match[f"/{name}/{method.name}"]["idle_timeout"] == "0s"
    assert by_match["/corral.auth.v1.AuthService/"]["cluster"] == "auth"
    assert by_match["/corral.batch.v1.BatchService/WatchBatch"]["cluster"] == "frontend"
    assert by_match["/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"]["timeout"] == "0s"
    internal = {r["match"].get("prefix") or r["match"]["path"]: r["route"]
                for r in routes_of(internal_config(deployment))}
    # WorkerEnrollmentService for Renew, over the worker's mutual TLS (its Enroll the driver refuses there).
    assert internal == {"/corral.driver.v1.DriverService/WorkerSession": {"cluster": "driver", "timeout": "0s",
                                                                         "idle_timeout": "0s"},
                        "/corral.driver.v1.DriverService/": {"cluster": "driver", "timeout": "65s"},
                        "/corral.driver.v1.WorkerEnrollmentService/": {"cluster": "driver", "timeout": "65s"}}


def test_the_enrollment_listener_forwards_enroll_alone_without_client_certificates() -> None:
    """New workers have no certificate: the listener asks for none, strips any forwarded-certificate header,
    and routes one path (a POST of Enroll) to the drivers; everything else is answered 404 by Envoy."""
    config = internal_config(Deployment.load(LOCAL))
    enroll = next(x for x in config["static_resources"]["listeners"] if x["name"] == "enroll")
    assert enroll["address"]["socket_address"] == {"address": "127.0.0.1", "port_value": 8445}
    chain = enroll["filter_chains"][0]
    assert chain["transport_socket"]["typed_config"]["require_client_certificate"] is False
    manager = chain["filters"][0]["typed_config"]
    assert manager["forward_client_cert_details"] == "SANITIZE"
    routes = manager["route_config"]["virtual_hosts"][0]["routes"]
    forwarded = [r for r in routes if "route" in r]
    assert [r["match"]["path"] for r in forwarded] == ["/corral.driver.v1.WorkerEnrollmentService/Enroll"]
    assert routes[-1] == {"match": {"prefix": "/"}, "direct_response": {"status": 404}}
    without = internal_config(dataclasses.replace(Deployment.load(LOCAL), enroll_listen=None))
    assert [x["name"] for x in without["static_resources"]["listeners"]] == ["internal", "internal_stats"]


def test_a_public_package_nobody_serves_is_refused() -> None:
    files = package_descriptor_set()
    file = files.file.add(name="corral/new/v1/new.proto", package="corral.new.v1")
    service = file.service.add(name="NewService")
    method = service.method.add(name="Get", input_type=".corral.auth.v1.WhoAmIRequest",
                                output_type=".corral.auth.v1.WhoAmIResponse")
    method.options.Extensions[annotations_pb2.http].get = "/api/v1/new"  # public, served by nobody
    with pytest.raises(ValueError, match="corral.new.v1"):
        public_services(files)
    assert [s.name for s in internal_services(files)] == ["corral.driver.v1.DriverService",
                                                         "corral.driver.v1.WorkerEnrollmentService"]


def test_the_transcoder_knows_google_rpc_status_and_its_details() -> None:
    names = {f.name for f in descriptor_pb2.FileDescriptorSet.FromString(gateway_descriptor_set()).file}
    assert {"google/rpc/status.proto", "google/rpc/error_details.proto", "corral/batch/v1/batch_service.proto"} <= names


def test_a_description_with_an_unknown_setting_is_refused() -> None:
    data = yaml.safe_load(LOCAL.read_text())
    data["limits"]["max_request_byte"] = 1
    with pytest.raises(ValueError, match="max_request_byte"):
        Deployment.from_dict(data)


@pytest.mark.parametrize("build", [public_config, internal_config])
def test_the_admin_interface_is_a_private_unix_socket_and_stats_go_through_their_own_listener(
        build: Callable[[Deployment], dict]) -> None:  # type: ignore[type-arg]
    """No admin TCP port (it has no authentication and can stop Envoy, and a process-runtime job shares the
    host's network); the statistics listener asks for a client certificate of the CA and forwards one
    path, by GET, to the admin socket."""
    deployment = Deployment.load(LOCAL)
    config = build(deployment)
    assert set(config["admin"]["address"]) == {"pipe"}
    assert config["admin"]["address"]["pipe"]["mode"] == 0o600
    [stats] = [lst for lst in config["static_resources"]["listeners"] if lst["name"].endswith("_stats")]
    chain = stats["filter_chains"][0]
    tls = chain["transport_socket"]["typed_config"]
    assert tls["require_client_certificate"] is True
    assert tls["common_tls_context"]["validation_context"]["trusted_ca"]["filename"] == str(deployment.tls.ca_cert)
    routes = chain["filters"][0]["typed_config"]["route_config"]["virtual_hosts"][0]["routes"]
    forwarded = [r for r in routes if "route" in r]
    assert [r["match"]["path"] for r in forwarded] == ["/stats/prometheus"]
    assert forwarded[0]["match"]["headers"] == [{"name": ":method", "string_match": {"exact": "GET"}}]
    assert all("direct_response" in r for r in routes if "route" not in r)
    [admin] = [c for c in config["static_resources"]["clusters"] if c["name"] == "admin"]
    endpoint = admin["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]
    assert endpoint == {"pipe": {"path": str(config["admin"]["address"]["pipe"]["path"])}}

    # Without a statistics listener, no admin cluster either.
    bare = build(dataclasses.replace(deployment, public_stats_listen=None, internal_stats_listen=None,
                                     enroll_listen=None))
    assert [lst["name"] for lst in bare["static_resources"]["listeners"]] == [build.__name__.removesuffix("_config")]
    assert "admin" not in {c["name"] for c in bare["static_resources"]["clusters"]}


def test_calls_to_auth_carry_the_gateways_token_and_no_others_do() -> None:
    """With a token, every route to auth sets it (a client's own replaced) and every other route drops any;
    without one (the checked-in configs), no route to auth or the frontends touches the header, and the web's
    drop any a browser sends either way."""
    deployment = Deployment.load(LOCAL)
    token = "t" * 43
    routes = routes_of(public_config(dataclasses.replace(deployment, auth_token=token)))
    to_auth = [r for r in routes if r.get("route", {}).get("cluster") == "auth"]
    others = [r for r in routes if r.get("route", {}).get("cluster") in ("frontend", "web")]
    assert to_auth and others
    assert all(r["request_headers_to_add"] == [{"header": {"key": GATEWAY_TOKEN_HEADER, "value": token},
                                                "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}] for r in to_auth)
    assert all(r["request_headers_to_remove"] == [GATEWAY_TOKEN_HEADER] for r in others)
    without = routes_of(public_config(deployment))
    assert not any("request_headers_to_add" in r or "request_headers_to_remove" in r
                   for r in without if r.get("route", {}).get("cluster") != "web")
    assert all(r["request_headers_to_remove"] == [GATEWAY_TOKEN_HEADER]
               for r in without if r.get("route", {}).get("cluster") == "web")


def test_the_web_ui_is_served_at_the_root_and_api_paths_stay_404() -> None:
    """With `webs`, every path no service takes goes to the web cluster: HTTP/1.1 over TLS to the web's
    identity, health-checked by GET /healthz, its event streams without a timeout; `/api/...` and gRPC that
    nothing serves stay Envoy's 404, placed before the web's catch-all. Without `webs`: no such cluster or
    route, and `/` is 404."""
    deployment = Deployment.load(LOCAL)
    assert deployment.webs
    config = public_config(deployment)
    routes = routes_of(config)
    to_web = [r for r in routes if r.get("route", {}).get("cluster") == "web"]
    assert to_web[-1] == routes[-1] and routes[-1]["match"] == {"prefix": "/"}
    assert routes[-1]["route"]["timeout"] == "65s"
    [stream] = [r for r in to_web if "safe_regex" in r["match"]]
    assert (stream["route"]["timeout"], stream["route"]["idle_timeout"]) == ("0s", "0s")
    api = next(i for i, r in enumerate(routes) if r["match"] == {"prefix": "/api/"})
    assert routes[api]["direct_response"] == {"status": 404}
    assert api < routes.index(to_web[0])
    # Every service's route comes first: gRPC, and REST the transcoder turned into its gRPC path, reach the
    # services before any 404.
    assert all(routes.index(r) < api for r in routes if r.get("route", {}).get("cluster") in ("auth", "frontend"))
    grpc = next(r for r in routes if r["match"].get("headers") ==
                [{"name": "content-type", "string_match": {"prefix": "application/grpc"}}])
    assert grpc["direct_response"] == {"status": 404} and routes.index(grpc) < routes.index(to_web[0])

    [web] = [c for c in config["static_resources"]["clusters"] if c["name"] == "web"]
    endpoints = web["load_assignment"]["endpoints"][0]["lb_endpoints"]
    assert [e["endpoint"]["address"]["socket_address"] for e in endpoints] == [
        {"address": a.host, "port_value": a.port} for a in deployment.webs]
    protocol = web["typed_extension_protocol_options"]["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
    assert protocol["explicit_http_config"] == {"http_protocol_options": {}}
    [health] = web["health_checks"]
    assert health["http_health_check"] == {"path": "/healthz"}
    tls = web["transport_socket"]["typed_config"]["common_tls_context"]
    assert tls["alpn_protocols"] == ["http/1.1"]
    assert tls["tls_certificates"][0]["certificate_chain"]["filename"] == str(deployment.tls.cert)
    assert tls["validation_context"]["match_typed_subject_alt_names"] == [
        {"san_type": "URI", "matcher": {"exact": "spiffe://corral/service/web"}}]

    bare = public_config(dataclasses.replace(deployment, webs=()))
    assert "web" not in {c["name"] for c in bare["static_resources"]["clusters"]}
    bare_routes = routes_of(bare)
    assert not any(r.get("route", {}).get("cluster") == "web" for r in bare_routes)
    assert not any(r["match"].get("prefix") in ("/", "/api/") for r in bare_routes)
