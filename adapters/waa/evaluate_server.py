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
  addresses only, plus ARENA_FETCH_ALLOW), never this host's own services;
- the token has at least MIN_TOKEN_CHARS characters; a request body of MAX_REQUEST_BYTES or more
  is refused with 413; a connection that sends nothing for `--read-timeout` seconds is closed, so
  idle connections do not each hold a thread; a postconfig `sleep` step waits at most
  adapters/waa/setup_steps.py's MAX_SLEEP_SECONDS; what the VM's files may unpack to is bounded
  by adapters/waa/evaluator/archive_limits.py;
- answers name files by their names inside the request's folder, never by a path on this host.
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
from werkzeug.exceptions import RequestEntityTooLarge
from werkzeug.serving import WSGIRequestHandler, make_server

from adapters.waa.client import WAAClient
from adapters.waa.evaluator import EvaluationOutcome, evaluate_task
from adapters.waa.host_fetch import FetchPolicy
from adapters.waa.setup_steps import SetupRunner
from adapters.waa.task_paths import host_path_problems

TOKEN_ENV = "ARENA_EVALUATE_TOKEN"
# As shard_signing's secret: a token short enough to guess is no lock on an endpoint that acts.
MIN_TOKEN_CHARS = 16
# A request is a task file and the agent's last action: WAA's largest task file is under 10 KB.
MAX_REQUEST_BYTES = 1 << 20
# Seconds a connection may send nothing (before or within a request) before it is closed.
DEFAULT_READ_TIMEOUT = 30.0


def outcome_payload(outcome: EvaluationOutcome, host_folders: list[Path] | None = None) -> dict[str, Any]:
    """The endpoint's answer for an outcome; `actual`/`expected` list every metric's inputs.
    Paths inside `host_folders` (the request's folder first, then the cache root) are given by
    their names inside it: an answer never shows where this host keeps its files."""
    payload = {
        "success": outcome.kind == "scored" and outcome.score >= 1.0,
        "score": outcome.score,
        "kind": outcome.kind,
        "reason": outcome.reason,
        "actual": [d.get("result_summary") for d in outcome.details],
        "expected": [d.get("expected_summary") for d in outcome.details],
        "details": outcome.details,
    }
    return without_host_paths(payload, host_folders or [])


def without_host_paths(value: Any, folders: list[Path]) -> Any:
    """`value` (strings, lists and dicts of them) with every path inside `folders` written
    relative to the first folder that holds it ("a.docx", "downloads/<key>/b.xlsx")."""
    prefixes: list[str] = []
    for folder in folders:
        for form in dict.fromkeys((str(folder), str(Path(folder).resolve()))):
            prefixes.append(form.rstrip(os.sep))
    if isinstance(value, str):
        for prefix in prefixes:
            value = value.replace(prefix + os.sep, "").replace(prefix, ".")
        return value
    if isinstance(value, dict):
        return {key: without_host_paths(item, folders) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [without_host_paths(item, folders) for item in value]
    return value


def _error(message: str, status: int) -> Any:
    return jsonify({"status": "error", "message": message}), status


def create_app(
    waa_url: str, *, cache_root: Path, offline: bool = False, devtools_url: str | None = None, token: str | None = None
) -> Flask:
    """The Flask app; `token`, when set, is required as a Bearer token on every request."""
    app = Flask("waa-arena-evaluate")
    app.config["MAX_CONTENT_LENGTH"] = MAX_REQUEST_BYTES  # Flask answers 413 past it, unread

    @app.errorhandler(RequestEntityTooLarge)
    def _too_large(error: RequestEntityTooLarge) -> Any:
        return _error(f"request body of {MAX_REQUEST_BYTES:,} bytes or more (MAX_REQUEST_BYTES); refused", 413)

    @app.before_request
    def _authorize() -> Any:
        if token is None:
            return None
        given = request.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            return _error("missing or wrong bearer token", 401)
        return None

    @app.get("/health")
    def health() -> Any:
        return jsonify({"status": "ok", "waa_url": waa_url})

    @app.post("/evaluate")
    def evaluate() -> Any:
        # A chunked body (no Content-Length) is cut at the cap without an error: refuse it too.
        if len(request.get_data(cache=True)) >= MAX_REQUEST_BYTES:
            raise RequestEntityTooLarge()
        try:
            body = request.get_json(silent=True)
            escapes = host_path_problems(body["task"]) if isinstance(body, dict) and isinstance(body.get("task"), dict) else []
        except RecursionError:  # '[[[[...' a thousand deep: Python's parsers give up, not the server
            return _error("body nests too deeply to read; refused", 400)
        if not isinstance(body, dict) or not isinstance(body.get("task"), dict):
            return _error("body must be a JSON object with a 'task' object", 400)
        spec = body["task"].get("evaluator")
        if not isinstance(spec, dict):
            return _error("task has no 'evaluator' object", 400)
        last_action = body.get("last_action")
        if last_action is not None and not isinstance(last_action, str):
            return _error("'last_action' must be a string or null", 400)
        if escapes:
            field, problem = escapes[0]
            return _error(without_host_paths(f"task.{field}: {problem}; refused", [cache_root]), 400)
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
                answer = outcome_payload(outcome, [Path(cache), cache_root])
        finally:
            client.close()
        return jsonify(answer)

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
    if token and len(token) < MIN_TOKEN_CHARS:
        return f"{TOKEN_ENV} is {len(token)} characters long; use at least {MIN_TOKEN_CHARS}"
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
    parser.add_argument("--read-timeout", type=float, default=DEFAULT_READ_TIMEOUT, metavar="SECONDS",
                        help=f"close a connection that sends nothing for this long (default {DEFAULT_READ_TIMEOUT:g})")
    return parser


def request_handler(read_timeout: float) -> type[WSGIRequestHandler]:
    """werkzeug's request handler with a timeout on every read of the connection: one that sends
    nothing for `read_timeout` seconds (idle before its request, between keep-alive requests, or
    mid-body) is closed, and its thread ends."""

    class TimedRequestHandler(WSGIRequestHandler):
        timeout = read_timeout  # socketserver sets it on each accepted connection

    return TimedRequestHandler


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)

    token = os.environ.get(TOKEN_ENV) or None
    problem = listen_problem(args.host, token, args.insecure_no_token)
    if problem is not None:  # one line: the settings are wrong, not the command line's syntax
        print(f"{parser.prog}: {problem}", file=sys.stderr)
        return 2
    if not args.read_timeout > 0:
        parser.error(f"--read-timeout must be a positive number of seconds, got {args.read_timeout:g}")
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
    server = make_server(args.host, args.port, app, threaded=True, request_handler=request_handler(args.read_timeout))
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
