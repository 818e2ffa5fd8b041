"""What `corral up --gateway` hands Envoy (services.up.gateway): a deployment on loopback whose every path
is absolute, configs the real Envoy accepts, and a gateway certificate people can verify as `localhost`."""

from __future__ import annotations

from pathlib import Path

from cryptography import x509

from services.common.tls import DevCertificateAuthority
from services.up.gateway import deployment, gateway_processes


def test_the_deployment_of_corral_up_validates_and_names_absolute_paths(tmp_path: Path) -> None:
    data = tmp_path / "data"
    ca = DevCertificateAuthority(data / "ca")
    ca.ensure()
    ca.provision("gateway", data / "certs" / "gateway")
    plan = deployment(data, data / "certs" / "gateway", public_port=8443, internal_port=8444, auth_port=20003,
                      frontend_ports=[20004], driver_ports=[20005, 20006], stats_ports=(20001, 20002))

    listeners = (plan.public_listen, plan.internal_listen, plan.public_stats_listen, plan.internal_stats_listen)
    assert all(listeners)
    assert {a.host for a in (*listeners, plan.auth, *plan.frontends, *plan.drivers)} == {"127.0.0.1"}
    assert [a.port for a in listeners] == [8443, 8444, 20001, 20002]
    paths = (plan.tls.ca_cert, plan.tls.cert, plan.tls.key, plan.descriptor_set, plan.access_log)
    assert all(path.is_absolute() for path in paths)
    # The admin interfaces are Unix sockets in DATA/run, where Envoy runs: short names, no TCP port.
    assert (plan.public_admin_socket, plan.internal_admin_socket) == (Path("gateway-public.admin"),
                                                                      Path("gateway-internal.admin"))

    # Written and accepted by `envoy --mode validate` (in the data directory, before any service wrote a log).
    gateways = gateway_processes(plan, data, data / "logs")
    assert {g.name for g in gateways.values()} == {"gateway-public", "gateway-internal"}
    assert all(g.config.exists() for g in gateways.values()) and plan.descriptor_set.exists()
    assert gateways["public"].admin_socket == data / "run" / "gateway-public.admin"

    # People connect to localhost:PORT and verify the gateway with DATA/ca.pem.
    certificate = x509.load_pem_x509_certificate(plan.tls.cert.read_bytes())
    names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "localhost" in names.get_values_for_type(x509.DNSName)
