"""A loopback server that speaks the Azure Resource Manager REST API for the calls corral's Azure
provider makes, and each created VM's Instance Metadata Service (IMDS).

The provider's real SDK clients (azure-mgmt-compute, azure-mgmt-network, their aiohttp transport and
bearer-token policy) talk to it over HTTPS with a test CA, as they would to management.azure.com:

- ARM (HTTPS): virtualMachines createOrUpdate/get/delete/list, networkInterfaces createOrUpdate/
  get/delete, disks delete (a GET ends each PUT's operation, as the SDK's poller does); each write answers with the `Azure-AsyncOperation` (and, for a delete,
  `Location`) headers of a long-running operation whose status goes InProgress → Succeeded (or
  Failed) over `polls` polls. Every request is checked against the documented shape (api-version,
  a bearer token, the body's JSON Schema under tests/clouds/azure/) and recorded in `requests`;
  what fails the check is answered 400 and listed in `invalid`.
- IMDS (plain HTTP, as the real one at 169.254.169.254 is): each VM has its own root,
  `/vm/NAME/metadata`, serving `instance/compute/userData` and `scheduledevents`, with the
  `Metadata: true` header required; and the managed identity's token endpoint,
  `/vm/NAME/metadata/identity/oauth2/token`, for the machine the driver runs on (`identity_host(NAME)`:
  what azure-identity's ManagedIdentityCredential reads from AZURE_POD_IDENTITY_AUTHORITY_HOST), which
  gives the token ARM checks.

On demand: `fail(location, kind)` makes VM creation there fail as Azure does (a quota or SKU refusal
at once, an allocation failure in the operation, a 403 for a missing role assignment), and
`preempt(name)` posts a `Preempt` scheduled event and then deletes the VM, as eviction policy
Delete does. `on_create(name, metadata_url, user_data, custom_data)` is called once a VM's
creation succeeds (a test may start a real worker there); `on_delete(name)` once it is gone.

Bodies follow the examples of the REST reference: tests/clouds/azure/README.md cites each page.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import dataclasses
import email.utils
import inspect
import json
import logging
import re
import ssl
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
from aiohttp import web

log = logging.getLogger(__name__)

DOCS = Path(__file__).parent / "azure"
IMDS_USER_DATA_API_VERSION = "2021-01-01"
IMDS_SCHEDULED_EVENTS_API_VERSION = "2020-07-01"
MAX_BODY_BYTES = 1024 * 1024
FAILURES = ("quota", "quota-code", "sku", "allocation", "authorization", "throttle")


def _document(name: str) -> Any:
    return json.loads((DOCS / name).read_text())


def _fill(value: Any, **fields: str) -> Any:
    """A documented example with its `{placeholders}` replaced."""
    text = json.dumps(value)
    for key, replacement in fields.items():
        text = text.replace("{" + key + "}", json.dumps(replacement)[1:-1])
    return json.loads(text)


@dataclasses.dataclass(frozen=True)
class RecordedRequest:
    """One request the SDK sent, as received."""

    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: Any


@dataclasses.dataclass
class _Operation:
    polls_left: int
    finish: Callable[[], dict[str, Any] | None]
    """Applies the operation's effect; returns an ARM error body's `error` to fail it instead."""
    status: str = "InProgress"
    error: dict[str, Any] | None = None


_RESOURCE = re.compile(
    r"^/subscriptions/(?P<sub>[^/]+)/resourceGroups/(?P<rg>[^/]+)/providers/"
    r"(?P<kind>Microsoft\.Compute/virtualMachines|Microsoft\.Network/networkInterfaces|Microsoft\.Compute/disks)"
    r"(?:/(?P<name>[^/]+))?$", re.IGNORECASE)
_OPERATION = re.compile(
    r"^/subscriptions/(?P<sub>[^/]+)/providers/(?P<ns>Microsoft\.Compute|Microsoft\.Network)/locations/[^/]+/"
    r"(?P<what>operations|operationResults)/(?P<id>[^/]+)$", re.IGNORECASE)
_IMDS = re.compile(r"^/vm/(?P<name>[^/]+)/metadata/(?P<what>instance/compute/userData|scheduledevents)$")
_IDENTITY = re.compile(r"^/vm/(?P<name>[^/]+)/metadata/identity/oauth2/token$")
IMDS_IDENTITY_API_VERSION = "2018-02-01"
"""What azure-identity's IMDS credential sends (the documented versions include it)."""
_API_VERSION = re.compile(r"^\d{4}-\d{2}-\d{2}(-preview)?$")


def _error(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message}}, status=status, headers=headers)


class AzureApiServer:
    """ARM on `base_url` (HTTPS, trusting `ca_file`) and IMDS roots on `metadata_url(name)`."""

    def __init__(self, tls_cert: Path, tls_key: Path, ca_file: Path, subscription_id: str, token: str, *,
                 polls: int = 2, page_size: int = 2, on_create: Callable[..., Any] | None = None,
                 on_delete: Callable[[str], Any] | None = None, resource_groups: set[str] | None = None):
        self.ca_file = ca_file
        self.subscription_id = subscription_id
        self.polls = polls
        """Polls of an operation's status answered InProgress before it ends."""
        self.page_size = page_size
        """VMs per page of a list (small, so the SDK follows nextLink)."""
        self.resource_groups = resource_groups
        """The groups that exist (None: any)."""
        self.on_create = on_create
        self.on_delete = on_delete
        self.requests: list[RecordedRequest] = []
        self.invalid: list[str] = []
        self.vms: dict[str, dict[str, Any]] = {}
        self.user_data: dict[str, str] = {}
        """Per VM: its userData (base64), kept apart as ARM keeps it (returned only on $expand)."""
        self.nics: dict[str, dict[str, Any]] = {}
        self.disks: dict[str, dict[str, Any]] = {}
        self.events: dict[str, list[dict[str, Any]]] = {}
        self.event_approvals: list[tuple[str, dict[str, Any]]] = []
        self._incarnation: dict[str, int] = {}
        self._failures: dict[str, list[str]] = {}
        self._operations: dict[str, _Operation] = {}
        self._tls = (tls_cert, tls_key)
        self._token = token
        self._runners: list[web.AppRunner] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self._schemas = {kind: jsonschema.Draft202012Validator(_document(f"{kind}_create_request.schema.json"))
                         for kind in ("vm", "nic")}
        self.base_url = ""
        self.imds_url = ""

    # -- life ----------------------------------------------------------------------------------------

    async def start(self) -> AzureApiServer:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(*self._tls)
        arm = web.Application(client_max_size=MAX_BODY_BYTES)
        arm.router.add_route("*", "/{tail:.*}", self._arm)
        imds = web.Application(client_max_size=MAX_BODY_BYTES)
        imds.router.add_route("*", "/{tail:.*}", self._imds)
        ports = []
        for app, tls in ((arm, context), (imds, None)):
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            self._runners.append(runner)
            site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls)
            await site.start()
            ports.append(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
        self.base_url = f"https://127.0.0.1:{ports[0]}"
        self.imds_url = f"http://127.0.0.1:{ports[1]}"
        return self

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for runner in reversed(self._runners):
            await runner.cleanup()

    def identity_host(self, name: str) -> str:
        """Where the managed identity of machine `name` (the driver's) answers: IMDS's root for it, without
        `/metadata` (what AZURE_POD_IDENTITY_AUTHORITY_HOST holds)."""
        return f"{self.imds_url}/vm/{name}"

    def metadata_url(self, name: str) -> str:
        """The VM's IMDS root: what `http://169.254.169.254/metadata` is on a real one."""
        return f"{self.imds_url}/vm/{name}/metadata"

    # -- on demand -----------------------------------------------------------------------------------

    def fail(self, location: str, kind: str, times: int = 1_000_000) -> None:
        """Make the next `times` VM creations in `location` fail as Azure does: `quota` (409
        OperationNotAllowed, a regional cores quota), `quota-code` (409 QuotaExceeded), `sku` (409
        SkuNotAvailable), `allocation` (the operation ends Failed with AllocationFailed, leaving a
        Failed VM), `authorization` (403 AuthorizationFailed), `throttle` (429)."""
        if kind not in FAILURES:
            raise ValueError(f"unknown failure {kind!r}; one of {FAILURES}")
        self._failures[location] = [kind] * times

    def clear_failures(self) -> None:
        self._failures.clear()

    def preempt(self, name: str, notice_s: float = 0.5) -> str:
        """Post a Preempt scheduled event for VM `name`; evict it (delete it and what its delete
        options say) after `notice_s`, or as soon as the VM approves the event. Returns the event id."""
        if name not in self.vms:
            raise KeyError(name)
        properties = self.vms[name]["properties"]
        if properties.get("priority") != "Spot" or properties.get("evictionPolicy") != "Delete":
            raise ValueError(f"{name} is not a Spot VM with eviction policy Delete (the only eviction modelled)")
        event_id = str(uuid.uuid4()).upper()
        not_before = email.utils.formatdate(time.time() + notice_s, usegmt=True)
        event = _fill(_document("imds_scheduled_events.json")["Events"][0], **{"event-id": event_id, "vm-name": name})
        event["NotBefore"] = not_before
        self.events.setdefault(name, []).append(event)
        self._incarnation[name] = self._incarnation.get(name, 0) + 1
        handle = asyncio.get_running_loop().call_later(notice_s, self._evict, name)
        event["_handle"] = handle
        return event_id

    def _evict(self, name: str) -> None:
        for event in self.events.get(name, []):
            handle = event.pop("_handle", None)
            if handle is not None:
                handle.cancel()
        if name in self.vms:
            log.info("evicting %s (eviction policy Delete)", name)
            self._remove_vm(name)

    # -- ARM -----------------------------------------------------------------------------------------

    async def _arm(self, request: web.Request) -> web.Response:
        raw = await request.read()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            return self._invalid("body is not JSON", 400, "InvalidRequestContent")
        self.requests.append(RecordedRequest(request.method, request.path, dict(request.query),
                                             dict(request.headers), body))
        if request.headers.get("Authorization") != f"Bearer {self._token}":
            return _error(401, "InvalidAuthenticationToken", "The access token is missing or invalid.")
        api_version = request.query.get("api-version")
        if api_version is None:
            return self._invalid("no api-version", 400, "MissingApiVersionParameter")
        if not _API_VERSION.match(api_version):
            return self._invalid(f"bad api-version {api_version!r}", 400, "InvalidApiVersionParameter")
        operation = _OPERATION.match(request.path)
        if operation and request.method == "GET":
            return self._operation_status(operation["id"], operation["what"].lower() == "operationresults")
        match = _RESOURCE.match(request.path)
        if match is None or match["sub"] != self.subscription_id:
            return _error(404, "NotFound", f"no route {request.method} {request.path}")
        kind, name, group = match["kind"].lower(), match["name"], match["rg"]
        if self.resource_groups is not None and group not in self.resource_groups:
            return _error(404, "ResourceGroupNotFound", f"Resource group '{group}' could not be found.")
        route = (request.method, kind, name is not None)
        if route == ("GET", "microsoft.compute/virtualmachines", False):
            return self._list_vms(request, group)
        if route == ("PUT", "microsoft.compute/virtualmachines", True):
            return self._put_vm(request, group, name, body, api_version)
        if route == ("GET", "microsoft.compute/virtualmachines", True):
            return self._get_vm(name)
        if route == ("DELETE", "microsoft.compute/virtualmachines", True):
            return self._delete(request, "Microsoft.Compute", self.vms, name, api_version, self._remove_vm)
        if route == ("PUT", "microsoft.network/networkinterfaces", True):
            return self._put_nic(request, group, name, body, api_version)
        if route == ("GET", "microsoft.network/networkinterfaces", True):  # the final GET of its PUT's operation
            if name not in self.nics:
                return _error(404, "NotFound", f"Resource {name} not found.")
            return web.json_response(copy.deepcopy(self.nics[name]))
        if route == ("DELETE", "microsoft.network/networkinterfaces", True):
            owner = self._attached("nic", name)
            if owner:
                return _error(400, "NicInUse", f"Network Interface {name} is used by existing resource {owner}.")
            return self._delete(request, "Microsoft.Network", self.nics, name, api_version, self.nics.pop)
        if route == ("DELETE", "microsoft.compute/disks", True):
            owner = self._attached("disk", name)
            if owner:
                return _error(409, "OperationNotAllowed", f"Disk {name} is attached to VM {owner}.")
            return self._delete(request, "Microsoft.Compute", self.disks, name, api_version, self.disks.pop)
        return _error(405, "MethodNotAllowed", f"{request.method} {request.path} is not served here")

    def _invalid(self, why: str, status: int = 400, code: str = "InvalidRequestContent") -> web.Response:
        self.invalid.append(why)
        return _error(status, code, why)

    def _resource_id(self, group: str, kind: str, name: str) -> str:
        return f"/subscriptions/{self.subscription_id}/resourceGroups/{group}/providers/{kind}/{name}"

    def _begin(self, request: web.Request, namespace: str, location: str, api_version: str,
               finish: Callable[[], dict[str, Any] | None]) -> dict[str, str]:
        """Start a long-running operation; its headers (ARM async operations: Azure-AsyncOperation
        for the status, Location for the result)."""
        operation_id = str(uuid.uuid4())
        self._operations[operation_id] = _Operation(self.polls, finish)
        root = f"{self.base_url}/subscriptions/{self.subscription_id}/providers/{namespace}/locations/{location}"
        headers = {"Azure-AsyncOperation": f"{root}/operations/{operation_id}?api-version={api_version}"}
        if request.method == "DELETE":
            headers["Location"] = f"{root}/operationResults/{operation_id}?api-version={api_version}"
        return headers

    def _operation_status(self, operation_id: str, result: bool) -> web.Response:
        operation = self._operations.get(operation_id)
        if operation is None:
            return _error(404, "NotFound", f"no operation {operation_id}")
        if operation.status == "InProgress":
            if operation.polls_left > 0:
                operation.polls_left -= 1
            else:
                operation.error = operation.finish()
                operation.status = "Failed" if operation.error else "Succeeded"
        if result:  # the Location URL: 202 while running, then 200 (the status document's own code)
            return web.Response(status=202 if operation.status == "InProgress" else 200)
        names = {"operation-id": operation_id, "operation-name": operation_id}
        if operation.status == "InProgress":
            return web.json_response(_fill(_document("async_operation_in_progress.json"), **names))
        if operation.status == "Succeeded":
            return web.json_response(_fill(_document("async_operation_succeeded.json"), **names))
        assert operation.error is not None
        return web.json_response(_fill(_document("async_operation_failed.json"), **names,
                                       code=operation.error["code"], message=operation.error["message"]))

    def _delete(self, request: web.Request, namespace: str, store: dict[str, dict[str, Any]], name: str,
                api_version: str, remove: Callable[[str], Any]) -> web.Response:
        resource = store.get(name)
        if resource is None:  # ARM answers a delete of what is not there with 204
            return web.Response(status=204)
        resource["properties"]["provisioningState"] = "Deleting"

        def finish() -> None:
            if name in store:
                remove(name)
        return web.Response(status=202, headers=self._begin(request, namespace, resource["location"], api_version,
                                                           finish))

    # virtual machines

    def _put_vm(self, request: web.Request, group: str, name: str, body: Any, api_version: str) -> web.Response:
        errors = sorted(self._schemas["vm"].iter_errors(body), key=str)
        if errors:
            return self._invalid(f"VM {name}: " + "; ".join(e.message + " at " + e.json_path for e in errors))
        properties = body["properties"]
        for field, path in (("customData", properties["osProfile"]), ("userData", properties)):
            if field in path and not _is_base64(path[field]):
                return self._invalid(f"VM {name}: {field} is not base64")
        if properties.get("evictionPolicy") and properties.get("priority") != "Spot":
            return self._invalid(f"VM {name}: evictionPolicy is only for Spot VMs", 400, "InvalidParameter")
        for reference in properties["networkProfile"]["networkInterfaces"]:
            nic = reference["id"].rsplit("/", 1)[-1]
            if nic not in self.nics or self.nics[nic]["location"] != body["location"]:
                return self._invalid(f"VM {name}: network interface {nic} not found in {body['location']}",
                                     400, "InvalidParameter")
        location = body["location"]
        failure = self._failures.get(location, [None]).pop() if self._failures.get(location) else None
        if failure in ("quota", "quota-code", "sku", "authorization", "throttle"):
            return self._refuse(failure, location, name, group)
        vm = copy.deepcopy(body)
        user_data = vm["properties"].pop("userData", "")
        custom_data = vm["properties"]["osProfile"].pop("customData", "")
        vm.update(id=self._resource_id(group, "Microsoft.Compute/virtualMachines", name), name=name,
                  type="Microsoft.Compute/virtualMachines")
        vm["properties"].update(vmId=str(uuid.uuid4()), provisioningState="Creating",
                                timeCreated=time.strftime("%Y-%m-%dT%H:%M:%S.0000000+00:00", time.gmtime()))
        vm["properties"]["storageProfile"]["osDisk"]["osType"] = "Linux"
        vm["properties"]["storageProfile"].setdefault("dataDisks", [])
        vm["properties"]["osProfile"].setdefault("secrets", [])
        existed = name in self.vms
        self.vms[name] = vm
        self.user_data[name] = user_data

        def finish() -> dict[str, Any] | None:
            if name not in self.vms:
                return {"code": "NotFound", "message": f"VM {name} was deleted"}
            if failure == "allocation":
                vm["properties"]["provisioningState"] = "Failed"
                return _document("error_allocation.json")["error"]
            vm["properties"]["provisioningState"] = "Succeeded"
            disk = vm["properties"]["storageProfile"]["osDisk"]
            disk_name = disk.get("name") or f"{name}_OsDisk_{uuid.uuid4().hex[:8]}"
            self.disks[disk_name] = {"name": disk_name, "location": location, "managedBy": vm["id"],
                                     "properties": {"provisioningState": "Succeeded"}}
            self._call(self.on_create, name, self.metadata_url(name), _b64decode(user_data),
                       _b64decode(custom_data))
            return None
        headers = self._begin(request, "Microsoft.Compute", location, api_version, finish)
        return web.json_response(self._vm_view(name), status=200 if existed else 201, headers=headers)

    def _refuse(self, failure: str, location: str, name: str, group: str) -> web.Response:
        if failure == "throttle":
            return _error(429, "TooManyRequests", "The request is being throttled.", {"Retry-After": "0"})
        if failure == "quota-code":
            return _error(409, "QuotaExceeded", f"Operation results in exceeding quota limits of Core. "
                          f"Maximum allowed: 10, Current in use: 10, Additional requested: 2 ({location}).")
        document, status = {"quota": ("error_quota.json", 409), "sku": ("error_sku_not_available.json", 409),
                            "authorization": ("error_authorization.json", 403)}[failure]
        scope = self._resource_id(group, "Microsoft.Compute/virtualMachines", name)
        body = _fill(_document(document), location=location, resource=name, scope=scope,
                     **{"object-id": "00000000-0000-0000-0000-000000000000"})
        return web.json_response(body, status=status)

    def _vm_view(self, name: str) -> dict[str, Any]:
        """A VM as ARM returns it: without customData (never returned) or userData (only on $expand)."""
        return copy.deepcopy(self.vms[name])

    def _get_vm(self, name: str) -> web.Response:
        if name not in self.vms:
            return _error(404, "ResourceNotFound", f"The Resource 'Microsoft.Compute/virtualMachines/{name}' "
                          "under resource group was not found.")
        return web.json_response(self._vm_view(name))

    def _list_vms(self, request: web.Request, group: str) -> web.Response:
        names = sorted(n for n, vm in self.vms.items() if f"/resourceGroups/{group}/" in vm["id"])
        start = int(request.query.get("$skiptoken", "0"))
        page = names[start:start + self.page_size]
        body: dict[str, Any] = {"value": [self._vm_view(n) for n in page]}
        if start + self.page_size < len(names):
            body["nextLink"] = (f"{self.base_url}{request.path}?api-version={request.query['api-version']}"
                                f"&$skiptoken={start + self.page_size}")
        return web.json_response(body)

    def _remove_vm(self, name: str) -> None:
        """The VM is gone; so are the NIC and OS disk whose deleteOption is Delete."""
        vm = self.vms.pop(name)
        self.user_data.pop(name, None)
        self.events.pop(name, None)
        for reference in vm["properties"]["networkProfile"]["networkInterfaces"]:
            if reference.get("properties", {}).get("deleteOption") == "Delete":
                self.nics.pop(reference["id"].rsplit("/", 1)[-1], None)
        disk = vm["properties"]["storageProfile"]["osDisk"]
        if disk.get("deleteOption") == "Delete":
            self.disks.pop(disk.get("name", ""), None)
        else:
            for record in self.disks.values():
                if record.get("managedBy") == vm["id"]:
                    record["managedBy"] = None
        if vm["properties"]["provisioningState"] != "Failed":
            self._call(self.on_delete, name)

    def _attached(self, what: str, name: str) -> str | None:
        for vm_name, vm in self.vms.items():
            if what == "nic" and any(r["id"].rsplit("/", 1)[-1] == name
                                     for r in vm["properties"]["networkProfile"]["networkInterfaces"]):
                return vm_name
            if what == "disk" and vm["properties"]["storageProfile"]["osDisk"].get("name") == name:
                return vm_name
        return None

    # network interfaces

    def _put_nic(self, request: web.Request, group: str, name: str, body: Any, api_version: str) -> web.Response:
        errors = sorted(self._schemas["nic"].iter_errors(body), key=str)
        if errors:
            return self._invalid(f"NIC {name}: " + "; ".join(e.message + " at " + e.json_path for e in errors))
        nic_id = self._resource_id(group, "Microsoft.Network/networkInterfaces", name)
        nic = copy.deepcopy(body)
        nic.update(id=nic_id, name=name, type="Microsoft.Network/networkInterfaces",
                   etag=f'W/"{uuid.uuid4()}"')
        nic["properties"].update(provisioningState="Updating", resourceGuid=str(uuid.uuid4()))
        nic["properties"].setdefault("enableAcceleratedNetworking", False)
        nic["properties"].setdefault("enableIPForwarding", False)
        for index, configuration in enumerate(nic["properties"]["ipConfigurations"]):
            configuration["id"] = f"{nic_id}/ipConfigurations/{configuration['name']}"
            configuration["properties"].update(provisioningState="Updating", primary=index == 0,
                                               privateIPAddress=f"10.0.0.{4 + len(self.nics)}")
        existed = name in self.nics
        self.nics[name] = nic

        def finish() -> None:
            nic["properties"]["provisioningState"] = "Succeeded"
            for configuration in nic["properties"]["ipConfigurations"]:
                configuration["properties"]["provisioningState"] = "Succeeded"
        headers = self._begin(request, "Microsoft.Network", body["location"], api_version, finish)
        return web.json_response(copy.deepcopy(nic), status=200 if existed else 201, headers=headers)

    # -- IMDS ----------------------------------------------------------------------------------------

    async def _imds(self, request: web.Request) -> web.Response:
        raw = await request.read()
        self.requests.append(RecordedRequest(request.method, request.path, dict(request.query),
                                             dict(request.headers), raw.decode(errors="replace") or None))
        if request.headers.get("Metadata", "").lower() != "true":
            return web.json_response({"error": "Bad request. Required metadata header not specified"}, status=400)
        if "X-Forwarded-For" in request.headers:  # IMDS refuses proxied requests
            return web.json_response({"error": "Bad request. Proxied requests are not allowed"}, status=400)
        identity = _IDENTITY.match(request.path)
        if identity is not None:
            return self._identity_token(request)
        match = _IMDS.match(request.path)
        if match is None or match["name"] not in self.vms:
            return web.json_response({"error": "Not found"}, status=404)
        name, api_version = match["name"], request.query.get("api-version")
        if match["what"] == "instance/compute/userData":
            if request.method != "GET" or api_version != IMDS_USER_DATA_API_VERSION:
                return web.json_response({"error": "Bad request. api-version is invalid or was not specified"},
                                         status=400)
            if request.query.get("format") != "text":
                return web.json_response({"error": "Bad request. Query parameter format must be text"}, status=400)
            return web.Response(text=self.user_data.get(name, ""), content_type="text/plain")
        if api_version != IMDS_SCHEDULED_EVENTS_API_VERSION:
            return web.json_response({"error": "Bad request. api-version is invalid or was not specified"},
                                     status=400)
        if request.method == "POST":
            return self._approve(name, raw)
        events = [{k: v for k, v in e.items() if not k.startswith("_")} for e in self.events.get(name, [])]
        return web.json_response({"DocumentIncarnation": self._incarnation.get(name, 0), "Events": events})

    def _identity_token(self, request: web.Request) -> web.Response:
        """A managed identity's access token for Resource Manager (learn.microsoft.com/entra/identity/
        managed-identities-azure-resources/how-to-use-vm-token#get-a-token-using-http): GET with the api-version
        and the `resource` asked for; the answer's times are strings of seconds."""
        if request.method != "GET" or request.query.get("api-version") != IMDS_IDENTITY_API_VERSION:
            return web.json_response({"error": "invalid_request", "error_description": "bad api-version"},
                                     status=400)
        resource = request.query.get("resource", "")
        if resource.rstrip("/") != "https://management.azure.com":
            self.invalid.append(f"identity token for {resource!r}")
            return web.json_response({"error": "invalid_resource", "error_description": f"{resource!r}"}, status=400)
        now = int(time.time())
        return web.json_response({"access_token": self._token, "client_id": "00000000-0000-0000-0000-00000000d21e",
                                  "expires_in": "3600", "expires_on": str(now + 3600), "ext_expires_in": "3600",
                                  "not_before": str(now), "resource": resource, "token_type": "Bearer"})

    def _approve(self, name: str, raw: bytes) -> web.Response:
        """POST {"StartRequests": [{"EventId": ...}]}: the VM lets a scheduled event start now."""
        try:
            body = json.loads(raw)
            ids = [item["EventId"] for item in body["StartRequests"]]
        except (ValueError, KeyError, TypeError):
            return web.json_response({"error": "Bad request. Malformed StartRequests"}, status=400)
        self.event_approvals.append((name, body))
        if any(e["EventId"] in ids for e in self.events.get(name, [])):
            asyncio.get_running_loop().call_soon(self._evict, name)
        return web.Response(status=200)

    # -- helpers -------------------------------------------------------------------------------------

    def _call(self, hook: Callable[..., Any] | None, *args: Any) -> None:
        if hook is None:
            return
        result = hook(*args)
        if inspect.isawaitable(result):
            task = asyncio.ensure_future(result)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def recorded(self, method: str, pattern: str) -> list[RecordedRequest]:
        """The recorded requests of `method` whose path matches `pattern` (a regex, searched)."""
        return [r for r in self.requests if r.method == method and re.search(pattern, r.path, re.IGNORECASE)]


def _is_base64(text: str) -> bool:
    try:
        base64.b64decode(text, validate=True)
        return True
    except ValueError:
        return False


def _b64decode(text: str) -> str:
    return base64.b64decode(text).decode() if text else ""
