"""`arena doctor`: preflight checks, one line each, with the fix when one fails.

Checked: the results store (reachable, a schema this code reads, writable; for the team store, a
warning when its role is a superuser or may signal other connections or read server files), the
Prefect server when one is configured (reachable, the served deployments registered and not
paused), each WAA server given (answers /probe), the agent's model endpoint (its API key variable
is set, the endpoint answers a model listing with that key), and with --provider aws|azure the
cloud (credentials, sizes and quota, image and its tags, the controller's egress address inside
controller_cidr, a warm pool's ports). Nothing is written or created anywhere.

It also lists the local Prefect servers `arena run` started that are still running (found from
their processes, so a server whose home was deleted shows too), and stops them when asked.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from adapters.agents import AgentOptions
from adapters.agents.prompting import MODELS_EXTRA, AgentConfigError, model_sdk
from adapters.checks import Check
from adapters.store.duckdb_store import SCHEMA_VERSION, ResultStore, verify_store
from adapters.store.errors import StoreDamaged, StoreError
from adapters.vms.base import VMProvider
from adapters.vms.cloud_checks import DEFAULT_EGRESS_URL, aws_checks, azure_checks, check_egress, check_ports
from flows.local_server import RunningServer, find_running_servers, stop_running


def check_store(location: Path | str) -> Check:
    """The store can be opened, has a schema this code reads, and can be written."""
    where = "team store" if isinstance(location, str) else "results store"
    if isinstance(location, Path):
        folder = location.parent if location.parent != Path("") else Path(".")
        if not location.exists():
            if folder.is_dir() and os.access(folder, os.W_OK):
                return Check(where, True, f"{location} does not exist yet; the first run creates it")
            return Check(where, False, f"cannot create {location}: {folder} is not a writable directory",
                         "create the directory or pass --db a path you can write")
    try:
        with ResultStore(location, read_only=True) as store:
            version, writable = store.schema_version(), store.can_write()
        # Every block read once, so DuckDB checks every checksum (a file cut short or corrupted).
        rows = verify_store(location) if isinstance(location, Path) else None
    except StoreDamaged as exc:
        return Check(where, False, str(exc), "restore the file from a copy, or move it aside (a new one is created)")
    except StoreError as exc:
        return Check(where, False, str(exc), "see the message: start the server, fix the credentials "
                     "(PGPASSWORD or ~/.pgpass), or upgrade the package for a newer schema")
    shown = location if isinstance(location, Path) else "the server"
    if not writable:
        return Check(where, False, f"{shown} is readable but this user may not add results",
                     "grant INSERT on task_results and steps (PostgreSQL) or fix the file's permissions")
    intact = f", all {rows} rows read back intact" if rows is not None else ""
    return Check(where, True, f"{shown} answers, schema version {version} (this code: {SCHEMA_VERSION}), "
                              f"writable{intact}")


ROLES_DOC = "docs/team-store.md, \"Roles\""


def check_store_role(location: Path | str) -> list[Check]:
    """Warnings when the team store's role can do more than a store needs: a superuser, a member
    of pg_signal_backend (ends other roles' connections) or of pg_read_server_files (reads the
    server's files). One line each; none for a DuckDB file, or when the server does not answer
    (`check_store` says so)."""
    if not isinstance(location, str):
        return []
    from adapters.store.postgres import role_powers

    try:
        powers = role_powers(location)
    except StoreError:
        return []
    fix = f"run with a writer role that is not a superuser and `arena sql` with a reader role: {ROLES_DOC}"
    found = []
    if powers.superuser:
        found.append(f"role {powers.role} is a superuser: every run and `arena sql` connect with it, so a bug or a "
                     "query could read and write the server's files, end any connection and change any database")
    else:
        if powers.signal_backends:
            found.append(f"role {powers.role} is a member of pg_signal_backend: it can cancel or end other roles' "
                         "connections to the server, a running run's included")
        if powers.read_server_files:
            found.append(f"role {powers.role} is a member of pg_read_server_files: it can read any file the "
                         "database server can (pg_read_file, COPY FROM a file)")
    return [Check("team store role", True, detail, fix, warning=True) for detail in found]


def check_prefect_auth(api_url: str) -> Check | None:
    """A warning when the Prefect API at `api_url` (or its port on this machine's network
    address) answers without authentication: anyone who reaches it can start runs of the
    served deployments, cancel runs, or read every run's parameters. None when it is closed."""
    import urllib.parse

    import requests

    parts = urllib.parse.urlsplit(api_url)
    host = parts.hostname or ""
    candidates = [api_url]
    if _loopback(host):
        # A server started with --host 0.0.0.0 answers on this machine's own address too.
        address = _own_address()
        if address:
            netloc = f"{address}:{parts.port}" if parts.port else address
            candidates.append(urllib.parse.urlunsplit(parts._replace(netloc=netloc)))
    for url in candidates:
        if _loopback(urllib.parse.urlsplit(url).hostname or ""):
            continue
        try:
            answer = requests.post(f"{url.rstrip('/')}/deployments/filter", json={"limit": 1}, timeout=5)
        except requests.RequestException:
            continue
        if answer.status_code == 200:
            return Check("prefect auth", True, f"{url} answers API calls without authentication: anyone who reaches it "
                         "can start runs of the served deployments and read runs' parameters",
                         "set PREFECT_SERVER_API_AUTH_STRING=user:password where the server runs and "
                         "PREFECT_API_AUTH_STRING (the same) for every client, or bind it to 127.0.0.1", warning=True)
    return None


def _loopback(host: str) -> bool:
    import ipaddress

    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _own_address() -> str | None:
    """This machine's address on its default route (no packet is sent), or None."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1: only picks the outgoing interface
            address = probe.getsockname()[0]
        except OSError:
            return None
    return None if address.startswith("127.") else address


def check_prefect(api_url: str | None, deployments: list[str]) -> list[Check]:
    """The configured Prefect server answers and the served deployments will run."""
    if not api_url:
        return [Check("prefect", True, "PREFECT_API_URL unset: arena run starts a local server on this machine")]
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from deployments.health import read_status

    try:
        with temporary_settings(updates={PREFECT_API_URL: api_url}), get_client(sync_client=True) as client:
            statuses = read_status(client, deployments)
    except Exception as exc:  # noqa: BLE001 - an unreachable server is the answer here
        return [Check("prefect", False, f"{api_url} does not answer: {type(exc).__name__}: {exc}",
                      "start it (prefect server start) or correct PREFECT_API_URL")]
    checks = [Check("prefect", True, f"{api_url} answers")]
    open_api = check_prefect_auth(api_url)
    if open_api is not None:
        checks.append(open_api)
    for name, status in statuses.items():
        if status is None:
            checks.append(Check(f"deployment {name}", False, "not registered",
                                "start `python -m deployments.serve` or run `prefect deploy --all`"))
        elif status.paused:
            checks.append(Check(f"deployment {name}", False, "PAUSED: its schedule and triggers start nothing",
                                f"prefect deployment resume {name}"))
        else:
            checks.append(Check(f"deployment {name}", True, "active"))
    return checks


def check_waa_server(url: str, arena: str = "arena") -> Check:
    """A WAA server answers /probe (`arena`: the command as the user runs it, for the hint);
    the URL is shown without its password."""
    from adapters.secrets import redact_url
    from adapters.waa.client import WAAClient

    client = WAAClient(url)
    try:
        answers = client.probe()
    finally:
        client.close()
    shown = redact_url(url)
    if answers:
        return Check(f"WAA server {shown}", True, "answers /probe")
    return Check(f"WAA server {shown}", False, "does not answer /probe",
                 "start its VM or server, open port 5000 to this host, or check it layer by layer: "
                 f"{arena} probe {shown}")


# Agents that call a model API, and which API.
MODEL_BACKENDS = {"openai": "openai", "anthropic": "anthropic", "claude": "anthropic", "demo": None}
DEFAULT_KEY_ENV = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}


def check_model(agent: str, options: AgentOptions) -> list[Check]:
    """The agent's API key variable is set and its endpoint lists models with that key."""
    if agent not in MODEL_BACKENDS:
        return []
    backend = MODEL_BACKENDS[agent] or options.demo_backend
    key_env = options.api_key_env or DEFAULT_KEY_ENV[backend]
    key = os.environ.get(key_env) or None
    name = f"model endpoint ({agent})"
    needs_key = backend == "anthropic" or options.base_url is None
    if key is None and needs_key:
        return [Check(name, False, f"the API key variable {key_env} is unset or empty",
                      f"export {key_env}=... (the key itself never goes on the command line)")]
    try:
        sdk = model_sdk(backend)
    except AgentConfigError as exc:
        return [Check(name, False, str(exc).split(";")[0], f"pip install -e '.[{MODELS_EXTRA}]'")]
    try:
        if backend == "openai":
            client = sdk.OpenAI(api_key=key or "EMPTY", base_url=options.base_url, max_retries=0, timeout=15)
        else:
            client = sdk.Anthropic(api_key=key, base_url=options.base_url, max_retries=0, timeout=15)
        models = [m.id for m in client.models.list()]
    except Exception as exc:  # noqa: BLE001 - whatever failed is the answer; the key is never printed
        detail = f"{client_url(backend, options.base_url)} did not list models: {type(exc).__name__}"
        status = getattr(exc, "status_code", None)
        fix = (f"check the key in {key_env}" if status in (401, 403)
               else "check --base-url and that the server is up")
        return [Check(name, False, detail + (f" (HTTP {status})" if status else ""), fix)]
    detail = f"{client_url(backend, options.base_url)} answers with {key_env if key else 'no key'}"
    if options.model and models and options.model not in models:
        return [Check(name, False, f"{detail}, but it does not serve model {options.model!r}",
                      f"pick one of: {', '.join(models[:10])}")]
    return [Check(name, True, detail + (f", serves {options.model}" if options.model else ""))]


def client_url(backend: str, base_url: str | None) -> str:
    """The endpoint as shown to the user."""
    return base_url or ("https://api.openai.com/v1" if backend == "openai" else "https://api.anthropic.com")


def check_cloud(provider_name: str, cloud_config: Path | None, pool_size: int, warm_pool: str | None = None,
                egress_url: str = DEFAULT_EGRESS_URL, provider: VMProvider | None = None,
                arena: str = "arena") -> list[Check]:
    """The cloud checks of `provider_name` (adapters/vms/cloud_checks.py): credentials, sizes and
    quota, image, the controller's egress address against controller_cidr, and, given a warm pool,
    that its running VMs accept connections on the ports this product uses. `provider` is a test
    hook (a provider built with test endpoints); otherwise it is built from the cloud config.
    `arena` is the command as the user runs it, for the hints."""
    from adapters.vms.registry import ProviderSettings, build_provider
    from adapters.vms.warm_pool import pool_resource_id

    if provider is None:
        run_id = pool_resource_id(warm_pool) if warm_pool else "doctor"
        try:
            provider = build_provider(provider_name, ProviderSettings(run_id=run_id, cloud_config=cloud_config))
        except ValueError as exc:
            return [Check("cloud config", False, str(exc), "see docs/first-real-run.md for a complete [aws] / "
                          "[azure] section")]
    try:
        settings = provider.settings  # type: ignore[attr-defined]
        checks = [Check("cloud config", True, f"[{provider_name}] section read")]
        checks += (aws_checks if provider_name == "aws" else azure_checks)(provider, pool_size)
        checks.append(check_egress(settings.controller_cidr, egress_url))
        if warm_pool:
            tunnel = getattr(settings, "access", "cidr") == "tunnel"
            ports = {"ssh": getattr(settings, "ssh_port", 22)} if tunnel else {
                "ssh": getattr(settings, "ssh_port", 22), "WAA": settings.waa_port, "QMP": settings.qmp_port,
                "DevTools": settings.devtools_port}
            try:
                vms = provider.list_vms()
            except Exception as exc:  # noqa: BLE001 - the answer is the check
                checks.append(Check(f"warm pool {warm_pool}", False, f"cannot list its VMs: {exc}",
                                    "check the credentials and the cloud config"))
            else:
                if not vms:
                    checks.append(Check(f"warm pool {warm_pool}", False, "has no VMs",
                                        f"{arena} pool up --provider {provider_name} --name {warm_pool} --size N"))
                checks += check_ports(vms, ports)
        return checks
    finally:
        provider.close()


LOCAL_SERVERS = "Local Prefect servers started by arena run"
_HOME_NOTES = {"in place": "", "deleted": " (deleted)", "another server's": " (now another server's)",
               "no record": " (no record: starting or stopping)", "unknown": ""}


def local_server_lines(servers: list[RunningServer], now: float | None = None, arena: str = "arena",
                       home: Path | None = None) -> list[str]:
    """A heading, then one line per running local server: port, age (at `now`, default the
    current time), home (and whether it is still there), pids, whether it will stop by itself,
    and the command that stops exactly it (with `arena`, the command as the user runs it).

    With `home` (the current PREFECT_HOME), only that home's servers are listed, and the others of
    this user are counted with the option that lists them: on a shared account another person's
    run is not the reader's to stop."""
    now = time.time() if now is None else now
    shown = servers if home is None else [s for s in servers if _same_home(s.home, home)]
    others = len(servers) - len(shown)
    more = (f"; {others} more of other Prefect homes of this user: {arena} doctor --all-local-servers"
            if others else "")
    if not shown:
        where = "" if home is None else f" for {home}"
        return [f"{LOCAL_SERVERS}{where}: none running{more}"]
    where = "" if home is None else f" for {home}"
    lines = [f"{LOCAL_SERVERS}{where} ({len(shown)}){more}:"]
    for server in shown:
        home_text = f"home {server.home}{_HOME_NOTES[server.home_state]}" if server.home else "home unknown"
        pids = "/".join(str(ref.pid) for ref in (server.supervisor, server.server) if ref)
        if server.supervisor is None:
            fate = "NO SUPERVISOR: it never stops by itself"
        elif server.home_state == "in place":
            fate = "stops once idle"
        else:
            fate = "stops once no run uses it"
        stop = f"; stop it: {arena} doctor --stop-local-servers {server.port}" if server.port else ""
        lines.append(f"  port {server.port or '?'}  up {_age(now - server.started)}  {home_text}  pid {pids}  {fate}{stop}")
    return lines


def stop_local_servers(ports: list[int], home: Path | None = None) -> tuple[list[str], bool]:
    """Stop the running local servers on `ports`, or, with no port, those of `home` (the current
    PREFECT_HOME; every one of this user's when None). Returns a line per server stopped (or per
    port with no server) naming its port and home, and whether every one was stopped."""
    servers = find_running_servers()
    if ports:
        chosen = [s for s in servers if s.port in ports]
    else:
        chosen = [s for s in servers if home is None or _same_home(s.home, home)]
    missing = sorted(set(ports) - {s.port for s in servers})
    lines = [f"no local Prefect server of arena run runs on port {port}" for port in missing]
    if not ports and not chosen:
        lines.append(f"{LOCAL_SERVERS}{'' if home is None else f' for {home}'}: none running")
    ok = not missing
    for server in chosen:
        stopped = stop_running(server)
        ok = ok and stopped
        lines.append(f"{'stopped' if stopped else 'could NOT stop'} the server on port {server.port or '?'} "
                     f"(home {server.home or 'unknown'})")
    return lines, ok


def _same_home(found: Path | None, home: Path) -> bool:
    if found is None:
        return False
    try:
        return found.resolve() == home.expanduser().resolve()
    except OSError:
        return False


def _age(seconds: float) -> str:
    seconds = max(0, int(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"
