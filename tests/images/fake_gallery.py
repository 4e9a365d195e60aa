"""The fake ARM server (tests/vms/fake_arm.py) plus Azure compute galleries, for the image build.

Added paths, under ``/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.Compute``:

* ``galleries/{g}``, ``galleries/{g}/images/{i}``, ``galleries/{g}/images/{i}/versions/{v}``:
  GET, PUT (an Azure-AsyncOperation LRO), DELETE (LRO), list (GET on the collection), and PATCH of
  tags for versions. First-response status codes are those azure-mgmt-compute 39 accepts: PUT
  200 (existing) / 201 (new), PATCH 200 only, DELETE 202 (204 when already gone).
* ARM's rules that matter for ordering: an image definition needs its gallery, a version its
  definition; a parent with children cannot be deleted (409); a definition needs osType, osState,
  hyperVGeneration and identifier; a version's ``storageProfile.source`` must name an existing
  VM (``virtualMachineId``), disk or snapshot (``id``); the source VM's power state is recorded
  (``_captured_power``) so tests can check the builder was shut down before the copy.
* A VM may be created from a marketplace image (``imageReference`` publisher/offer/sku/version, as
  the builder is), and a VM created from a gallery version requires that version to exist and to
  have succeeded.
"""

from __future__ import annotations

import copy
from typing import Any

from fake_arm import ArmError, FakeARM

GALLERY = "Microsoft.Compute/galleries"
IMAGE = "Microsoft.Compute/galleries/images"
VERSION = "Microsoft.Compute/galleries/images/versions"


class FakeGalleryARM(FakeARM):
    def _route(self, method: str, path: str, body: Any) -> tuple[int, dict[str, str], Any]:
        segs = [s for s in path.split("/") if s]
        low = [s.lower() for s in segs]
        if len(segs) >= 7 and low[4] == "providers" and low[5] == "microsoft.compute" and low[6] == "galleries":
            for fault in self.faults:
                if fault.kind == "throttle" and fault.matches(method, path, body):
                    fault.hits += 1
                    raise ArmError(429, "TooManyRequests", "Rate limit exceeded; retry later.",
                                   {"Retry-After": f"{fault.retry_after:g}"})
            if segs[1] != self.subscription_id or segs[3].lower() != self.resource_group.lower():
                raise ArmError(404, "ResourceGroupNotFound", f"no resource group for {path}")
            return self._gallery_route(method, segs, body)
        return super()._route(method, path, body)

    # -- galleries ---------------------------------------------------------------------------

    def _gallery_route(self, method: str, segs: list[str], body: Any) -> tuple[int, dict[str, str], Any]:
        depth = len(segs)
        prefix = self.rg_prefix()
        kinds = {7: GALLERY, 8: GALLERY, 9: IMAGE, 10: IMAGE, 11: VERSION, 12: VERSION}
        if depth not in kinds or (depth >= 9 and segs[8].lower() != "images") or \
                (depth >= 11 and segs[10].lower() != "versions"):
            raise ArmError(404, "InvalidResourceType", "/".join(segs))
        arm_type = kinds[depth]
        if depth % 2 == 1:  # a collection: list
            if method != "GET":
                raise ArmError(405, "MethodNotAllowed", method)
            parent = f"{prefix}/{'/'.join(segs[5:depth])}".lower()
            items = [self._public(r) for r in self.resources.values()
                     if r["type"] == arm_type and r["id"].lower().rsplit("/", 2)[0] == parent]
            return 200, {}, {"value": items}
        rid = f"{prefix}/{'/'.join(segs[5:])}"
        name = segs[-1]
        if method == "GET":
            res = self.resources.get(rid.lower())
            if res is None:
                raise ArmError(404, "ResourceNotFound", f"The Resource '{arm_type}/{name}' was not found.")
            return 200, {}, self._public(res)
        if method == "PUT":
            return self._put_gallery_item(arm_type, rid, name, body or {})
        if method == "PATCH":
            res = self.resources.get(rid.lower())
            if res is None:
                raise ArmError(404, "ResourceNotFound", f"{rid} not found")
            if arm_type != VERSION or set(body or {}) - {"tags"}:
                raise ArmError(405, "MethodNotAllowed", "fake: PATCH only changes a version's tags")
            res["tags"] = dict((body or {}).get("tags") or {})
            return 200, self._lro("PATCH", rid, body), self._public(res)
        if method == "DELETE":
            res = self.resources.get(rid.lower())
            if res is None:
                return 204, {}, None
            if any(r["id"].lower().startswith(rid.lower() + "/") for r in self.resources.values()):
                raise ArmError(409, "CannotDeleteResource", f"{rid} has nested resources; delete them first")
            res["properties"]["provisioningState"] = "Deleting"

            def gone(err: dict[str, str] | None) -> None:
                if not err:
                    self.resources.pop(rid.lower(), None)

            return 202, self._lro("DELETE", rid, None, gone), None
        raise ArmError(405, "MethodNotAllowed", method)

    def _put_gallery_item(self, arm_type: str, rid: str, name: str, body: dict[str, Any]) -> tuple[int, dict[str, str], Any]:
        if not body.get("location"):
            raise ArmError(400, "LocationRequired", "The location property is required for this definition.")
        parent = rid.rsplit("/", 2)[0]
        if arm_type != GALLERY and parent.lower() not in self.resources:
            raise ArmError(404, "ParentResourceNotFound", f"Parent resource {parent} not found.")
        props = copy.deepcopy(body.get("properties") or {})
        existing = self.resources.get(rid.lower())
        res: dict[str, Any] = {"id": rid, "name": name, "type": arm_type, "location": body["location"],
                               "tags": dict(body.get("tags") or {}), "properties": props}
        if arm_type == IMAGE:
            missing = [k for k in ("osType", "osState", "identifier", "hyperVGeneration") if not props.get(k)]
            if missing:
                raise ArmError(400, "InvalidParameter", f"Required properties missing: {', '.join(missing)}")
        if arm_type == VERSION:
            if existing is not None and existing["properties"].get("provisioningState") not in ("Succeeded", "Failed"):
                raise ArmError(409, "OperationNotAllowed", f"{rid} is still being created")
            source = (props.get("storageProfile") or {}).get("source") or {}
            source_id = source.get("virtualMachineId") or source.get("id")
            src = self.resources.get((source_id or "").lower())
            if src is None:
                raise ArmError(400, "InvalidParameter", f"storageProfile.source {source_id!r} was not found.")
            res["_captured_power"] = src.get("_power")
            res["_source_type"] = src["type"]
            props.setdefault("publishingProfile", {})["publishedDate"] = "2026-01-01T00:00:00Z"
        props["provisioningState"] = "Updating" if existing else "Creating"
        self.resources[rid.lower()] = res
        headers = self._lro("PUT", rid, body, lambda err: self._set_state(rid, "Failed" if err else "Succeeded"))
        return (200 if existing else 201), headers, self._public(res)

    # -- VMs from marketplace images and from gallery versions -------------------------------

    def _put_vm(self, rid: str, name: str, res: dict[str, Any], existing: dict[str, Any] | None,
                body: dict[str, Any]) -> dict[str, str] | None:
        reference = ((res["properties"].get("storageProfile") or {}).get("imageReference")) or {}
        image_id = reference.get("id")
        if image_id and "/galleries/" in image_id.lower() and existing is None:
            version = self.resources.get(image_id.lower())
            if version is None or version["properties"].get("provisioningState") != "Succeeded":
                raise ArmError(404, "GalleryImageNotFound", f"The gallery image {image_id} is not available.")
        marketplace = not image_id and all(reference.get(k) for k in ("publisher", "offer", "sku", "version"))
        if marketplace:
            reference["id"] = "marketplace:" + ":".join(reference[k] for k in ("publisher", "offer", "sku", "version"))
        try:
            return super()._put_vm(rid, name, res, existing, body)
        finally:
            if marketplace:
                reference.pop("id", None)
