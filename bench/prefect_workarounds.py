"""What the product's workarounds of Prefect's behaviour save, measured today (docs/architecture.md,
"Where the product works around Prefect"): each against Prefect doing it its own way, beside a warm
default `arena run` for scale. Prints numbers; asserts nothing.

    python bench/prefect_workarounds.py [--runs 5]

- heartbeats: a trivial flow run executed in this process, with Prefect's engine sending its
  heartbeats (its thread joined at the end) against the flow sending them (flows/flow_run_heartbeats.py)
- import_gc: importing Prefect's engine and server, the collector running against paused
- ca_file: creating a Prefect API client, its TLS context from certifi's bundle against the
  one-certificate CA file (flows/plain_http_ca.pem)
- default_run: a warm default `arena run` (the shared local server already up), for scale
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.conditions import conditions  # noqa: E402 - after the path is set

_HEARTBEATS = """
import json, sys, time
from prefect import flow
from flows.flow_run_heartbeats import flow_run_heartbeats, heartbeats_from_the_flow
ours = sys.argv[1] == "ours"

@flow(name="workaround-bench")
def trivial() -> int:
    if ours:
        with flow_run_heartbeats():
            return 1
    return 1

from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings
times = []
with temporary_settings({PREFECT_FLOWS_HEARTBEAT_FREQUENCY: 30}):
    trivial()  # warm: the flow's registration, the client
    for _ in range(int(sys.argv[2])):
        started = time.perf_counter()
        if ours:
            with heartbeats_from_the_flow():
                trivial()
        else:
            trivial()
        times.append(time.perf_counter() - started)
print(json.dumps(times))
"""

_IMPORTS = """
import gc, json, sys, time
if sys.argv[1] == "paused":
    gc.disable()
started = time.process_time()
import prefect.engine, prefect.server.api.server  # noqa: F401
print(json.dumps(time.process_time() - started))
"""

_CLIENTS = """
import json, os, sys, time
if sys.argv[1] == "certifi":
    os.environ.pop("PREFECT_API_SSL_CERT_FILE", None)
else:
    os.environ["PREFECT_API_SSL_CERT_FILE"] = sys.argv[2]
from prefect.client.orchestration import get_client
get_client(sync_client=True)  # the first builds what every later one reuses
started = time.process_time()
for _ in range(20):
    get_client(sync_client=True)
print(json.dumps((time.process_time() - started) / 20))
"""


def _python(code: str, *args: str, env: dict[str, str] | None = None) -> object:
    done = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env=env)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    print(conditions())
    from bench.prefect_server import server_for_this_process
    from flows.local_server import PLAIN_HTTP_CA_FILE

    with tempfile.TemporaryDirectory() as tmp:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
        env["PREFECT_HOME"] = str(Path(tmp) / "home")
        with server_for_this_process(Path(tmp) / "home", Path(tmp) / "server.log") as api:
            env["PREFECT_API_URL"] = api
            for way in ("prefect", "ours"):
                times = _python(_HEARTBEATS, way, str(args.runs * 3), env=env)
                print(f"heartbeats ({way}): a trivial flow run {statistics.median(times) * 1000:.0f} ms median "
                      f"(min {min(times) * 1000:.0f}, max {max(times) * 1000:.0f})")
            for way in ("certifi", "ca-file"):
                cpu = _python(_CLIENTS, way, str(PLAIN_HTTP_CA_FILE), env=env)
                print(f"ca_file ({way}): {float(cpu) * 1000:.1f} ms CPU per API client")
    for way in ("running", "paused"):
        cpus = [float(_python(_IMPORTS, way)) for _ in range(args.runs)]
        print(f"import_gc (collector {way}): importing Prefect's engine and server {statistics.median(cpus):.2f} CPU-s")
    with tempfile.TemporaryDirectory() as tmp:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
        env["PREFECT_HOME"] = str(Path(tmp) / "home")
        command = [str(Path(sys.executable).with_name("arena")), "run", "--no-live", "--db", f"{tmp}/a.duckdb",
                   "--artifacts", f"{tmp}/art"]
        subprocess.run(command, cwd=tmp, env=env, capture_output=True, timeout=600)  # cold: starts the server
        walls = []
        for _ in range(args.runs):
            started = time.perf_counter()
            subprocess.run(command, cwd=tmp, env=env, capture_output=True, timeout=600)
            walls.append(time.perf_counter() - started)
        print(f"default_run (warm): {statistics.median(walls):.2f} s median (min {min(walls):.2f}, max {max(walls):.2f})")
        from flows.local_server import stop_server

        stop_server(Path(tmp) / "home")


if __name__ == "__main__":
    main()
