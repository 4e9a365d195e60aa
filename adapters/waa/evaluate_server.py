"""The /evaluate endpoint: the same evaluator engine, deployable next to a WAA server.

    python -m adapters.waa.evaluate_server --waa-url http://127.0.0.1:5000 --port 5050

POST /evaluate with {"task": <WAA task JSON, or at least {"evaluator": {...}}>,
"last_action": "DONE" | "FAIL" | ... | null} runs the task's postconfig against the WAA server,
then its getters and metrics, and answers
{"success", "score", "kind", "reason", "actual", "expected", "details"}.
GET /health answers {"status": "ok", "waa_url": ...}.

The endpoint runs a caller's evaluator spec, which reads the VM, runs postconfig steps on it and
writes files on this host, so it is closed by default:

- every request must carry "Authorization: Bearer <token>" with the token from the environment
  variable ARENA_EVALUATE_TOKEN; without one the server does not start, unless the operator says
  `--insecure-no-token`, which is accepted only while it listens on a loopback address;
- it listens on 127.0.0.1 unless `--host` says otherwise (any other address needs the token);
- a task whose fields name host files outside their folder is refused with 400 naming the field
  (adapters/waa/task_paths.py), and every file it writes stays in a temporary folder per request;
- what getters fetch on this host follows the fetch policy (adapters/waa/host_fetch.py: public
  addresses only, plus ARENA_FETCH_ALLOW), never this host's own services.
"""

from __future__ import annotations

import argparse
import hmac
import ipaddress
import os
import signal
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from flask import Flask, jsonify, request
from werkzeug.serving import make_server

from adapters.waa.client import WAAClient
from adapters.waa.evaluator import EvaluationOutcome, evaluate_task
from adapters.waa.host_fetch import FetchPolicy
from adapters.waa.setup_steps import SetupRunner
from adapters.waa.task_paths import host_path_problems

TOKEN_ENV = "ARENA_EVALUATE_TOKEN"


def outcome_payload(outcome: EvaluationOutcome) -> dict[str, Any]:
    """The endpoint's answer for an outcome; `actual`/`expected` list every metric's inputs."""
    return {
        "success": outcome.kind == "scored" and outcome.score >= 1.0,
        "score": outcome.score,
        "kind": outcome.kind,
        "reason": outcome.reason,
        "actual": [d.get("result_summary") for d in outcome.details],
        "expected": [d.get("expected_summary") for d in outcome.details],
        "details": outcome.details,
    }


def create_app(
    waa_url: str, *, cache_root: Path, offline: bool = False, devtools_url: str | None = None, token: str | None = None
) -> Flask:
    """The Flask app; `token`, when set, is required as a Bearer token on every request."""
    app = Flask("waa-arena-evaluate")

    @app.before_request
    def _authorize() -> Any:
        if token is None:
            return None
        given = request.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            return jsonify({"status": "error", "message": "missing or wrong bearer token"}), 401
        return None

    @app.get("/health")
    def health() -> Any:
        return jsonify({"status": "ok", "waa_url": waa_url})

    @app.post("/evaluate")
    def evaluate() -> Any:
        body = request.get_json(silent=True)
        if not isinstance(body, dict) or not isinstance(body.get("task"), dict):
            return jsonify({"status": "error", "message": "body must be a JSON object with a 'task' object"}), 400
        spec = body["task"].get("evaluator")
        if not isinstance(spec, dict):
            return jsonify({"status": "error", "message": "task has no 'evaluator' object"}), 400
        last_action = body.get("last_action")
        if last_action is not None and not isinstance(last_action, str):
            return jsonify({"status": "error", "message": "'last_action' must be a string or null"}), 400
        escapes = host_path_problems(body["task"])
        if escapes:
            field, problem = escapes[0]
            return jsonify({"status": "error", "message": f"task.{field}: {problem}; refused"}), 400
        client = WAAClient(waa_url)
        try:
            with tempfile.TemporaryDirectory(dir=cache_root) as cache:
                runner = SetupRunner(client, Path(cache), devtools_url=devtools_url)
                outcome = evaluate_task(
                    spec,
                    client,
                    last_action=last_action,
                    cache_dir=Path(cache),
                    run_postconfig=runner.run,
                    offline=offline,
                    download_dir=cache_root / "downloads",
                    devtools_url=devtools_url,
                )
        finally:
            client.close()
        return jsonify(outcome_payload(outcome))

    return app


def is_loopback(host: str) -> bool:
    """Whether `host` (an address or "localhost") can only be reached from this machine."""
    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def listen_problem(host: str, token: str | None, insecure_no_token: bool) -> str | None:
    """Why the endpoint must not start with these settings, or None."""
    if token:
        return None
    if not insecure_no_token:
        return (f"set {TOKEN_ENV} to the token callers must send (Authorization: Bearer ...); the endpoint runs "
                "evaluator specs and postconfig steps for whoever calls it. For a trial on this machine only, "
                "pass --insecure-no-token (127.0.0.1 only)")
    if not is_loopback(host):
        return (f"--host {host} without {TOKEN_ENV} would let anyone who reaches this machine run evaluations and "
                "postconfig steps: set the token, or listen on 127.0.0.1")
    return None


def build_parser() -> argparse.ArgumentParser:
    """`python -m adapters.waa.evaluate_server`'s options."""
    parser = argparse.ArgumentParser(description="Serve WAA task evaluation next to a WAA server.")
    parser.add_argument("--waa-url", required=True, help="the WAA server to evaluate, e.g. http://127.0.0.1:5000")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; any other "
                        f"needs {TOKEN_ENV})")
    parser.add_argument("--insecure-no-token", action="store_true",
                        help=f"run without {TOKEN_ENV}: only on a loopback address, for a trial on this machine")
    parser.add_argument("--port", type=int, default=5050)
    parser.add_argument("--port-file", type=Path, help="write the bound port here once listening")
    parser.add_argument("--devtools-url", help="the browser DevTools endpoint, e.g. http://127.0.0.1:9222")
    parser.add_argument("--offline", action="store_true", help="cloud_file may only use the download cache")
    parser.add_argument("--cache-dir", type=Path, help="where downloads are cached (default: a temp dir)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)

    token = os.environ.get(TOKEN_ENV) or None
    problem = listen_problem(args.host, token, args.insecure_no_token)
    if problem is not None:
        parser.error(problem)
    try:
        FetchPolicy.from_env()
    except ValueError as exc:
        parser.error(str(exc))
    # A cache of its own is removed when the server stops; an operator's `--cache-dir` is kept.
    own_cache = None if args.cache_dir else tempfile.TemporaryDirectory(prefix="waa-evaluate-")
    cache_root = args.cache_dir or Path(own_cache.name)
    cache_root.mkdir(parents=True, exist_ok=True)
    app = create_app(
        args.waa_url,
        cache_root=cache_root,
        offline=args.offline,
        devtools_url=args.devtools_url,
        token=token,
    )
    server = make_server(args.host, args.port, app, threaded=True)
    port = server.server_port

    def stop(signum: int, frame: Any) -> None:  # shutdown() waits for serve_forever: not on its thread
        threading.Thread(target=server.shutdown, daemon=True).start()

    # SIGTERM (a service manager's stop, `kill`) ends it as Ctrl-C does, through the clean-up
    # below; set before the port file says it is up.
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    if args.port_file:
        partial = args.port_file.with_suffix(".tmp")
        partial.write_text(str(port))
        partial.replace(args.port_file)
    print(f"WAA evaluate endpoint on http://{args.host}:{port} for {args.waa_url}", flush=True)
    try:
        server.serve_forever(poll_interval=0.1)
    finally:
        server.server_close()
        if own_cache is not None:
            own_cache.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
