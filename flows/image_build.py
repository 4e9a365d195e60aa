"""The image-build flow: make the VM image the cloud providers boot from, resumably.

    builder VM -> WAA ready (Windows prepared) -> capture image -> verify a VM from it -> delete builder

Each stage is a task (tasks/image_build.py); the flow reads the build's state from the cloud
first and skips what is already done, so rerunning the same spec after a crash, a kill or a
failed stage continues where it stopped, and a finished, verified build only prints its image id.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger

from adapters.images.builders import BuilderOptions, make_builder
from adapters.images.spec import BuildSpec
from adapters.images.stages import ImageBuilder, Stage, check_same_build
from tasks.image_build import (
    capture_image,
    cleanup_builder,
    create_builder,
    read_build_status,
    verify_image,
    wait_builder_ready,
)


def _run_name() -> str:
    from prefect.runtime import flow_run

    spec = BuildSpec.model_validate(flow_run.parameters["spec"])
    return f"image-{spec.name}-{spec.provider}"


@flow(name="image-build", flow_run_name=_run_name)
def image_build(spec: BuildSpec, cloud_config: Path | None = None, options: BuilderOptions | None = None,
                after_stage: Any = None) -> str:
    """Build (or finish building) the image `spec` names; returns the image id.

    The builder's cloud settings come from `cloud_config` ([aws] / [azure]); `options` injects
    WAA URL hooks, SDK session / credential (adapters/images/builders.py); `after_stage(stage)`
    runs after each stage (progress hooks; tests raise from it to simulate a kill).
    """
    logger = get_run_logger()
    work: ImageBuilder = make_builder(spec, cloud_config, options=options, warn=logger.warning)
    hook: Callable[[Stage], None] | None = after_stage
    try:
        status = read_build_status(work)
        check_same_build(spec, status)
        if status.complete and status.image_id:
            logger.info("image %s of build %s exists and is verified; nothing to do", status.image_id, spec.name)
            return status.image_id
        done = status.done()
        image_id = status.image_id or ""
        stages: list[tuple[Stage, Any, Callable[[Any], str]]] = [
            (Stage.BUILDER, create_builder, lambda r: f"builder {r}"),
            (Stage.READY, wait_builder_ready, lambda r: f"WAA server answered after {r:.0f} s"),
            (Stage.CAPTURE, capture_image, lambda r: f"image {r} available"),
            (Stage.VERIFY, verify_image, str),
            (Stage.CLEANUP, cleanup_builder, lambda r: f"deleted {len(r)} resource(s)"),
        ]
        for number, (stage, task, describe) in enumerate(stages, start=1):
            if done[stage] and stage is not Stage.CLEANUP:
                logger.info("stage %d %s: already done", number, stage.value)
            else:
                result = task(work)
                if stage is Stage.CAPTURE:
                    image_id = str(result)
                logger.info("stage %d %s: %s", number, stage.value, describe(result))
            if hook is not None:
                hook(stage)
        logger.info("image %s of build %s is built and verified", image_id, spec.name)
        return image_id
    finally:
        work.close()
