"""A loopback server that speaks the Compute Engine v1 REST API for the calls corral's GCP provider makes,
and a metadata server per "machine".

Served (https://cloud.google.com/compute/docs/reference/rest/v1/, one page per method): instances
insert/get/delete/list/aggregatedList, zoneOperations get/wait, regions get. Responses are built from the
documented examples under tests/clouds/gcp/ (README.md there cites each page); every request is
recorded (`requests`) and checked against the documented shape (the insert body against
instances.insert.schema.json, query parameters against each method's list): a request that does not
fit is answered 400, as Compute Engine answers, and kept in `violations` for the test to fail on.

Behaviour:
- Operations go PENDING → RUNNING → DONE, one step per zoneOperations.get or .wait.
- Quotas (CPUS, INSTANCES, N2_CPUS, PREEMPTIBLE_CPUS) are counted from the live instances and enforced
  on insert (403 quotaExceeded); `set_quota` changes a limit, `hide_usage` makes regions.get report
  none used (a quota taken between the provider's read and its insert).
- `exhaust_zone(zone)`: inserts there fail with ZONE_RESOURCE_POOL_EXHAUSTED in their operation.
- `deny(permission)`: calls needing it answer 403 forbidden.
- Each instance has a metadata root, `metadata_url(name)` = http://127.0.0.1:PORT/vm/NAME/computeMetadata/v1,
  serving instance/attributes/KEY, instance/preempted, instance/name, instance/zone, only with
  `Metadata-Flavor: Google` (403 without); `?wait_for_change=true` blocks until the value changes.
- `preempt(name)`: preempted becomes TRUE, the instance STOPPING, then TERMINATED, then deleted when its
  instanceTerminationAction is DELETE (as for Spot VMs).
- Hooks: `on_create(name, metadata_url, metadata_items)` when an instance is RUNNING (a test may start a
  real worker there), `on_delete(name)` when it is gone.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import itertools
import json
import re
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jsonschema

EXAMPLES = Path(__file__).parent / "gcp"
API = "https://www.googleapis.com/compute/v1"
MAX_BODY = 1024 * 1024
"""Compute Engine's request size limit is larger; corral's are a few KB."""
SYSTEM_PARAMETERS = {"$alt", "alt", "fields", "key", "prettyPrint", "quotaUser", "$.xgafv", "callback",
                     "access_token", "upload_protocol", "uploadType"}
"""Standard parameters every method takes (https://cloud.google.com/apis/docs/system-parameters)."""
LIST_PARAMETERS = {"filter", "maxResults", "orderBy", "pageToken", "returnPartialSuccess"}
METHOD_PARAMETERS = {
    # Each method's documented query parameters (its reference page's "Query parameters").
    "instances.insert": {"requestId", "sourceInstanceTemplate", "sourceMachineImage"},
    "instances.get": set(),
    "instances.delete": {"requestId", "noGracefulShutdown"},
    "instances.list": LIST_PARAMETERS,
    "instances.aggregatedList": LIST_PARAMETERS | {"includeAllScopes", "serviceProjectNumber"},
    "zoneOperations.get": set(),
    "zoneOperations.wait": set(),
    "regions.get": set(),
}
PERMISSIONS = {
    # The IAM permission each method checks (its reference page's "IAM Permissions").
    "instances.insert": "compute.instances.create", "instances.get": "compute.instances.get",
    "instances.delete": "compute.instances.delete", "instances.list": "compute.instances.list",
    "instances.aggregatedList": "compute.instances.list", "zoneOperations.get": "compute.zoneOperations.get",
    "zoneOperations.wait": "compute.zoneOperations.get", "regions.get": "compute.regions.get",
}
_P = r"/compute/v1/projects/(?P<project>[^/]+)"
ROUTES = [
    ("POST", re.compile(_P + r"/zones/(?P<zone>[^/]+)/instances"), "instances.insert"),
    ("GET", re.compile(_P + r"/zones/(?P<zone>[^/]+)/instances/(?P<name>[^/]+)"), "instances.get"),
    ("DELETE", re.compile(_P + r"/zones/(?P<zone>[^/]+)/instances/(?P<name>[^/]+)"), "instances.delete"),
    ("GET", re.compile(_P + r"/zones/(?P<zone>[^/]+)/instances"), "instances.list"),
    ("GET", re.compile(_P + r"/aggregated/instances"), "instances.aggregatedList"),
    ("GET", re.compile(_P + r"/zones/(?P<zone>[^/]+)/operations/(?P<op>[^/]+)"), "zoneOperations.get"),
    ("POST", re.compile(_P + r"/zones/(?P<zone>[^/]+)/operations/(?P<op>[^/]+)/wait"), "zoneOperations.wait"),
    ("GET", re.compile(_P + r"/regions/(?P<region>[^/]+)"), "regions.get"),
]
METADATA = re.compile(r"/vm/(?P<name>[^/]+)/computeMetadata/v1/(?P<path>[^?]*)")
FILTER_TERM = re.compile(r'\(?\s*(?P<field>name|labels\.[a-z][a-z0-9_-]*)\s*=\s*"(?P<value>[^"]*)"\s*\)?')


def example(name: str) -> Any:
    return json.loads((EXAMPLES / name).read_text())


INSERT_SCHEMA = example("instances.insert.schema.json")


class ApiError(Exception):
    """An error answer, in Compute Engine's error body."""

    def __init__(self, status: int, message: str, reason: str, domain: str = "global"):
        super().__init__(message)
        self.status = status
        documented = {"quotaExceeded": "error.quota-exceeded.json", "forbidden": "error.permission-denied.json",
                      "notFound": "error.not-found.json"}.get(reason)
        self.body = example(documented) if documented else {
            "error": {"code": status, "message": "", "errors": [{"message": "", "domain": domain, "reason": reason}]}}
        self.body["error"]["message"] = self.body["error"]["errors"][0]["message"] = message
        assert self.body["error"]["code"] == status and self.body["error"]["errors"][0]["reason"] == reason


@dataclasses.dataclass
class Recorded:
    method: str
    """e.g. instances.insert."""
    http_method: str
    path: str
    query: dict[str, list[str]]
    body: Any
    headers: dict[str, str]


@dataclasses.dataclass
class Operation:
    resource: dict[str, Any]
    steps: list[str]
    done: Callable[[], dict[str, Any]]
    """Applied once DONE; returns fields to merge (an error)."""


@dataclasses.dataclass
class Vm:
    zone: str
    resource: dict[str, Any]
    vcpus: int
    preempted: bool = False


def vcpus_of(machine_type_url: str) -> int:
    match = re.search(r"-(\d+)$", machine_type_url)
    return int(match.group(1)) if match else 1


class GcpApi:
    """The server; `start()` binds 127.0.0.1 on a free port, `stop()` ends it."""

    def __init__(self, project: str = "example-project", regions: dict[str, tuple[str, ...]] | None = None,
                 quota: dict[str, float] | None = None, termination_delay_s: float = 0.2, wait_hold_s: float = 0.0):
        self.project = project
        self.regions = regions or {"us-central1": ("us-central1-a", "us-central1-b"),
                                   "europe-west4": ("europe-west4-a", "europe-west4-b")}
        self._limits = {r: dict(quota or {"CPUS": 24, "INSTANCES": 24, "N2_CPUS": 24, "PREEMPTIBLE_CPUS": 0})
                        for r in self.regions}
        self._hidden_usage: set[str] = set()
        self.down: set[str] = set()
        """Regions regions.get reports with status DOWN."""
        self._exhausted: set[str] = set()
        self._denied: set[str] = set()
        self._termination_delay_s = termination_delay_s
        self.wait_hold_s = wait_hold_s
        """zoneOperations.wait holds each call this long before answering, as the real one may for minutes."""
        self._vms: dict[str, Vm] = {}
        self._operations: dict[str, Operation] = {}
        self._by_request_id: dict[str, str] = {}
        self._ids = itertools.count(1000)
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._timers: list[threading.Timer] = []
        self.requests: list[Recorded] = []
        self.violations: list[str] = []
        self.on_create: Callable[[str, str, dict[str, str]], None] = lambda name, url, items: None
        self.on_delete: Callable[[str], None] = lambda name: None
        self._server: ThreadingHTTPServer | None = None

    # -- control -----------------------------------------------------------------------------------

    def start(self) -> str:
        """Starts serving; returns the endpoint (http://127.0.0.1:PORT)."""
        api = self

        class Handler(_Handler):
            server_api = api

        self._server = _Server(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, args=(0.05,), name="gcp-api", daemon=True).start()
        return self.endpoint

    @property
    def endpoint(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        for timer in self._timers:
            timer.cancel()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def metadata_url(self, name: str) -> str:
        return f"{self.endpoint}/vm/{name}/computeMetadata/v1"

    def set_quota(self, region: str, metric: str, limit: float) -> None:
        with self._lock:
            self._limits[region][metric] = limit

    def hide_usage(self, region: str) -> None:
        """regions.get reports nothing used in `region` (its quota is still enforced on insert)."""
        with self._lock:
            self._hidden_usage.add(region)

    def exhaust_zone(self, zone: str, exhausted: bool = True) -> None:
        with self._lock:
            (self._exhausted.add if exhausted else self._exhausted.discard)(zone)

    def deny(self, permission: str) -> None:
        """Calls that need `permission` (e.g. compute.instances.create) answer 403."""
        with self._lock:
            self._denied.add(permission)

    def instances(self) -> dict[str, dict[str, Any]]:
        """Each instance's resource, by name (copies)."""
        with self._lock:
            return {name: copy.deepcopy(vm.resource) for name, vm in self._vms.items()}

    def calls(self, method: str) -> list[Recorded]:
        with self._lock:
            return [r for r in self.requests if r.method == method]

    def preempt(self, name: str) -> None:
        """Reclaims a Spot VM: preempted TRUE, STOPPING, then TERMINATED and, with the DELETE
        termination action, deleted."""
        with self._lock:
            vm = self._vms[name]
            vm.preempted = True
            vm.resource["status"] = "STOPPING"
            self._changed.notify_all()
        timer = threading.Timer(self._termination_delay_s, self._terminate, (name,))
        self._timers.append(timer)
        timer.start()

    def _terminate(self, name: str) -> None:
        with self._lock:
            vm = self._vms.get(name)
            if vm is None:
                return
            vm.resource["status"] = "TERMINATED"
            delete = vm.resource.get("scheduling", {}).get("instanceTerminationAction") == "DELETE"
            if delete:
                del self._vms[name]
            self._changed.notify_all()
        if delete:
            self.on_delete(name)

    # -- usage -------------------------------------------------------------------------------------

    def _usage(self, region: str) -> dict[str, float]:
        usage = {"CPUS": 0.0, "INSTANCES": 0.0, "N2_CPUS": 0.0, "PREEMPTIBLE_CPUS": 0.0}
        for vm in self._vms.values():
            if vm.zone not in self.regions[region]:
                continue
            spot = vm.resource.get("scheduling", {}).get("provisioningModel") == "SPOT"
            usage["PREEMPTIBLE_CPUS" if spot and self._limits[region].get("PREEMPTIBLE_CPUS", 0) > 0
                  else "CPUS"] += vm.vcpus
            usage["INSTANCES"] += 1
            if "/machineTypes/n2-" in vm.resource["machineType"]:
                usage["N2_CPUS"] += vm.vcpus
        return usage

    def _region_of(self, zone: str) -> str:
        for region, zones in self.regions.items():
            if zone in zones:
                return region
        raise ApiError(400, f"Invalid value for field 'zone': '{zone}'. Unknown zone.", "invalid")

    # -- methods -----------------------------------------------------------------------------------

    def handle(self, method: str, params: dict[str, str], query: dict[str, list[str]], body: Any) -> Any:
        if method == "zoneOperations.wait":
            time.sleep(self.wait_hold_s)
        if params["project"] != self.project:
            raise ApiError(404, f"The resource 'projects/{params['project']}' was not found", "notFound")
        if PERMISSIONS[method] in self._denied:
            raise ApiError(403, f"Required '{PERMISSIONS[method]}' permission for 'projects/{self.project}'",
                           "forbidden")
        with self._lock:
            return getattr(self, "_" + method.replace(".", "_"))(params, query, body)

    def _instances_insert(self, params: dict[str, str], query: dict[str, list[str]], body: Any) -> Any:
        zone = params["zone"]
        region = self._region_of(zone)
        request_id = query.get("requestId", [""])[0]
        if request_id in self._by_request_id:
            return copy.deepcopy(self._operations[self._by_request_id[request_id]].resource)
        errors = sorted(jsonschema.Draft202012Validator(INSERT_SCHEMA).iter_errors(body), key=str)
        if errors:
            raise ApiError(400, "Invalid value for field 'resource': " + "; ".join(
                f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors), "invalid")
        name = body["name"]
        machine_zone = re.search(r"zones/([^/]+)/machineTypes/", body["machineType"])
        if machine_zone is None or machine_zone.group(1) != zone:
            raise ApiError(400, f"Invalid value for field 'resource.machineType': '{body['machineType']}'. "
                           "Machine type must be in the instance's zone.", "invalid")
        if [d.get("boot") for d in body["disks"]].count(True) != 1:
            raise ApiError(400, "Invalid value for field 'resource.disks': exactly one boot disk.", "invalid")
        scheduling = body.get("scheduling", {})
        if scheduling.get("provisioningModel") == "SPOT" and (
                scheduling.get("automaticRestart") or scheduling.get("onHostMaintenance") == "MIGRATE"):
            raise ApiError(400, "Invalid value for field 'resource.scheduling': Spot VMs cannot restart "
                           "automatically or migrate.", "invalid")
        if "instanceTerminationAction" in scheduling and scheduling.get("provisioningModel") != "SPOT":
            raise ApiError(400, "Invalid value for field 'resource.scheduling.instanceTerminationAction': only for "
                           "Spot VMs.", "invalid")
        metadata_bytes = sum(len(i.get("key", "")) + len(i.get("value", "").encode())
                             for i in body.get("metadata", {}).get("items", []))
        if metadata_bytes > 512 * 1024:
            raise ApiError(400, "Metadata total size exceeds 512 KB", "invalid")
        if any(vm.zone == zone and n == name for n, vm in self._vms.items()):
            raise ApiError(409, f"The resource 'projects/{self.project}/zones/{zone}/instances/{name}' already "
                           "exists", "alreadyExists")
        vcpus = vcpus_of(body["machineType"])
        usage, limits = self._usage(region), self._limits[region]
        spot = scheduling.get("provisioningModel") == "SPOT"
        cpu_metric = "PREEMPTIBLE_CPUS" if spot and limits.get("PREEMPTIBLE_CPUS", 0) > 0 else "CPUS"
        n2 = "/machineTypes/n2-" in body["machineType"]
        for metric, amount in ((cpu_metric, vcpus), ("INSTANCES", 1), ("N2_CPUS", vcpus if n2 else 0)):
            if amount and usage[metric] + amount > limits.get(metric, float("inf")):
                raise ApiError(403, f"Quota '{metric}' exceeded.  Limit: {limits[metric]:.1f} in region {region}.",
                               "quotaExceeded")
        resource = self._instance_resource(zone, body)
        url = resource["selfLink"]
        exhausted = zone in self._exhausted
        if not exhausted:
            self._vms[name] = Vm(zone, resource, vcpus)
            resource["status"] = "PROVISIONING"

        def done() -> dict[str, Any]:
            if exhausted:
                failure = example("operation.zone-resource-pool-exhausted.json")
                failure["error"]["errors"][0]["message"] = failure["error"]["errors"][0]["message"].replace(
                    "projects/example-project/zones/us-central1-a", f"projects/{self.project}/zones/{zone}")
                return failure
            vm = self._vms.get(name)
            if vm is not None:
                vm.resource["status"] = "RUNNING"
                items = {i["key"]: i.get("value", "") for i in vm.resource["metadata"].get("items", [])}
                self._after(lambda: self.on_create(name, self.metadata_url(name), items))
            return {}

        operation = self._operation(zone, "insert", url, resource["id"], done)
        if request_id:
            self._by_request_id[request_id] = operation["name"]
        return operation

    def _instance_resource(self, zone: str, body: dict[str, Any]) -> dict[str, Any]:
        resource = example("instance.json")
        zone_url = f"{API}/projects/{self.project}/zones/{zone}"
        region = self._region_of(zone)
        interface = resource["networkInterfaces"][0]
        interface["network"] = f"{API}/projects/{self.project}/" + re.sub(r"^.*?(global/)", r"\1",
                                                                        body["networkInterfaces"][0]["network"])
        interface["subnetwork"] = f"{API}/projects/{self.project}/regions/{region}/subnetworks/" + \
            body["networkInterfaces"][0].get("subnetwork", "default").rsplit("/", 1)[-1]
        resource.update(
            id=str(next(self._ids)), name=body["name"], zone=zone_url,
            machineType=f"{zone_url}/machineTypes/{body['machineType'].rsplit('/', 1)[-1]}",
            selfLink=f"{zone_url}/instances/{body['name']}", labels=body.get("labels", {}),
            metadata={**resource["metadata"], "items": body.get("metadata", {}).get("items", [])},
            scheduling={**resource["scheduling"], **body.get("scheduling", {})},
            serviceAccounts=body.get("serviceAccounts", []))
        resource["scheduling"]["preemptible"] = False
        resource["disks"][0].update(source=f"{zone_url}/disks/{body['name']}",
                                    diskSizeGb=body["disks"][0].get("initializeParams", {}).get("diskSizeGb", "10"))
        return resource

    def _instances_get(self, params: dict[str, str], query: dict[str, list[str]], body: Any) -> Any:
        return copy.deepcopy(self._find(params["zone"], params["name"]).resource)

    def _find(self, zone: str, name: str) -> Vm:
        vm = self._vms.get(name)
        if vm is None or vm.zone != zone:
            raise ApiError(404, f"The resource 'projects/{self.project}/zones/{zone}/instances/{name}' was not found",
                           "notFound")
        return vm

    def _instances_delete(self, params: dict[str, str], query: dict[str, list[str]], body: Any) -> Any:
        zone, name = params["zone"], params["name"]
        vm = self._find(zone, name)
        vm.resource["status"] = "STOPPING"

        def done() -> dict[str, Any]:
            if self._vms.get(name) is vm:
                del self._vms[name]
                self._changed.notify_all()
                self._after(lambda: self.on_delete(name))
            return {}

        return self._operation(zone, "delete", vm.resource["selfLink"], vm.resource["id"], done)

    def _matching(self, query: dict[str, list[str]]) -> list[Vm]:
        text = query.get("filter", [""])[0]
        terms = list(FILTER_TERM.finditer(text))
        if "".join(m.group(0) for m in terms).replace(" ", "") != text.replace(" ", ""):
            raise ApiError(400, f"Invalid value for field 'filter': '{text}'. Invalid list filter expression.",
                           "invalid")

        def selected(vm: Vm) -> bool:
            for term in terms:
                field, value = term.group("field"), term.group("value")
                have = vm.resource["name"] if field == "name" else vm.resource.get("labels", {}).get(field[7:])
                if have != value:
                    return False
            return True
        return [vm for vm in self._vms.values() if selected(vm)]

    def _page(self, query: dict[str, list[str]], vms: list[Vm]) -> tuple[list[Vm], str]:
        size = min(int(query.get("maxResults", ["500"])[0]), 500)
        start = int(query.get("pageToken", ["0"])[0] or 0)
        end = start + size
        return vms[start:end], (str(end) if end < len(vms) else "")

    def _instances_list(self, params: dict[str, str], query: dict[str, list[str]], body: Any) -> Any:
        self._region_of(params["zone"])
        page, token = self._page(query, [vm for vm in self._matching(query) if vm.zone == params["zone"]])
        answer = {"kind": "compute#instanceList", "id": f"projects/{self.project}/zones/{params['zone']}/instances",
                  "items": [copy.deepcopy(vm.resource) for vm in page],
                  "selfLink": f"{API}/projects/{self.project}/zones/{params['zone']}/instances"}
        return {**answer, "nextPageToken": token} if token else answer

    def _instances_aggregatedList(self, params: dict[str, str], query: dict[str, list[str]], body: Any) -> Any:
        answer = example("instances.aggregatedList.json")
        answer["id"] = f"projects/{self.project}/aggregated/instances"
        answer["selfLink"] = f"{API}/projects/{self.project}/aggregated/instances"
        empty = answer["items"]["zones/us-central1-b"]
        page, token = self._page(query, self._matching(query))
        items: dict[str, Any] = {}
        for zone in (z for zones in self.regions.values() for z in zones):
            found = [copy.deepcopy(vm.resource) for vm in page if vm.zone == zone]
            if found:
                items[f"zones/{zone}"] = {"instances": found}
            else:
                warning = json.loads(json.dumps(empty).replace("us-central1-b", zone))
                items[f"zones/{zone}"] = warning
        answer["items"] = items
        return {**answer, "nextPageToken": token} if token else answer

    def _operation(self, zone: str, kind: str, target: str, target_id: str,
                   done: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        resource = example("operation.json")
        name = f"operation-{int(time.time() * 1000)}-{next(self._ids):x}"
        zone_url = f"{API}/projects/{self.project}/zones/{zone}"
        resource.update(id=str(next(self._ids)), name=name, zone=zone_url, operationType=kind, targetLink=target,
                        targetId=target_id, selfLink=f"{zone_url}/operations/{name}")
        self._operations[name] = Operation(resource, ["RUNNING", "DONE"], done)
        return copy.deepcopy(resource)

    def _advance(self, params: dict[str, str]) -> Any:
        operation = self._operations.get(params["op"])
        if operation is None or not operation.resource["zone"].endswith("/zones/" + params["zone"]):
            raise ApiError(404, f"The resource 'projects/{self.project}/zones/{params['zone']}/operations/"
                           f"{params['op']}' was not found", "notFound")
        if operation.steps:
            status = operation.steps.pop(0)
            operation.resource["status"] = status
            operation.resource["progress"] = 100 if status == "DONE" else 50
            if status == "DONE":
                operation.resource["endTime"] = operation.resource["insertTime"]
                operation.resource.update(operation.done())
        return copy.deepcopy(operation.resource)

    def _zoneOperations_get(self, params: dict[str, str], query: dict[str, list[str]], body: Any) -> Any:
        return self._advance(params)

    def _zoneOperations_wait(self, params: dict[str, str], query: dict[str, list[str]], body: Any) -> Any:
        return self._advance(params)

    def _regions_get(self, params: dict[str, str], query: dict[str, list[str]], body: Any) -> Any:
        region = params["region"]
        if region not in self.regions:
            raise ApiError(404, f"The resource 'projects/{self.project}/regions/{region}' was not found", "notFound")
        answer = example("region.json")
        usage = {} if region in self._hidden_usage else self._usage(region)
        answer.update(name=region, description=region, status="DOWN" if region in self.down else "UP",
                      zones=[f"{API}/projects/{self.project}/zones/{z}" for z in self.regions[region]],
                      selfLink=f"{API}/projects/{self.project}/regions/{region}")
        answer["quotas"] = [{"metric": q["metric"], "limit": self._limits[region].get(q["metric"], q["limit"]),
                             "usage": usage.get(q["metric"], 0.0)} for q in answer["quotas"]]
        return answer

    # -- metadata server ---------------------------------------------------------------------------

    def metadata(self, name: str, path: str, query: dict[str, list[str]]) -> str:
        """The text of a metadata path of instance `name` (KeyError: not there)."""
        def value() -> str:
            vm = self._vms[name]
            if path == "instance/preempted":
                return "TRUE" if vm.preempted else "FALSE"
            if path == "instance/name":
                return name
            if path == "instance/zone":
                return f"projects/{self.project}/zones/{vm.zone}"
            if path == "instance/attributes/":
                return "".join(i["key"] + "\n" for i in vm.resource["metadata"]["items"])
            if path.startswith("instance/attributes/"):
                items = {i["key"]: i.get("value", "") for i in vm.resource["metadata"]["items"]}
                return items[path[len("instance/attributes/"):]]
            raise KeyError(path)

        with self._lock:
            text = value()
            if query.get("wait_for_change", [""])[0].lower() == "true":
                # Until the value differs from the one the caller has (last_etag) or it had on arrival.
                seen = query.get("last_etag", [etag(text)])[0]
                deadline = time.monotonic() + min(float(query.get("timeout_sec", ["30"])[0]), 30.0)
                while etag(text) == seen and time.monotonic() < deadline:
                    self._changed.wait(deadline - time.monotonic())
                    if name not in self._vms:
                        break
                    text = value()
            return text

    def _after(self, hook: Callable[[], None]) -> None:
        """Runs a test's hook outside the lock, in its own thread."""
        threading.Thread(target=hook, daemon=True).start()


def etag(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hung up (a worker stopped during a metadata long poll) is not an error; the rest are
        printed, as the base class does."""
        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    server_api: GcpApi
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    def _serve(self, http_method: str) -> None:
        api = self.server_api
        url = urllib.parse.urlsplit(self.path)
        query = urllib.parse.parse_qs(url.query, keep_blank_values=True)
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            self._send(413, {"error": {"code": 413, "message": "request too large"}})
            return
        raw = self.rfile.read(length) if length else b""
        metadata = METADATA.fullmatch(url.path)
        if metadata and http_method == "GET":
            self._metadata(metadata["name"], metadata["path"], query)
            return
        for route_method, pattern, method in ROUTES:
            match = pattern.fullmatch(url.path)
            if match and route_method == http_method:
                break
        else:
            api.violations.append(f"{http_method} {url.path}: no such method")
            self._send(404, ApiError(404, f"{http_method} {url.path} is not served here", "notFound").body)
            return
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode(errors="replace")
        with api._lock:
            api.requests.append(Recorded(method, http_method, url.path, query, body, dict(self.headers)))
        try:
            unknown = set(query) - SYSTEM_PARAMETERS - METHOD_PARAMETERS[method]
            if unknown:
                raise ApiError(400, f"Invalid JSON payload received. Unknown name {sorted(unknown)}", "invalid")
            if method == "instances.insert" and not isinstance(body, dict):
                raise ApiError(400, "Invalid JSON payload received: the body is an Instance.", "invalid")
            answer = api.handle(method, match.groupdict(), query, body)
        except ApiError as e:
            if e.status == 400:
                api.violations.append(f"{method}: {e}")
            self._send(e.status, e.body)
            return
        self._send(200, answer)

    def _metadata(self, name: str, path: str, query: dict[str, list[str]]) -> None:
        # As the metadata server: the header is required and a forwarded request is refused (so a
        # proxy cannot be tricked into reading it); https://cloud.google.com/compute/docs/metadata/querying-metadata
        if self.headers.get("Metadata-Flavor") != "Google" or self.headers.get("X-Forwarded-For"):
            self._send_text(403, "Missing required header: Metadata-Flavor\n")
            return
        try:
            text = self.server_api.metadata(name, path, query)
        except KeyError:
            self._send_text(404, "Not Found\n")
            return
        self._send_text(200, text, {"ETag": etag(text)})

    def _send(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=UTF-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _send_text(self, status: int, text: str, headers: dict[str, str] | None = None) -> None:
        data = text.encode()
        self.send_response(status)
        self.send_header("Metadata-Flavor", "Google")
        self.send_header("Content-Type", "application/text")
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)
