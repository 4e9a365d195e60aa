"""A fake Azure Resource Manager for the Azure provider's tests, over loopback TLS.

Only the Compute and Network REST paths the provider calls, under
``/subscriptions/{sub}/resourceGroups/{rg}/providers/...``:

* Microsoft.Compute/virtualMachines: GET, PUT, DELETE, list; POST start / deallocate / powerOff /
  restart; GET instanceView.
* Microsoft.Compute/disks and /snapshots: GET, PUT (Copy from a disk or snapshot), PATCH (tags),
  DELETE, list by resource group.
* Microsoft.Network/networkInterfaces, publicIPAddresses, networkSecurityGroups, virtualNetworks:
  GET, PUT, DELETE, list.

Served with ``http.server`` + ``ssl`` and a ``trustme`` CA, so the SDK's bearer-token policy runs
unchanged (``connection_verify=fake.ca_path``). Long-running operations answer with an
``Azure-AsyncOperation`` URL (https, ``Retry-After: 0``), report ``InProgress`` for
``polls_before_done`` polls and then ``Succeeded`` or ``Failed``. First-response status codes are
the ones each SDK operation accepts (azure-mgmt-compute 39 / azure-mgmt-network 33): VM and network
PUT 200/201, disk and snapshot PUT/PATCH 202 (the SDK rejects 201), POST actions 202, DELETE 202
(204 when the resource is already gone), GET 200, missing resource 404.

It keeps ARM's dependency rules that matter for ordering bugs: a NIC attached to a VM, a public
IP on a NIC, an NSG or subnet a NIC uses, an attached disk cannot be deleted; an OS disk can only
be swapped on a deallocated VM (409 OperationNotAllowed); NIC and VM must share a location.

Faults: ``throttle`` (429 with Retry-After), ``capacity`` (for a size and/or location: sync 409
for SkuNotAvailable / OperationNotAllowed / QuotaExceeded, else an LRO ending Failed that leaves
the VM in state Failed, as Azure does), ``fail_lro`` (any matching LRO ends Failed with a code).
Every request is logged (method, path, api-version, JSON body, status).
"""

from __future__ import annotations

import copy
import itertools
import json
import shutil
import ssl
import tempfile
import threading
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import trustme

TYPES = {
    "microsoft.compute/virtualmachines": "Microsoft.Compute/virtualMachines",
    "microsoft.compute/disks": "Microsoft.Compute/disks",
    "microsoft.compute/snapshots": "Microsoft.Compute/snapshots",
    "microsoft.network/networkinterfaces": "Microsoft.Network/networkInterfaces",
    "microsoft.network/publicipaddresses": "Microsoft.Network/publicIPAddresses",
    "microsoft.network/networksecuritygroups": "Microsoft.Network/networkSecurityGroups",
    "microsoft.network/virtualnetworks": "Microsoft.Network/virtualNetworks",
}
SYNC_CAPACITY_CODES = {"SkuNotAvailable", "OperationNotAllowed", "QuotaExceeded"}


def vm_sku(size: str, family: str, vcpus: int, location: str, restricted: bool = False) -> dict[str, Any]:
    """A resource SKU entry for a VM size, as GET .../providers/Microsoft.Compute/skus lists it."""
    return {
        "resourceType": "virtualMachines", "name": size, "tier": "Standard", "size": size.split("_", 1)[-1],
        "family": family, "locations": [location], "locationInfo": [{"location": location, "zones": []}],
        "capabilities": [{"name": "vCPUs", "value": str(vcpus)}, {"name": "MemoryGB", "value": str(vcpus * 4)}],
        "restrictions": [{"type": "Location", "values": [location], "reasonCode": "NotAvailableForSubscription",
                          "restrictionInfo": {"locations": [location]}}] if restricted else [],
    }


class ArmError(Exception):
    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message, self.headers = status, code, message, headers or {}


@dataclass
class LoggedRequest:
    method: str
    path: str
    api_version: str | None
    body: Any
    status: int = 0

    @property
    def lpath(self) -> str:
        return self.path.lower()


@dataclass
class Fault:
    kind: str  # "throttle" | "capacity" | "fail_lro"
    method: str | None = None
    path_contains: str | None = None
    size: str | None = None
    location: str | None = None
    code: str = ""
    message: str = ""
    retry_after: float = 1.0
    times: int | None = 1  # None: forever
    hits: int = 0

    def matches(self, method: str, path: str, body: Any) -> bool:
        if self.times is not None and self.hits >= self.times:
            return False
        if self.method and self.method != method:
            return False
        if self.path_contains and self.path_contains.lower() not in path.lower():
            return False
        if self.kind == "capacity":
            if method != "PUT" or "/microsoft.compute/virtualmachines/" not in path.lower():
                return False
            props = (body or {}).get("properties") or {}
            if self.size and ((props.get("hardwareProfile") or {}).get("vmSize") or "").lower() != self.size.lower():
                return False
            if self.location and ((body or {}).get("location") or "").lower() != self.location.lower():
                return False
        return True


@dataclass
class Operation:
    id: str
    polls_left: int
    error: dict[str, str] | None = None
    on_done: Any = None
    done: bool = False
    status: str = "InProgress"


@dataclass
class FakeARM:
    subscription_id: str = "00000000-0000-0000-0000-00000000f00d"
    resource_group: str = "rg-waa-test"
    polls_before_done: int = 1
    resources: dict[str, dict[str, Any]] = field(default_factory=dict)  # lower-case id -> resource JSON
    requests: list[LoggedRequest] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    # Subscription-level compute facts (`arena doctor`): VM sizes per location and core quotas.
    skus: list[dict[str, Any]] = field(default_factory=lambda: [
        vm_sku(size, family, vcpus, location)
        for location in ("westeurope", "northeurope")
        for size, family, vcpus in (("Standard_D8ds_v5", "standardDDSv5Family", 8),
                                    ("Standard_D8s_v5", "standardDSv5Family", 8))
    ])
    usages: dict[str, dict[str, tuple[int, int]]] = field(default_factory=lambda: {
        location: {"standardDDSv5Family": (0, 100), "standardDSv5Family": (0, 100), "cores": (0, 200)}
        for location in ("westeurope", "northeurope")
    })  # location -> quota name -> (current value, limit)

    def __post_init__(self) -> None:
        self._lock = threading.RLock()
        self._ops: dict[str, Operation] = {}
        self._ip_counter = itertools.count(10)
        self._dir = Path(tempfile.mkdtemp(prefix="fake-arm-"))
        self.ca = trustme.CA()
        self.ca_path = str(self._dir / "ca.pem")
        self.ca.cert_pem.write_to_path(self.ca_path)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.ca.issue_cert("127.0.0.1", "localhost").configure_cert(context)
        fake = self

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def finish_request(self, request, client_address):  # TLS handshake in the worker thread
                try:
                    tls = context.wrap_socket(request, server_side=True)
                except (ssl.SSLError, OSError):
                    return
                try:
                    super().finish_request(tls, client_address)
                finally:
                    try:
                        tls.close()
                    except OSError:
                        pass

        class Handler(_Handler):
            arm = fake

        self._server = Server(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        self.base_url = f"https://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.02},
                                        name="fake-arm", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        shutil.rmtree(self._dir, ignore_errors=True)  # the CA's file

    # -- test helpers ----------------------------------------------------------------------

    def rg_prefix(self, rg: str | None = None) -> str:
        return f"/subscriptions/{self.subscription_id}/resourceGroups/{rg or self.resource_group}/providers"

    def rid(self, arm_type: str, name: str) -> str:
        return f"{self.rg_prefix()}/{arm_type}/{name}"

    def throttle(self, method: str, path_contains: str, *, retry_after: float = 1.0, times: int = 1) -> Fault:
        fault = Fault("throttle", method=method, path_contains=path_contains, retry_after=retry_after, times=times)
        self.faults.append(fault)
        return fault

    def capacity(self, *, size: str | None = None, location: str | None = None, code: str = "AllocationFailed",
                 times: int | None = None) -> Fault:
        fault = Fault("capacity", size=size, location=location, code=code, times=times,
                      message=f"Allocation failed: no capacity for {size or 'any size'} in {location or 'any region'}"
                      if code not in SYNC_CAPACITY_CODES else
                      f"Operation could not be completed as it results in exceeding approved quota ({code}).")
        self.faults.append(fault)
        return fault

    def fail_lro(self, method: str, path_contains: str, *, code: str = "InternalExecutionError",
                 message: str = "An internal execution error occurred.", times: int | None = 1) -> Fault:
        fault = Fault("fail_lro", method=method, path_contains=path_contains, code=code, message=message, times=times)
        self.faults.append(fault)
        return fault

    def add_resource(self, arm_type: str, name: str, *, location: str = "westeurope",
                     tags: dict[str, str] | None = None, properties: dict[str, Any] | None = None,
                     rg: str | None = None) -> str:
        """Insert a resource directly (someone else's, or an untagged one) without any LRO."""
        rid = f"{self.rg_prefix(rg)}/{arm_type}/{name}"
        with self._lock:
            self.resources[rid.lower()] = {
                "id": rid, "name": name, "type": arm_type, "location": location, "tags": dict(tags or {}),
                "properties": {"provisioningState": "Succeeded", **(properties or {})},
            }
        return rid

    def get(self, arm_type: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            res = self.resources.get(self.rid(arm_type, name).lower())
            return copy.deepcopy(res)

    def of_type(self, arm_type: str) -> list[dict[str, Any]]:
        with self._lock:
            return [copy.deepcopy(r) for r in self.resources.values() if r["type"].lower() == arm_type.lower()]

    def calls(self, method: str | None = None, contains: str | None = None) -> list[LoggedRequest]:
        with self._lock:
            return [r for r in self.requests if (method is None or r.method == method)
                    and (contains is None or contains.lower() in r.lpath)]

    def clear_log(self) -> None:
        with self._lock:
            self.requests.clear()

    # -- request handling ------------------------------------------------------------------

    def handle(self, method: str, raw_path: str, body: Any) -> tuple[int, dict[str, str], Any]:
        parts = urlsplit(raw_path)
        path = parts.path
        api_version = (parse_qs(parts.query).get("api-version") or [None])[0]
        entry = LoggedRequest(method, path, api_version, body)
        with self._lock:
            self.requests.append(entry)
            try:
                status, headers, payload = self._route(method, path, body)
            except ArmError as exc:
                status, headers = exc.status, exc.headers
                payload = {"error": {"code": exc.code, "message": exc.message}}
            entry.status = status
        return status, headers, payload

    def _route(self, method: str, path: str, body: Any) -> tuple[int, dict[str, str], Any]:
        for fault in self.faults:
            if fault.kind == "throttle" and fault.matches(method, path, body):
                fault.hits += 1
                raise ArmError(429, "TooManyRequests", "Rate limit exceeded; retry later.",
                               {"Retry-After": f"{fault.retry_after:g}"})
        segs = [s for s in path.split("/") if s]
        low = [s.lower() for s in segs]
        if low[:1] == ["fake-operations"] and len(segs) >= 2:
            return self._poll(segs[1], result=len(segs) == 3)
        if len(segs) >= 5 and low[0] == "subscriptions" and low[2] == "providers" and low[3] == "microsoft.compute":
            return self._subscription_compute(method, segs, low)
        if len(segs) < 6 or low[0] != "subscriptions" or low[2] != "resourcegroups" or low[4] != "providers":
            raise ArmError(404, "InvalidResourceType", f"no route for {path}")
        if segs[1] != self.subscription_id:
            raise ArmError(404, "SubscriptionNotFound", f"subscription {segs[1]} not found")
        rg = segs[3]
        if rg.lower() != self.resource_group.lower():
            raise ArmError(404, "ResourceGroupNotFound", f"Resource group '{rg}' could not be found.")
        type_key = f"{low[5]}/{low[6]}" if len(segs) >= 7 else ""
        if type_key not in TYPES:
            raise ArmError(404, "InvalidResourceType", f"no fake for {path}")
        arm_type = TYPES[type_key]
        if len(segs) == 7:
            if method != "GET":
                raise ArmError(405, "MethodNotAllowed", method)
            items = [self._public(r) for r in self.resources.values()
                     if r["type"] == arm_type and r["id"].lower().startswith(self.rg_prefix().lower() + "/")]
            return 200, {}, {"value": items}
        name = segs[7]
        rid = f"{self.rg_prefix()}/{arm_type}/{name}"
        if len(segs) == 9:
            if arm_type != "Microsoft.Compute/virtualMachines":
                raise ArmError(404, "InvalidResourceType", path)
            return self._vm_action(method, rid, low[8])
        if len(segs) != 8:
            raise ArmError(404, "InvalidResourceType", path)
        if method == "GET":
            res = self.resources.get(rid.lower())
            if res is None:
                raise ArmError(404, "ResourceNotFound" if "Network" in arm_type else "NotFound",
                               f"The Resource '{arm_type}/{name}' under resource group '{rg}' was not found.")
            return 200, {}, self._public(res)
        if method == "PUT":
            return self._put(arm_type, rid, name, body or {})
        if method == "PATCH":
            return self._patch(arm_type, rid, body or {})
        if method == "DELETE":
            return self._delete(arm_type, rid)
        raise ArmError(405, "MethodNotAllowed", method)

    def _subscription_compute(self, method: str, segs: list[str], low: list[str]) -> tuple[int, dict[str, str], Any]:
        """GET .../providers/Microsoft.Compute/skus and .../locations/{loc}/usages."""
        if method != "GET":
            raise ArmError(405, "MethodNotAllowed", method)
        if segs[1] != self.subscription_id:
            raise ArmError(404, "SubscriptionNotFound", f"subscription {segs[1]} not found")
        if low[4:] == ["skus"]:
            return 200, {}, {"value": copy.deepcopy(self.skus)}
        if len(segs) == 7 and low[4] == "locations" and low[6] == "usages":
            quotas = self.usages.get(segs[5].lower(), {})
            return 200, {}, {"value": [
                {"unit": "Count", "currentValue": current, "limit": limit,
                 "name": {"value": name, "localizedValue": name}}
                for name, (current, limit) in quotas.items()]}
        raise ArmError(404, "InvalidResourceType", "/".join(segs))

    # -- LROs ------------------------------------------------------------------------------

    def _lro(self, method: str, path: str, body: Any, on_done: Any = None,
             error: dict[str, str] | None = None) -> dict[str, str]:
        for fault in self.faults:
            if fault.kind == "fail_lro" and fault.matches(method, path, body):
                fault.hits += 1
                error = {"code": fault.code, "message": fault.message}
        op = Operation(uuid.uuid4().hex, self.polls_before_done, error, on_done)
        self._ops[op.id] = op
        if self.polls_before_done <= 0:
            self._finish(op)
        url = f"{self.base_url}/fake-operations/{op.id}?api-version=2025-01-01"
        return {"Azure-AsyncOperation": url, "Location": f"{self.base_url}/fake-operations/{op.id}/result",
                "Retry-After": "0"}

    def _finish(self, op: Operation) -> None:
        if op.done:
            return
        op.done = True
        op.status = "Failed" if op.error else "Succeeded"
        if op.on_done:
            op.on_done(op.error)

    def _poll(self, op_id: str, result: bool) -> tuple[int, dict[str, str], Any]:
        op = self._ops.get(op_id)
        if op is None:
            raise ArmError(404, "NotFound", f"operation {op_id}")
        if result:  # the Location URL of a POST/DELETE: done -> 200 without a body
            if not op.done:
                return 202, {"Retry-After": "0", "Location": f"{self.base_url}/fake-operations/{op.id}/result"}, None
            return 200, {}, None
        if not op.done:
            if op.polls_left > 0:
                op.polls_left -= 1
            else:
                self._finish(op)
        payload: dict[str, Any] = {"name": op.id, "status": op.status, "startTime": "2026-01-01T00:00:00Z"}
        if op.status == "Failed":
            payload["error"] = op.error
        return 200, {"Retry-After": "0"}, payload

    def _set_state(self, rid: str, state: str) -> None:
        res = self.resources.get(rid.lower())
        if res is not None:
            res["properties"]["provisioningState"] = state

    # -- PUT / PATCH / DELETE --------------------------------------------------------------

    def _require(self, rid: str | None, what: str) -> dict[str, Any]:
        res = self.resources.get((rid or "").lower())
        if res is None:
            raise ArmError(400, "InvalidResourceReference", f"{what} {rid} was not found.")
        return res

    def _put(self, arm_type: str, rid: str, name: str, body: dict[str, Any]) -> tuple[int, dict[str, str], Any]:
        if not body.get("location"):
            raise ArmError(400, "LocationRequired", "The location property is required for this definition.")
        existing = self.resources.get(rid.lower())
        if existing is not None and existing["location"].lower() != body["location"].lower():
            raise ArmError(409, "InvalidResourceLocation",
                           f"The resource '{name}' already exists in location '{existing['location']}'.")
        props = copy.deepcopy(body.get("properties") or {})
        res = {"id": rid, "name": name, "type": arm_type, "location": body["location"],
               "tags": dict(body.get("tags") or {}), "properties": props}
        if "sku" in body:
            res["sku"] = body["sku"]
        state = "Updating" if existing else "Creating"
        error = None
        if arm_type == "Microsoft.Compute/virtualMachines":
            error = self._put_vm(rid, name, res, existing, body)
            status = 200 if existing else 201
        elif arm_type in ("Microsoft.Compute/disks", "Microsoft.Compute/snapshots"):
            self._put_disk_like(arm_type, res, existing)
            status = 202
        else:
            self._put_network(arm_type, rid, res, existing)
            status = 200 if existing else 201
        props["provisioningState"] = state
        self.resources[rid.lower()] = res

        def done(err: dict[str, str] | None) -> None:
            self._set_state(rid, "Failed" if err else "Succeeded")
            if arm_type == "Microsoft.Compute/virtualMachines" and not err:
                vm = self.resources.get(rid.lower())
                if vm is not None and vm.get("_power") in (None, "creating"):
                    vm["_power"] = "running"

        headers = self._lro("PUT", rid, body, done, error)
        return status, headers, None if status == 202 else self._public(res)

    @staticmethod
    def _public(res: dict[str, Any]) -> dict[str, Any]:
        return {k: copy.deepcopy(v) for k, v in res.items() if not k.startswith("_")}

    def _put_vm(self, rid: str, name: str, res: dict[str, Any], existing: dict[str, Any] | None,
                body: dict[str, Any]) -> dict[str, str] | None:
        props = res["properties"]
        size = (props.get("hardwareProfile") or {}).get("vmSize")
        if not size:
            raise ArmError(400, "InvalidParameter", "Required parameter 'hardwareProfile.vmSize' is missing.")
        if "adminPassword" in json.dumps(props.get("osProfile") or {}):
            raise ArmError(400, "InvalidParameter", "fake: this product never sets passwords")
        error = None
        for fault in self.faults:
            if fault.kind == "capacity" and fault.matches("PUT", rid, body):
                fault.hits += 1
                if fault.code in SYNC_CAPACITY_CODES:
                    raise ArmError(409, fault.code, fault.message)
                error = {"code": fault.code, "message": fault.message}
        nics = (props.get("networkProfile") or {}).get("networkInterfaces") or []
        if not nics:
            raise ArmError(400, "InvalidParameter", "At least one network interface is required.")
        for ref in nics:
            nic = self._require(ref.get("id"), "Network interface")
            if nic["location"].lower() != res["location"].lower():
                raise ArmError(400, "InvalidResourceReference",
                               f"NIC {nic['id']} is in {nic['location']}, VM in {res['location']}.")
            owner = ((nic["properties"].get("virtualMachine")) or {}).get("id")
            if owner and owner.lower() != rid.lower():
                raise ArmError(400, "NicInUse", f"NIC {nic['id']} is attached to {owner}.")
        os_disk = (props.get("storageProfile") or {}).get("osDisk") or {}
        res["_power"] = (existing or {}).get("_power", "creating")
        if existing is None:
            if os_disk.get("createOption") == "FromImage":
                if not ((props["storageProfile"].get("imageReference") or {}).get("id")):
                    raise ArmError(400, "InvalidParameter", "imageReference.id is required with FromImage.")
                disk_name = os_disk.get("name") or f"{name}_OsDisk_1_{uuid.uuid4().hex[:12]}"
                disk_id = self.rid("Microsoft.Compute/disks", disk_name)
                if disk_id.lower() in self.resources:
                    raise ArmError(409, "ConflictingUserInput", f"Disk {disk_name} already exists.")
                # Azure does not copy the VM's tags onto the OS disk it creates.
                self.resources[disk_id.lower()] = {
                    "id": disk_id, "name": disk_name, "type": "Microsoft.Compute/disks", "location": res["location"],
                    "tags": {}, "managedBy": rid, "sku": {"name": (os_disk.get("managedDisk") or {}).get(
                        "storageAccountType", "Premium_LRS")},
                    "properties": {"provisioningState": "Succeeded", "diskState": "Attached", "diskSizeGB": 128,
                                   "creationData": {"createOption": "FromImage"}},
                }
                os_disk["name"] = disk_name
                os_disk.setdefault("managedDisk", {})["id"] = disk_id
            else:
                raise ArmError(400, "InvalidParameter", "fake: only FromImage OS disks are modelled")
            props["vmId"] = str(uuid.uuid4())
        else:
            old_id = ((existing["properties"]["storageProfile"]["osDisk"].get("managedDisk")) or {}).get("id", "")
            new_id = (os_disk.get("managedDisk") or {}).get("id", "")
            if new_id and new_id.lower() != old_id.lower():
                if existing.get("_power") != "deallocated":
                    raise ArmError(409, "OperationNotAllowed",
                                   "Changing the OS disk is not allowed while the VM is running; deallocate it.")
                new_disk = self._require(new_id, "Disk")
                if new_disk.get("managedBy"):
                    raise ArmError(409, "OperationNotAllowed", f"Disk {new_id} is attached to {new_disk['managedBy']}.")
                old_disk = self.resources.get(old_id.lower())
                if old_disk is not None:
                    old_disk["managedBy"] = None
                    old_disk["properties"]["diskState"] = "Unattached"
                new_disk["managedBy"] = rid
                new_disk["properties"]["diskState"] = "Reserved"
            props["vmId"] = existing["properties"].get("vmId")
        for ref in nics:
            self.resources[ref["id"].lower()]["properties"]["virtualMachine"] = {"id": rid}
        return error

    def _put_disk_like(self, arm_type: str, res: dict[str, Any], existing: dict[str, Any] | None) -> None:
        creation = res["properties"].get("creationData") or {}
        if existing is None:
            if creation.get("createOption") != "Copy":
                raise ArmError(400, "InvalidParameter", "fake: only createOption Copy is modelled")
            source = self._require(creation.get("sourceResourceId"), "Source")
            if source["type"] not in ("Microsoft.Compute/disks", "Microsoft.Compute/snapshots"):
                raise ArmError(400, "InvalidParameter", "Copy source must be a disk or snapshot")
            res["properties"]["diskSizeGB"] = source["properties"].get("diskSizeGB", 128)
        else:
            res["managedBy"] = existing.get("managedBy")
        if arm_type == "Microsoft.Compute/disks":
            res["properties"]["diskState"] = "Attached" if res.get("managedBy") else "Unattached"

    def _put_network(self, arm_type: str, rid: str, res: dict[str, Any], existing: dict[str, Any] | None) -> None:
        props = res["properties"]
        if arm_type == "Microsoft.Network/publicIPAddresses":
            props["ipAddress"] = (existing or {}).get("properties", {}).get("ipAddress") or \
                f"203.0.113.{next(self._ip_counter)}"
            props["ipConfiguration"] = (existing or {}).get("properties", {}).get("ipConfiguration")
        elif arm_type == "Microsoft.Network/virtualNetworks":
            for subnet in props.get("subnets") or []:
                subnet["id"] = f"{rid}/subnets/{subnet['name']}"
        elif arm_type == "Microsoft.Network/networkSecurityGroups":
            for rule in props.get("securityRules") or []:
                rule["id"] = f"{rid}/securityRules/{rule['name']}"
        elif arm_type == "Microsoft.Network/networkInterfaces":
            nsg = (props.get("networkSecurityGroup") or {}).get("id")
            if nsg:
                self._require(nsg, "Network security group")
            for config in props.get("ipConfigurations") or []:
                cp = config.setdefault("properties", {})
                config["id"] = f"{rid}/ipConfigurations/{config['name']}"
                subnet_id = (cp.get("subnet") or {}).get("id", "")
                vnet_id, _, subnet_name = subnet_id.rpartition("/subnets/")
                vnet = self._require(vnet_id, "Virtual network")
                if not any(s["name"] == subnet_name for s in vnet["properties"].get("subnets") or []):
                    raise ArmError(400, "InvalidResourceReference", f"Subnet {subnet_id} not found.")
                if vnet["location"].lower() != res["location"].lower():
                    raise ArmError(400, "InvalidResourceReference", "NIC and VNet must be in the same location")
                pip_id = (cp.get("publicIPAddress") or {}).get("id")
                if pip_id:
                    pip = self._require(pip_id, "Public IP address")
                    used = (pip["properties"].get("ipConfiguration") or {}).get("id", "")
                    if used and not used.lower().startswith(rid.lower() + "/"):
                        raise ArmError(400, "PublicIPAddressInUse", f"{pip_id} is in use by {used}")
                    pip["properties"]["ipConfiguration"] = {"id": config["id"]}
                cp["privateIPAddress"] = ((existing or {}).get("properties", {}).get("ipConfigurations") or [{}])[0] \
                    .get("properties", {}).get("privateIPAddress") or f"10.42.0.{next(self._ip_counter)}"
            if existing is not None:
                props["virtualMachine"] = existing["properties"].get("virtualMachine")

    def _patch(self, arm_type: str, rid: str, body: dict[str, Any]) -> tuple[int, dict[str, str], Any]:
        res = self.resources.get(rid.lower())
        if res is None:
            raise ArmError(404, "NotFound", f"{rid} not found")
        if arm_type == "Microsoft.Compute/virtualMachines":
            # A VM update (tags only here) answers 200 with the VM, as azure-mgmt-compute requires.
            if set(body) - {"tags"}:
                raise ArmError(405, "MethodNotAllowed", "fake: a VM PATCH may change only its tags")
            res["tags"] = dict(body.get("tags") or {})
            return 200, self._lro("PATCH", rid, body), self._public(res)
        if arm_type not in ("Microsoft.Compute/disks", "Microsoft.Compute/snapshots"):
            raise ArmError(405, "MethodNotAllowed", "fake: PATCH only for VMs (tags), disks and snapshots")
        if "tags" in body:
            res["tags"] = dict(body["tags"] or {})
        res["properties"]["provisioningState"] = "Updating"
        headers = self._lro("PATCH", rid, body, lambda err: self._set_state(rid, "Failed" if err else "Succeeded"))
        return 202, headers, None

    def _delete(self, arm_type: str, rid: str) -> tuple[int, dict[str, str], Any]:
        res = self.resources.get(rid.lower())
        if res is None:
            return 204, {}, None
        props = res["properties"]
        if arm_type == "Microsoft.Network/networkInterfaces" and (props.get("virtualMachine") or {}).get("id"):
            raise ArmError(400, "NicInUse", f"NIC {rid} is attached to VM {props['virtualMachine']['id']}.")
        if arm_type == "Microsoft.Network/publicIPAddresses" and (props.get("ipConfiguration") or {}).get("id"):
            raise ArmError(400, "PublicIPAddressCannotBeDeleted",
                           f"{rid} is in use by {props['ipConfiguration']['id']}.")
        if arm_type == "Microsoft.Compute/disks" and res.get("managedBy"):
            raise ArmError(409, "OperationNotAllowed", f"Disk {res['name']} is attached to VM {res['managedBy']}.")
        nics = [r for r in self.resources.values() if r["type"] == "Microsoft.Network/networkInterfaces"]
        if arm_type == "Microsoft.Network/networkSecurityGroups":
            if any(((n["properties"].get("networkSecurityGroup") or {}).get("id") or "").lower() == rid.lower()
                   for n in nics):
                raise ArmError(400, "InUseNetworkSecurityGroupCannotBeDeleted", f"{rid} is in use.")
        if arm_type == "Microsoft.Network/virtualNetworks":
            for n in nics:
                for c in n["properties"].get("ipConfigurations") or []:
                    if ((c.get("properties", {}).get("subnet") or {}).get("id") or "").lower().startswith(rid.lower()):
                        raise ArmError(400, "InUseSubnetCannotBeDeleted", f"A subnet of {rid} is in use by {n['id']}.")
        props["provisioningState"] = "Deleting"

        def done(err: dict[str, str] | None) -> None:
            if err:
                self._set_state(rid, "Failed")
                return
            gone = self.resources.pop(rid.lower(), None)
            if gone is None:
                return
            if arm_type == "Microsoft.Compute/virtualMachines":
                os_disk = gone["properties"]["storageProfile"]["osDisk"]
                disk = self.resources.get(((os_disk.get("managedDisk") or {}).get("id") or "").lower())
                if disk is not None:
                    if os_disk.get("deleteOption") == "Delete":
                        self.resources.pop(disk["id"].lower(), None)
                    else:
                        disk["managedBy"] = None
                        disk["properties"]["diskState"] = "Unattached"
                for ref in (gone["properties"].get("networkProfile") or {}).get("networkInterfaces") or []:
                    nic = self.resources.get(ref["id"].lower())
                    if nic is not None:
                        nic["properties"]["virtualMachine"] = None
            if arm_type == "Microsoft.Network/networkInterfaces":
                for c in gone["properties"].get("ipConfigurations") or []:
                    pip = self.resources.get(((c.get("properties", {}).get("publicIPAddress") or {}).get("id")
                                              or "").lower())
                    if pip is not None:
                        pip["properties"]["ipConfiguration"] = None

        return 202, self._lro("DELETE", rid, None, done), None

    def _vm_action(self, method: str, rid: str, action: str) -> tuple[int, dict[str, str], Any]:
        vm = self.resources.get(rid.lower())
        if vm is None:
            raise ArmError(404, "NotFound", f"VM {rid} not found")
        if action == "instanceview" and method == "GET":
            power = vm.get("_power") or "running"
            power = "starting" if power == "creating" else power
            return 200, {}, {"statuses": [
                {"code": f"ProvisioningState/{vm['properties'].get('provisioningState', 'Succeeded').lower()}"},
                {"code": f"PowerState/{power}"}]}
        if method != "POST":
            raise ArmError(405, "MethodNotAllowed", f"{method} {action}")
        transitions = {"start": ("starting", "running"), "deallocate": ("deallocating", "deallocated"),
                       "poweroff": ("stopping", "stopped"), "restart": ("restarting", "running")}
        if action not in transitions:
            raise ArmError(404, "InvalidResourceType", f"no action {action}")
        if action == "restart" and vm.get("_power") != "running":
            raise ArmError(409, "OperationNotAllowed", "Cannot restart a VM that is not running.")
        during, after = transitions[action]
        vm["_power"] = during

        def done(err: dict[str, str] | None) -> None:
            current = self.resources.get(rid.lower())
            if current is not None and not err:
                current["_power"] = after

        return 202, self._lro("POST", f"{rid}/{action}", None, done), None


class _Handler(BaseHTTPRequestHandler):
    arm: FakeARM
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - keep test output quiet
        pass

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        if not (self.headers.get("Authorization") or "").startswith("Bearer "):
            status, headers, payload = 401, {}, {"error": {"code": "AuthenticationFailed", "message": "no token"}}
        else:
            status, headers, payload = self.arm.handle(self.command, self.path, body)
        data = b"" if payload is None else json.dumps(payload).encode()
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        if data:
            self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("x-ms-request-id", uuid.uuid4().hex)
        self.end_headers()
        if data:
            self.wfile.write(data)

    do_GET = do_PUT = do_POST = do_PATCH = do_DELETE = _serve
