"""Where a run's results come from: the `runs` row (agent and its configuration, model and
checkpoint, suite and its hash, VM image, code revision, Prefect flow run)."""

from __future__ import annotations

import functools
import subprocess
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from prefect.context import get_run_context

from adapters.store.duckdb_store import RunInfo
from adapters.vms.base import VMProvider
from adapters.waa.catalog import WAATaskCatalog
from flows.run_config import SuiteRunConfig


@functools.cache  # the code this process runs does not change under it: one `git` call per process
def code_revision() -> str | None:
    """The short git revision of this checkout, or None outside one."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            cwd=Path(__file__).resolve().parent,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def run_info(
    config: SuiteRunConfig,
    run_id: str,
    catalog: WAATaskCatalog,
    selected_task_ids: list[str],
    agent_config: dict[str, Any],
    provider: VMProvider,
) -> RunInfo:
    """The `runs` row of a run (or of one shard's local file): its provenance."""
    flow_run = get_run_context().flow_run
    return RunInfo(
        run_id=run_id,
        started_at=datetime.now(timezone.utc),
        status="running",
        agent=config.agent,
        agent_config=agent_config,
        # Agents whose configuration names no model (scripted, http) still run "a model" when
        # one is given (a model update); it identifies the run either way.
        model_id=agent_config.get("model") or config.agent_options.model,
        model_endpoint=agent_config.get("base_url"),
        suite=str(config.suite_dir),
        suite_hash=catalog.content_hash(),
        task_count=len(selected_task_ids),
        pool_size=config.pool_size,
        provider=config.provider,
        reset_level=config.reset_level.value,
        code_revision=code_revision(),
        prefect_flow_run_id=str(flow_run.id) if flow_run else None,
        environment=provider.environment,
        model_checkpoint=config.model_checkpoint,
        vm_image=provider.image_id,
        run_config=config.model_dump(mode="json"),
        baseline=config.baseline,
        selected_task_ids=sorted(selected_task_ids),
        scoring=config.scoring,
    )
