"""The served deployments: `arena status` (will they run, when does the nightly run next) and
`arena notify` (events that start them)."""

from __future__ import annotations

import argparse
import sys

from flows.cli.common import EXIT_BAD_INPUT, EXIT_FAILED


SERVED_DEPLOYMENTS = ["evaluate-baseline/on-demand", "nightly-baselines/nightly-baselines",
                      "evaluate-model-update/on-model-update"]
NIGHTLY = "nightly-baselines/nightly-baselines"


def _notify_model_updated(args: argparse.Namespace) -> int:
    from flows.notify import deployments_started_by, notify_model_updated

    try:
        event_id = notify_model_updated(args.model, endpoint=args.endpoint, checkpoint=args.checkpoint)
    except RuntimeError as exc:  # no server configured: a usage problem, not a crash
        print(f"arena: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    started = deployments_started_by()
    print(f"model.updated sent for {args.model} (event {event_id})")
    if not started:
        print("arena: no deployment on this server starts on model.updated: nothing will evaluate it "
              "(serve them: python -m deployments.serve)", file=sys.stderr)
        return EXIT_FAILED
    print("it starts: " + "; ".join(started))
    return 0


def _status(args: argparse.Namespace) -> int:
    """Whether the served deployments will run, and when the nightly runs next; exit 1 when the
    nightly will not run on its own."""
    from datetime import datetime, timezone

    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    if not url:
        print("arena: error: PREFECT_API_URL is not set; arena status asks the Prefect server that serves "
              "the deployments (e.g. PREFECT_API_URL=http://127.0.0.1:4200/api)", file=sys.stderr)
        return EXIT_BAD_INPUT
    from deployments.health import read_status

    try:
        with get_client(sync_client=True) as client:
            statuses = read_status(client, SERVED_DEPLOYMENTS)
    except Exception as exc:  # noqa: BLE001 - an unreachable server is the answer here
        print(f"arena: error: cannot read the deployments from {url}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    print(f"Prefect server: {url}")
    for name, status in statuses.items():
        if status is None:
            print(f"  {name}: not registered (start `python -m deployments.serve` or `prefect deploy --all`)")
            continue
        schedules = "; ".join(s.describe() for s in status.schedules) or "no schedule (runs on demand or on events)"
        print(f"  {name}: {'PAUSED' if status.paused else 'active'}; {schedules}")
    nightly = statuses.get(NIGHTLY)
    if nightly is not None and nightly.will_run_on_schedule and nightly.next_run is not None:
        wait = nightly.next_run - datetime.now(timezone.utc)
        hours, rest = divmod(max(0, int(wait.total_seconds())), 3600)
        print(f"Next nightly run: {nightly.next_run:%Y-%m-%d %H:%M %Z} (in {hours}h{rest // 60:02d}m)")
        return 0
    why = ("it is not registered" if nightly is None else "it is PAUSED (`prefect deployment resume "
           f"{NIGHTLY}` or the UI)" if nightly.paused else "its schedule is inactive"
           if not any(s.active for s in nightly.schedules) else "no run is scheduled (is a serve process or worker up?)")
    print(f"arena: the nightly will NOT run: {why}", file=sys.stderr)
    return EXIT_FAILED


def add_notify(sub: argparse._SubParsersAction) -> None:  # noqa: SLF001 - argparse's type
    """`arena notify model-updated MODEL`."""
    notify = sub.add_parser("notify", help="send events to the Prefect server (needs PREFECT_API_URL)")
    notify_sub = notify.add_subparsers(dest="notify_command", required=True)
    updated = notify_sub.add_parser("model-updated", help="emit model.updated: starts the on-model-update deployment")
    updated.add_argument("model", help="model name or checkpoint id (becomes resource model.<model>)")
    updated.add_argument("--endpoint", help="OpenAI-compatible base URL serving the model")
    updated.add_argument("--checkpoint", help="checkpoint path or URI (recorded with the run)")
    updated.set_defaults(func=_notify_model_updated)


def add_status(sub: argparse._SubParsersAction) -> None:  # noqa: SLF001 - argparse's type
    """`arena status`."""
    status = sub.add_parser("status", help="whether the served deployments will run and when the nightly runs next "
                                           "(needs PREFECT_API_URL)")
    status.set_defaults(func=_status)
