"""Stages of the image-build flow: one thin task per stage (adapters/images does the work).

Every stage is idempotent and finds its own earlier result in the cloud, so retrying one is
safe; the long wait for Windows (stage 2) is not retried: it has its own deadline.
"""

from __future__ import annotations

from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from adapters.images.stages import BuildError, BuildStatus, ImageBuilder


def _transient(task: Any, task_run: Any, state: Any) -> bool:
    """Retry a stage only after a failed cloud API call, never after a missing base image, a
    timeout or a failed probe (those need the user; a rerun of the build resumes)."""
    exc = state.result(raise_on_failure=False)
    return not isinstance(exc, BuildError) or exc.transient


@task(name="image-status", task_run_name="status [{builder.spec.name}]", cache_policy=NO_CACHE,
      persist_result=False, retries=2, retry_delay_seconds=5, retry_condition_fn=_transient)
def read_build_status(builder: ImageBuilder) -> BuildStatus:
    """Which stages the cloud shows as done."""
    return builder.status()


@task(name="image-builder-vm", task_run_name="1 builder [{builder.spec.name}]", cache_policy=NO_CACHE,
      persist_result=False, retries=2, retry_delay_seconds=30, retry_condition_fn=_transient)
def create_builder(builder: ImageBuilder) -> str:
    """Stage 1: the builder VM (created unless it exists)."""
    return builder.ensure_builder()


@task(name="image-builder-ready", task_run_name="2 ready [{builder.spec.name}]", cache_policy=NO_CACHE,
      persist_result=False)
def wait_builder_ready(builder: ImageBuilder) -> float:
    """Stage 2: wait until the WAA server inside the builder answers /probe."""
    return builder.wait_builder_ready()


@task(name="image-capture", task_run_name="3 capture [{builder.spec.name}]", cache_policy=NO_CACHE,
      persist_result=False, retries=1, retry_delay_seconds=30, retry_condition_fn=_transient)
def capture_image(builder: ImageBuilder) -> str:
    """Stage 3: the image, captured from the builder and available."""
    return builder.capture()


@task(name="image-verify", task_run_name="4 verify [{builder.spec.name}]", cache_policy=NO_CACHE,
      persist_result=False, retries=1, retry_delay_seconds=30, retry_condition_fn=_transient)
def verify_image(builder: ImageBuilder) -> str:
    """Stage 4: a VM from the image passes the probe; the image is tagged verified."""
    return builder.verify()


@task(name="image-cleanup", task_run_name="5 cleanup [{builder.spec.name}]", cache_policy=NO_CACHE,
      persist_result=False, retries=3, retry_delay_seconds=30, retry_condition_fn=_transient)
def cleanup_builder(builder: ImageBuilder) -> list[str]:
    """Stage 5: the builder and its network resources deleted."""
    return builder.cleanup()
