"""`arena run`: evaluate a task suite, print its summary and where its results are."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from flows.cli.common import (AGENT_CHOICES, DB_HELP, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_STORE_FAILED,
                              EXIT_TERMINATED, RESET_LEVEL_CHOICES, RUN_EXIT_CODES, RUN_PROVIDER_CHOICES, pairs,
                              seconds, settle, store_location)
from flows.cli.results import write_run_report


def _run(args: argparse.Namespace) -> int:
    from adapters.agents import AgentOptions, build_agent
    from adapters.store.errors import StoreUnavailable, error_text
    from adapters.store.spool import spool_dir
    from flows.evaluate_suite import run_suite
    from flows.run_config import SuiteRunConfig, new_run_id

    agent_options = AgentOptions(
        **{k: v for k, v in {
            "plans_path": args.plans,
            "seed": args.seed,
            "model": args.model,
            "base_url": args.base_url,
            "api_key_env": args.api_key_env,
            "observation": args.observation,
            "prices_path": args.prices,
            "tool_version": args.tool_version,
            "demo_library": args.demo_library,
            "demo_retriever": args.demo_retriever,
            "demo_backend": args.demo_backend,
            "demo_allow_same_task": args.demo_allow_same_task or None,
            "policy_url": args.policy_url,
            "policy_headers_env": dict(pairs("--policy-header-env", "HEADER=ENV_VAR", args.policy_header_env)) or None,
        }.items() if v is not None}
    )
    config = SuiteRunConfig(
        **{k: v for k, v in {
            "suite_dir": args.suite,
            "difficulty": args.difficulty,
            "domains": args.domain or None,
            "task_ids": args.task or None,
            "agent": args.agent,
            "agent_options": agent_options,
            "pool_size": args.pool_size,
            "reset_level": args.reset_level,
            "max_steps": args.max_steps,
            "settle": args.settle,
            "episode_timeout_seconds": args.episode_timeout,
            "max_attempts": args.max_attempts,
            **({"store_url": args.db} if isinstance(args.db, str) else {"db_path": args.db}),
            "artifacts_dir": args.artifacts,
            "run_id": args.run_id,
            "change_selection": args.change_selection or None,
            "quirks": args.quirks or None,
            "provider": args.provider,
            "cloud_config": args.cloud_config,
            "warm_pool": args.warm_pool,
            "suite_flavor": args.suite_flavor,
            "scoring": args.scoring,
            "max_wall_seconds": args.max_wall_seconds,
            "max_cost_usd": args.max_cost,
            "max_tokens": args.max_tokens,
            "vm_hour_price_usd": args.vm_hour_price,
            "shards": args.shards,
            "stage_timeouts": {
                stage: seconds("--stage-timeout", stage, value)
                for stage, value in pairs("--stage-timeout", "STAGE=SECONDS", args.stage_timeout)
            } if args.stage_timeout else None,
            "server_wait_seconds": args.server_wait,
            **({"provider": "existing", "waa_urls": args.waa_url,
                "pool_size": args.pool_size or len(args.waa_url)} if args.waa_url else {}),
        }.items() if v is not None}
    )
    # Fail fast, before Prefect starts: the suite and selection, the paths, then the agent.
    config.preflight()
    if config.run_id is None:
        config = config.model_copy(update={"run_id": new_run_id()})  # named in the resume hint
    build_agent(config.agent, config.resolved_agent_options())
    from prefect.exceptions import TerminationSignal

    from flows.local_server import LocalServerError, configured_or_shared_api
    from flows.terminal import ProgressPrinter, quiet_expected_tracebacks

    quiet_expected_tracebacks(verbose=args.verbose)
    if args.owns_process:
        from flows.cancellation import terminate_on_sigterm
        from flows.reaper import start_reaper

        terminate_on_sigterm()  # SIGTERM and a cancel from the Prefect UI stop the run cleanly
        args.reaper = start_reaper()  # ends the simulations if we are killed
    try:
        with configured_or_shared_api() as local_server:
            if local_server is not None:
                print(f"Prefect UI: {local_server.ui_url} (a local server shared by the runs on this machine; "
                      "set PREFECT_API_URL to use your own)", file=sys.stderr)
            with ProgressPrinter(config.artifacts_dir / config.run_id / "progress.json"):
                outcome = run_suite(config)
    except LocalServerError as exc:
        print(f"arena: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except StoreUnavailable as exc:
        print(f"arena: run {config.run_id}: the results store failed ({error_text(exc)}); finished results wait in "
              f"{spool_dir(config.artifacts_dir, config.run_id)}. When the store is back, finish the run with "
              f"--run-id {config.run_id} (and the same options)", file=sys.stderr)
        return EXIT_STORE_FAILED
    except (KeyboardInterrupt, TerminationSignal) as stop:
        if _stored_status(config.store_location, config.run_id) == "cancelled":
            print(f"arena: run {config.run_id} was cancelled from Prefect; attempts recorded so far are kept "
                  f"(resume with --run-id {config.run_id})", file=sys.stderr)
            return RUN_EXIT_CODES["cancelled"]
        print(
            f"arena: interrupted; attempts recorded so far are kept (resume with --run-id {config.run_id})",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED if isinstance(stop, KeyboardInterrupt) else EXIT_TERMINATED
    if outcome.status == "store_failed":
        print(f"arena: run {outcome.run_id}: {outcome.table}. When the store is back, finish the run with "
              f"--run-id {outcome.run_id} (and the same options): waiting results are written first", file=sys.stderr)
        return EXIT_STORE_FAILED
    print("\n" + outcome.table)
    if outcome.status != "completed":
        print(f"\nRun status: {outcome.status} (rerun with --run-id {outcome.run_id} to finish it)")
    print(f"\nResults: {outcome.store} (run_id {outcome.run_id!r})")
    print(f"Screenshots: {(config.artifacts_dir / outcome.run_id).resolve()}")
    _, report = write_run_report(config.store_location, outcome.run_id)
    print(f"HTML report: {report.resolve()} (terminal: arena report {outcome.run_id})")
    code = RUN_EXIT_CODES.get(outcome.status, EXIT_FAILED)
    if code:
        missing = outcome.completeness.missing if outcome.completeness else "some"
        print(f"arena: run {outcome.run_id} ended {outcome.status}: {missing} task(s) without a final result",
              file=sys.stderr)
    return code


def _stored_status(db: Path | str, run_id: str) -> str | None:
    """The status the run stored when it stopped (None if it stored none)."""
    from adapters.store.duckdb_store import ResultStore, StoreError

    try:
        with ResultStore(db, read_only=True) as store:
            run = store.get_run(run_id)
    except (StoreError, OSError):
        return None
    return run.status if run else None


def add_run(sub: argparse._SubParsersAction) -> None:  # noqa: SLF001 - argparse's type
    """`arena run` and its options."""
    run = sub.add_parser("run", help="evaluate a task suite (default: the bundled suite on the local simulation)")
    run.add_argument("--suite", type=Path, help="a WAA task directory (default: the bundled suite)")
    run.add_argument("--difficulty", choices=["normal", "hard"])
    run.add_argument("--domain", action="append", help="only this domain (repeatable)")
    run.add_argument("--task", action="append", help="only this task id (repeatable)")
    run.add_argument("--agent", choices=AGENT_CHOICES, default="scripted", help="see adapters/agents/__init__.py")
    run.add_argument("--plans", type=Path, help="plans for the scripted agent (default: the suite's solutions.json)")
    run.add_argument("--seed", type=int, help="random agent seed")
    run.add_argument("--model", help="model name or checkpoint (claude, openai, anthropic, demo agents)")
    run.add_argument("--base-url", help="model API base URL, e.g. a vLLM server's http://host:8000/v1")
    run.add_argument("--api-key-env", help="name of the environment variable holding the API key")
    run.add_argument("--observation", choices=["screenshot", "a11y_tree", "screenshot_a11y_tree", "som"])
    run.add_argument("--prices", type=Path, help="JSON file of prices per million tokens, by model")
    run.add_argument("--tool-version", help="computer-use tool version for the claude agent")
    run.add_argument("--demo-library", type=Path, help="demo library directory for the demo agent")
    run.add_argument("--demo-allow-same-task", action="store_true",
                     help="demo agent: may retrieve a demo recorded on the task itself (leaks the answer)")
    run.add_argument("--demo-retriever", choices=["lexical", "embedding"])
    run.add_argument("--demo-backend", choices=["openai", "anthropic"], help="model API of the demo agent")
    run.add_argument("--policy-url", help="the http agent's policy endpoint")
    run.add_argument(
        "--policy-header-env",
        action="append",
        help="HEADER=ENV_VAR: send the value of ENV_VAR as HEADER to the policy (repeatable)",
    )
    run.add_argument(
        "--pool-size", type=int, help="number of VMs, and of tasks run at once (default 4; with --waa-url: one per URL)"
    )
    run.add_argument(
        "--reset-level",
        choices=RESET_LEVEL_CHOICES,
        help="how each VM is reset before a task (default snapshot; what a provider offers is checked up front)",
    )
    run.add_argument(
        "--settle", type=settle, metavar="adaptive|SECONDS",
        help="wait after each action: until the screen is still (adaptive, the default on real VMs) "
        "or a fixed pause (WAA's runner: 3)",
    )
    run.add_argument("--max-steps", type=int)
    run.add_argument("--episode-timeout", type=float, help="wall-clock seconds per episode")
    run.add_argument("--max-attempts", type=int, help="attempts per task for infrastructure errors")
    run.add_argument("--db", type=store_location, help=DB_HELP)
    run.add_argument("--artifacts", type=Path, help="screenshot directory (default results/artifacts)")
    run.add_argument("--run-id", help="resume or name a run")
    run.add_argument(
        "--change-selection", action="store_true",
        help="resuming with other tasks (--task, --domain, ...) than the run selected: make them the run's selection",
    )
    run.add_argument("--quirks", action="store_true", help="local VMs reproduce a real WAA server's quirks")
    run.add_argument(
        "--provider",
        choices=RUN_PROVIDER_CHOICES,  # existing servers: --waa-url
        help="where the VMs come from (default local)",
    )
    run.add_argument("--max-wall-seconds", type=float, help="budget: start no new task after this long")
    run.add_argument("--max-cost", type=float, help="budget in USD: model cost plus VM-hours x --vm-hour-price")
    run.add_argument("--max-tokens", type=int, help="budget: model tokens")
    run.add_argument("--vm-hour-price", type=float, help="USD per VM-hour, for cost and the budget")
    run.add_argument(
        "--stage-timeout", action="append", help="STAGE=SECONDS wall-clock limit for reset/setup/episode/evaluate"
    )
    run.add_argument(
        "--shards",
        type=int,
        help="split the tasks into N shards run by workers of the evaluate-shard deployment, each on its own "
        "pool (needs a Prefect server and workers: docs/deployments.md)",
    )
    run.add_argument("--cloud-config", type=Path, help="cloud settings TOML for aws/azure (default $ARENA_CONFIG)")
    run.add_argument("--suite-flavor", choices=["waa", "waa-v2"],
                     help="score with WAA's or WAA-V2's evaluator semantics (default: what the suite says; a "
                     "WAA-V2 checkout is recognised)")
    run.add_argument("--scoring", choices=["strict", "waa-compat"],
                     help="a server failure during evaluation: an infrastructure error, retried and never scored "
                     "(strict, the default), or scored as WAA scores it (waa-compat, to reproduce WAA's numbers)")
    run.add_argument("--warm-pool", metavar="NAME",
                     help="aws/azure: use warm pool NAME's VMs (started if stopped, stopped again at the end)")
    run.add_argument(
        "--waa-url",
        action="append",
        help="run on this already running WAA server instead of local VMs (repeatable; needs --reset-level setup; "
        "URLs beyond --pool-size are spares)",
    )
    run.add_argument(
        "--server-wait",
        type=float,
        help="with --waa-url: seconds to wait for a server to answer, at start and after it failed, before "
        "retiring it (default 60)",
    )
    run.add_argument("--verbose", action="store_true", help="show Prefect's task-state logs in the terminal")
    run.set_defaults(func=_run)
