"""The local server records task runs in batches (flows/local_server.py, `RECORDER_BATCH_SIZE`),
and still records every one, with its final state, within its flush interval after the flow returns
(waited for here up to 30 s).

Against a server of the test's own: the local server's app with its settings (tests/conftest.py
`own_prefect_server`). Prefect ignores a setting whose name it does not know, so a
renamed setting would quietly bring back one write per event: the batches are checked on what
the server wrote (a batch's task runs share its `created` time).
"""

from __future__ import annotations

import time
from uuid import UUID

TASKS = 12


def _flow_run_id() -> UUID:
    from prefect import flow, task
    from prefect.runtime import flow_run

    @task(name="recorded")
    def recorded(i: int) -> int:
        return i

    @flow(name="recording")
    def recording() -> str:
        futures = [recorded.submit(i) for i in range(TASKS)]
        assert sorted(f.result() for f in futures) == list(range(TASKS))
        return flow_run.get_id()

    return UUID(recording())


def test_task_runs_are_recorded_in_batches_and_every_one_reaches_its_final_state(
        prefect_server: None, own_prefect_server: str) -> None:
    # On a server of its own: the other test processes' task runs would share its batches.
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    flow_run_id = _flow_run_id()
    returned = time.monotonic()
    with get_client(sync_client=True) as client:
        while True:
            runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
            done = [r for r in runs if r.state is not None and r.state.is_completed()]
            if len(done) == TASKS or time.monotonic() - returned > 30:
                break
            time.sleep(0.2)
    assert len(done) == TASKS, [(r.name, r.state and r.state.name) for r in runs]
    # One write per event would give each task run a `created` time of its own.
    assert len({r.created for r in runs}) < TASKS / 2, sorted(r.created for r in runs)
