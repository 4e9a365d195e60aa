"""The stages of an image build, and the interface each cloud's builder implements.

    1 builder   the builder VM exists (with its security group / NSG open only to controller_cidr)
    2 ready     the WAA server inside the builder answered /probe: Windows is prepared
    3 capture   the image exists and is available (AWS: AMI + snapshots; Azure: gallery image version)
    4 verify    a VM booted from the image passed the probe and was deleted; the image is tagged verified
    5 cleanup   the builder and its network resources are gone

Every stage is idempotent and its completion is read from the cloud itself (tags and
deterministic names), never from local state: `status()` says which stages are done, and each
stage method first looks for its own result, so a rerun after a kill at any point continues where
the earlier run stopped and creates nothing twice.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from adapters.images.plan import conflicts
from adapters.images.spec import BuildSpec


class Stage(str, enum.Enum):
    BUILDER = "builder"
    READY = "ready"
    CAPTURE = "capture"
    VERIFY = "verify"
    CLEANUP = "cleanup"


STAGES: tuple[Stage, ...] = tuple(Stage)


class BuildError(RuntimeError):
    """A stage failed; the message names the build, the stage and the cloud's reason.

    `transient` is True when a cloud API call failed (after the SDK's own retries): running the
    stage again may succeed. Anything else (a missing base image, a timeout, a failed probe) is
    not retried by the flow; rerunning the build after fixing the cause resumes it.
    """

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


class BuildStatus(BaseModel):
    """What the cloud holds for one build name, stage by stage."""

    name: str
    provider: str
    builder_id: str | None = None  # the builder VM, while it exists
    builder_ready: bool = False  # its WAA server answered (tagged on the builder)
    builder_resources: list[str] = []  # everything of the builder still in the cloud (VM, disks, network)
    image_id: str | None = None
    image_state: str | None = None  # available / pending / failed (AWS); Succeeded / Creating ... (Azure)
    image_available: bool = False
    verified: bool = False
    verify_resources: list[str] = []  # a verification VM's leftovers
    tags: dict[str, str] = {}  # the image's tags
    builder_tags: dict[str, str] = {}  # the builder's tags (its container plan, source, size)

    def recorded(self) -> dict[str, str]:
        """What the cloud records about how this build was made: the image's tags, else the builder's."""
        return self.tags or self.builder_tags

    def done(self) -> dict[Stage, bool]:
        """Which stages are complete. A later stage done implies the earlier ones."""
        cleanup = self.verified and not self.builder_resources and not self.verify_resources
        verify = self.verified
        capture = self.image_available
        ready = capture or self.builder_ready
        builder = ready or self.builder_id is not None
        return {Stage.BUILDER: builder, Stage.READY: ready, Stage.CAPTURE: capture, Stage.VERIFY: verify,
                Stage.CLEANUP: cleanup}

    @property
    def complete(self) -> bool:
        return all(self.done().values())

    def lines(self) -> list[str]:
        """Human-readable status, one line per stage, for `arena image status`."""
        done = self.done()
        details = {
            Stage.BUILDER: self.builder_id or ("gone" if done[Stage.BUILDER] else "not created"),
            Stage.READY: "WAA server answered /probe" if done[Stage.READY] else "waiting for Windows / WAA",
            Stage.CAPTURE: f"{self.image_id} ({self.image_state})" if self.image_id else "no image yet",
            Stage.VERIFY: "verified" if self.verified else "not verified",
            Stage.CLEANUP: "builder deleted" if done[Stage.CLEANUP] else
            (f"left: {', '.join(self.builder_resources + self.verify_resources)}"
             if self.builder_resources or self.verify_resources else "pending"),
        }
        out = [f"build {self.name} ({self.provider})"]
        for number, stage in enumerate(STAGES, start=1):
            out.append(f"  {number} {stage.value:<8} {'done' if done[stage] else 'todo'}  {details[stage]}")
        return out


class ImageBuilder(abc.ABC):
    """One build's stages on one cloud. Each method is safe to call again after any failure."""

    spec: BuildSpec
    provider_name: str = ""

    def _init_common(self, spec: BuildSpec, waa_url_for: Any, verify_waa_url_for: Any, resolver: Any,
                     warn: Callable[[str], None], clock: Callable[[], Any]) -> None:
        """What every cloud's builder keeps: the spec (checked to be for this cloud) and the hooks."""
        if spec.provider != self.provider_name:
            raise ValueError(f"build {spec.name} is for {spec.provider}, not {self.provider_name}")
        self.spec = spec
        self._waa_url_for = waa_url_for
        self._verify_waa_url_for = verify_waa_url_for or waa_url_for
        self._resolver = resolver
        self._warn = warn
        self._clock = clock

    @abc.abstractmethod
    def status(self) -> BuildStatus:
        """What the cloud holds for this build (read only)."""

    @abc.abstractmethod
    def ensure_builder(self) -> str:
        """Stage 1: the builder VM's id, created with its network pieces unless it exists."""

    @abc.abstractmethod
    def wait_builder_ready(self) -> float:
        """Stage 2: wait (spec.ready_timeout) until the builder's WAA server answers /probe, then
        tag the builder ready; returns the seconds waited."""

    @abc.abstractmethod
    def capture(self) -> str:
        """Stage 3: the image id, captured from the builder unless it exists; waits until available."""

    @abc.abstractmethod
    def verify(self) -> str:
        """Stage 4: boot one VM from the image, probe it, delete it, tag the image verified;
        returns a one-line summary of the probe."""

    @abc.abstractmethod
    def cleanup(self) -> list[str]:
        """Stage 5: delete the builder and its network resources (and any verification VM's
        leftovers); returns what was deleted."""

    def close(self) -> None:
        """Release clients; safe to repeat."""


def check_same_build(spec: BuildSpec, status: BuildStatus) -> None:
    """BuildError when the cloud holds this build name made from other settings."""
    found = conflicts(spec, status.recorded())
    if found:
        raise BuildError(f"build {spec.name} already exists in the cloud with other settings ({'; '.join(found)}); "
                         "give the new build another --name, or rerun with the original settings to resume")


def run_build(builder: ImageBuilder, *, log: Callable[[str], None] = print,
              after_stage: Callable[[Stage], None] | None = None) -> str:
    """All stages in order, without Prefect (flows/image_build.py runs them as tasks); returns
    the image id. A finished, verified build is a no-op. `after_stage` runs after each stage
    (a progress hook; tests raise from it to simulate a kill)."""
    status = builder.status()
    check_same_build(builder.spec, status)
    if status.complete and status.image_id:
        log(f"image {status.image_id} of build {status.name} exists and is verified; nothing to do")
        return status.image_id
    steps: list[tuple[Stage, Callable[[], object]]] = [
        (Stage.BUILDER, builder.ensure_builder), (Stage.READY, builder.wait_builder_ready),
        (Stage.CAPTURE, builder.capture), (Stage.VERIFY, builder.verify), (Stage.CLEANUP, builder.cleanup),
    ]
    image_id = status.image_id or ""
    # Each stage method checks the cloud for its own result too; this only skips the stages
    # already known to be done when the build (re)started.
    done = status.done()
    for stage, step in steps:
        if done[stage] and stage is not Stage.CLEANUP:
            log(f"{stage.value}: already done")
        else:
            result = step()
            if stage is Stage.CAPTURE:
                image_id = str(result)
            log(f"{stage.value}: {result}")
        if after_stage is not None:
            after_stage(stage)
    return image_id
