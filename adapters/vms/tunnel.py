"""Private access to a cloud VM's WAA, QMP and DevTools ports through an OpenSSH tunnel.

WAA's HTTP server, the QEMU monitor (QMP) and Chrome DevTools have no authentication at all. In
the `access="tunnel"` mode of the cloud providers they are never opened to the network: the VM's
firewall opens only SSH, and the controller reaches the three ports through local forwards of
the system's own `ssh` client::

    ssh -N -L 127.0.0.1:<local>:127.0.0.1:<remote> ... user@vm

- `SSHTarget` says where and as whom to connect, and which known_hosts file pins host keys.
- `SSHTunnel` is one ssh process with named forwards ({"waa": 5000, "qmp": 7200, ...}). Its local
  ports are chosen once and kept when the process is re-established, so the URLs handed out
  (`url("waa")` -> http://127.0.0.1:<local>) stay valid for the VM's whole life.
- `TunnelManager` keeps one tunnel per VM id and a monitor thread that re-establishes dead ones.

Host keys: `StrictHostKeyChecking=accept-new` pins a VM's key on first contact in a
product-managed known_hosts file, and a *changed* key is refused (`HostKeyMismatchError`) rather
than silently accepted. Entries are stored under a per-VM alias (`SSHTarget.host_key_alias`, the
cloud's instance id) instead of the IP address, because clouds hand released public IPs to other
VMs: keyed by IP, a new VM on a recycled address would look like an attack, and keyed by alias
it is simply a new entry. The providers forget a VM's entry when they delete it or replace its
disk themselves (both through the authenticated cloud API).

Why the system `ssh` and not a Python SSH library: it is what users already configure (agent,
keys, ~/.ssh/config with ProxyJump for bastions), it is audited, and it needs no new dependency.

Secrets: this module passes the identity *file path* to ssh and never reads, logs or copies key
material; ssh's own stderr (quoted in errors) holds no key material either.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from adapters.vms.base import ProviderError

log = logging.getLogger(__name__)

LOCAL_HOST = "127.0.0.1"
KNOWN_HOSTS_ENV = "ARENA_SSH_KNOWN_HOSTS"

# Phrases in ssh's stderr that classify a failure (OpenSSH 8/9 wording).
_HOST_KEY_PHRASES = ("REMOTE HOST IDENTIFICATION HAS CHANGED", "Host key verification failed",
                     "HOST KEY FOR", "host key mismatch")
_AUTH_PHRASES = ("Permission denied", "Too many authentication failures", "no such identity")
_LOCAL_PORT_PHRASES = ("Address already in use", "cannot listen to port", "Could not request local forwarding")


class TunnelError(ProviderError):
    """An SSH tunnel could not be opened or re-established; the message names the VM host and
    quotes ssh's own error. A ProviderError, so the pipeline records an infrastructure error."""


class SSHUnavailableError(TunnelError):
    """No OpenSSH client (`ssh`) on this machine."""


class HostKeyMismatchError(TunnelError):
    """The VM presented a host key other than the one pinned for it: refused, never bypassed."""


class SSHAuthenticationError(TunnelError):
    """The VM's sshd refused every key offered (wrong key, wrong user, key not installed yet)."""


def find_ssh() -> str:
    """The path of the OpenSSH client, or SSHUnavailableError saying how to get one."""
    path = shutil.which("ssh")
    if path is None:
        raise SSHUnavailableError(
            "access='tunnel' needs the OpenSSH client, but no `ssh` is on PATH; install it "
            "(Debian/Ubuntu: apt-get install openssh-client; macOS and Windows 10+ ship it) or use access='cidr'"
        )
    return path


def ssh_version(ssh_binary: str | None = None) -> str:
    """`ssh -V`'s answer (e.g. "OpenSSH_9.2p1 ..."): a quick check that SSH works at all."""
    binary = ssh_binary or find_ssh()
    try:
        done = subprocess.run([binary, "-V"], capture_output=True, text=True, timeout=10, check=False)
    except OSError as exc:
        raise SSHUnavailableError(f"cannot run {binary}: {exc}") from exc
    return (done.stderr or done.stdout).strip()


def default_known_hosts_file() -> Path:
    """The product's own known_hosts ($ARENA_SSH_KNOWN_HOSTS, else under $XDG_STATE_HOME).

    Separate from ~/.ssh/known_hosts so pinning and forgetting cloud VMs never touches the
    user's own entries.
    """
    if os.environ.get(KNOWN_HOSTS_ENV):
        return Path(os.environ[KNOWN_HOSTS_ENV]).expanduser()
    state = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    return state / "waa-arena" / "ssh_known_hosts"


@dataclass(frozen=True)
class SSHTarget:
    """Where one tunnel connects: `user@host:port` with an optional key file.

    `identity_file=None` lets ssh use the agent and the default keys. `host_key_alias` names the
    VM in the known_hosts file (see the module docstring); None pins by host and port.
    `config_file=None` reads ~/.ssh/config (ProxyJump etc.); tests pass /dev/null.
    """

    host: str
    user: str
    port: int = 22
    identity_file: Path | None = None
    known_hosts_file: Path = field(default_factory=default_known_hosts_file)
    connect_timeout: float = 10.0
    host_key_alias: str | None = None
    config_file: Path | None = None

    def __post_init__(self) -> None:
        if not self.host:
            raise ValueError("SSHTarget.host must not be empty")
        if not self.user or self.user.startswith("-") or "@" in self.user:
            raise ValueError(f"SSHTarget.user {self.user!r} is not a user name")
        if self.host.startswith("-"):  # would be read as an ssh option
            raise ValueError(f"SSHTarget.host {self.host!r} is not a host name")
        if not 0 < self.port < 65536:
            raise ValueError(f"SSHTarget.port {self.port} is out of range")

    def describe(self) -> str:
        """`user@host:port`, as errors and logs name the VM."""
        return f"{self.user}@{self.host}:{self.port}"

    @property
    def known_hosts_name(self) -> str:
        """The name ssh stores this target's key under in the known_hosts file."""
        if self.host_key_alias:
            return self.host_key_alias
        return self.host if self.port == 22 else f"[{self.host}]:{self.port}"


# Local ports held by this process's tunnels. While a tunnel's ssh is down its ports look free
# to the kernel; they must not be handed to another tunnel, or the first could never come back.
_reserved_ports: set[int] = set()
_reserved_lock = threading.Lock()


def free_local_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (the kernel's choice)."""
    return free_local_ports(1)[0]


def free_local_ports(count: int) -> list[int]:
    """`count` distinct free ports on 127.0.0.1, none held by another tunnel of this process.

    The sockets stay bound until all are chosen: a port closed at once can come straight back
    from the kernel, and two forwards on one port would make ssh fail.
    """
    sockets: list[socket.socket] = []
    try:
        ports: list[int] = []
        while len(ports) < count:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.bind((LOCAL_HOST, 0))
            port = int(sock.getsockname()[1])
            with _reserved_lock:
                if port not in _reserved_ports:
                    ports.append(port)
        return ports
    finally:
        for sock in sockets:
            sock.close()


def _reserve(ports: Mapping[str, int]) -> None:
    with _reserved_lock:
        _reserved_ports.update(ports.values())


def _release(ports: Mapping[str, int]) -> None:
    with _reserved_lock:
        _reserved_ports.difference_update(ports.values())


def _accepts(port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((LOCAL_HOST, port), timeout=timeout):
            return True
    except OSError:
        return False


def _config_path(path: Path) -> str:
    """A path as an ssh -o value: ssh splits values at blanks (UserKnownHostsFile takes a list)
    unless quoted, and expands %-tokens in these paths (so a literal % is written %%)."""
    text = str(path).replace("%", "%%")
    return f'"{text}"' if any(c.isspace() for c in text) else text


def _port_free(port: int) -> bool:
    """Whether ssh could listen on 127.0.0.1:`port` now (bound as ssh binds: SO_REUSEADDR, so
    connections in TIME_WAIT do not count, a listener does)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((LOCAL_HOST, port))
        except OSError:
            return False
        return True


_known_hosts_lock = threading.Lock()


def _prepare_known_hosts(path: Path) -> None:
    """Create the known_hosts file (and its folder) private to the user before ssh writes it."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if not path.exists():
        with _known_hosts_lock:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            os.close(fd)


def forget_host_key(target: SSHTarget) -> int:
    """Remove the pinned key(s) of `target` from its known_hosts file; the number removed.

    Only for a VM the provider itself deleted or re-imaged: the next connection pins the new key
    (accept-new). Done in Python rather than `ssh-keygen -R` to leave no `.old` copies behind.
    """
    path = target.known_hosts_file
    name = target.known_hosts_name
    with _known_hosts_lock:
        try:
            lines = path.read_text().splitlines(keepends=True)
        except FileNotFoundError:
            return 0
        kept = []
        for line in lines:
            fields = line.split()
            hosts = fields[0] if fields and not fields[0].startswith("@") else (fields[1] if len(fields) > 1 else "")
            if name in hosts.split(","):
                continue
            kept.append(line)
        removed = len(lines) - len(kept)
        if removed:
            # Atomic replace: ssh processes may read the file at any moment.
            fd, tmp = tempfile.mkstemp(prefix=".known_hosts.", dir=path.parent)
            with os.fdopen(fd, "w") as out:
                out.writelines(kept)
            os.chmod(tmp, 0o600)
            os.replace(tmp, path)
    return removed


class SSHTunnel:
    """One `ssh -N` process forwarding named local ports on 127.0.0.1 to ports on the VM.

    `forwards` maps a name to the remote port on the VM's loopback, e.g.
    {"waa": 5000, "qmp": 7200, "devtools": 9222}. `label` (the VM id) names the tunnel in logs
    and errors. Thread-safe: open/ensure/close may be called from the monitor and the pipeline.
    """

    def __init__(
        self,
        target: SSHTarget,
        forwards: Mapping[str, int],
        *,
        label: str | None = None,
        local_ports: Mapping[str, int] | None = None,
        open_timeout: float = 20.0,
        server_alive_interval: int = 10,
        server_alive_count_max: int = 3,
        ssh_binary: str | None = None,
    ) -> None:
        if not forwards:
            raise ValueError("an SSH tunnel needs at least one forward")
        self.target = target
        self.forwards = dict(forwards)
        self.label = label or target.host
        self.open_timeout = open_timeout
        self.server_alive_interval = server_alive_interval
        self.server_alive_count_max = server_alive_count_max
        self._ssh = ssh_binary or find_ssh()
        # Chosen once: URLs handed out must survive a re-established process.
        given = {name: int(port) for name, port in (local_ports or {}).items() if name in self.forwards and port}
        fresh = iter(free_local_ports(len(self.forwards) - len(given)))
        self._local_ports = {name: given[name] if name in given else next(fresh) for name in self.forwards}
        if len(set(self._local_ports.values())) != len(self._local_ports):
            raise ValueError(f"two forwards of the tunnel to {self.label} share a local port: {self._local_ports}")
        _reserve(self._local_ports)
        self._lock = threading.RLock()
        self._process: subprocess.Popen[bytes] | None = None
        self._stderr: IO[bytes] | None = None
        self._closed = False
        self._ever_opened = False  # until then no URL was handed out, so ports may still change
        self.restarts = 0  # how often the process was re-established after open()

    # -- addresses ------------------------------------------------------------------------

    @property
    def local_ports(self) -> dict[str, int]:
        return dict(self._local_ports)

    @property
    def pid(self) -> int | None:
        process = self._process
        return process.pid if process is not None and process.poll() is None else None

    def address(self, name: str) -> tuple[str, int]:
        """(127.0.0.1, local port) of the forward `name`."""
        try:
            return LOCAL_HOST, self._local_ports[name]
        except KeyError:
            raise KeyError(f"tunnel to {self.label} has no forward {name!r} "
                           f"(it has {', '.join(sorted(self._local_ports))})") from None

    def url(self, name: str) -> str:
        """http://127.0.0.1:<local port> of the forward `name`."""
        host, port = self.address(name)
        return f"http://{host}:{port}"

    def command(self) -> list[str]:
        """The ssh command line (no secrets: the identity is a path)."""
        t = self.target
        cmd = [self._ssh, "-N", "-T"]
        if t.config_file is not None:
            cmd += ["-F", str(t.config_file)]
        options = {
            "BatchMode": "yes",  # never prompt (passwords, passphrases, host keys): fail instead
            "ExitOnForwardFailure": "yes",  # a local port we cannot bind is a failure, not a silent tunnel
            "ServerAliveInterval": str(self.server_alive_interval),  # detect a dead VM / network ...
            "ServerAliveCountMax": str(self.server_alive_count_max),  # ... and exit, so the monitor reconnects
            "StrictHostKeyChecking": "accept-new",  # pin on first use; a changed key is refused
            "UserKnownHostsFile": _config_path(t.known_hosts_file),
            "HashKnownHosts": "no",  # the product's file stays readable and its entries removable
            "CheckHostIP": "no",  # the alias, not a recyclable IP, identifies the VM
            "UpdateHostKeys": "no",
            "ConnectTimeout": str(max(1, int(round(t.connect_timeout)))),
            # A ControlMaster from the user's config would turn this process into a mux client
            # that exits at once, leaving the forwards to another process we do not manage.
            "ControlMaster": "no",
            "ControlPath": "none",
            "ForwardAgent": "no",
            "ForwardX11": "no",
            "ClearAllForwardings": "no",
            "PermitLocalCommand": "no",
            "LogLevel": "ERROR",  # fatal errors only: no per-connection noise in the log file
        }
        if t.host_key_alias:
            options["HostKeyAlias"] = t.host_key_alias
        if t.identity_file is not None:
            options["IdentityFile"] = _config_path(t.identity_file)
            options["IdentitiesOnly"] = "yes"  # offer this key only: many agent keys trip MaxAuthTries
        for key, value in options.items():
            cmd += ["-o", f"{key}={value}"]
        for name, remote in self.forwards.items():
            cmd += ["-L", f"{LOCAL_HOST}:{self._local_ports[name]}:127.0.0.1:{remote}"]
        cmd += ["-p", str(t.port), "-l", t.user, "--", t.host]
        return cmd

    # -- lifecycle ------------------------------------------------------------------------

    def open(self) -> SSHTunnel:
        """Start ssh and return once every local forward accepts connections.

        Raises HostKeyMismatchError, SSHAuthenticationError or TunnelError (with ssh's stderr
        and the VM's address) when ssh exits or the forwards do not come up in time.
        """
        with self._lock:
            if self._closed:
                raise TunnelError(f"SSH tunnel to {self.label} ({self.target.describe()}) is closed")
            if self._process is not None and self._process.poll() is None:
                return self
            for attempt in range(3):
                try:
                    self._start()
                    break
                except TunnelError as exc:
                    # Another process took a chosen port between choosing and binding it: before
                    # any URL was handed out, choosing again is harmless.
                    if self._ever_opened or attempt == 2 or not any(p in str(exc) for p in _LOCAL_PORT_PHRASES):
                        raise
                    _release(self._local_ports)
                    self._local_ports = dict(zip(self.forwards, free_local_ports(len(self.forwards))))
                    _reserve(self._local_ports)
        return self

    def _start(self) -> None:
        self._stop_process()
        # The readiness check below connects to the local ports: a port someone else listens on
        # would pass it before ssh has even logged in, so a taken port is an error up front.
        taken = {name: port for name, port in self._local_ports.items() if not _port_free(port)}
        if taken:
            raise TunnelError(f"SSH tunnel to {self.label} ({self.target.describe()}): local port(s) {taken} "
                              "taken by another process (Address already in use)")
        _prepare_known_hosts(self.target.known_hosts_file)
        # A file, not a pipe: a pipe nobody reads could fill over days and block ssh.
        self._stderr = tempfile.TemporaryFile(prefix="waa-ssh-")
        try:
            self._process = subprocess.Popen(
                self.command(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._stderr,
                close_fds=True,
            )
        except OSError as exc:
            self._stderr.close()
            self._stderr = None
            raise SSHUnavailableError(f"SSH tunnel to {self.label} ({self.target.describe()}): "
                                      f"cannot run {self._ssh}: {exc}") from exc
        log.debug("ssh tunnel to %s (%s): pid %s, ports %s", self.label, self.target.describe(),
                  self._process.pid, self._local_ports)
        deadline = time.monotonic() + self.target.connect_timeout + self.open_timeout
        pending = set(self._local_ports.values())
        while True:
            if self._closed:  # close() from another thread ended the wait
                self._stop_process()
                raise TunnelError(f"SSH tunnel to {self.label} ({self.target.describe()}) was closed while opening")
            code = self._process.poll()
            if code is not None:
                error = self._failure(code)
                self._stop_process()
                raise error
            pending = {port for port in pending if not _accepts(port, timeout=0.2)}
            # Listening alone is not proof of our ssh: after the ports answer, ssh must still be
            # alive (ExitOnForwardFailure ends it if another process holds a port).
            if not pending and self._process.poll() is None:
                self._ever_opened = True
                return
            if time.monotonic() >= deadline:
                stderr = self._stderr_tail()
                self._stop_process()
                raise TunnelError(
                    f"SSH tunnel to {self.label} ({self.target.describe()}): forwards not ready after "
                    f"{self.target.connect_timeout + self.open_timeout:g} s" + (f": {stderr}" if stderr else "")
                )
            time.sleep(0.05)

    def _stderr_tail(self, limit: int = 2000) -> str:
        if self._stderr is None:
            return ""
        try:
            self._stderr.flush()
            self._stderr.seek(0)
            text = self._stderr.read().decode(errors="replace")
        except (OSError, ValueError):
            return ""
        lines = [line.strip() for line in text.splitlines() if line.strip() and not set(line.strip()) <= {"@"}]
        return " | ".join(lines)[-limit:]

    def _failure(self, code: int) -> TunnelError:
        """The error for an ssh that exited with `code`, classified by its stderr."""
        stderr = self._stderr_tail()
        where = f"SSH tunnel to {self.label} ({self.target.describe()})"
        said = f" (ssh exit {code}: {stderr or 'no message'})"
        if any(phrase in stderr for phrase in _HOST_KEY_PHRASES):
            return HostKeyMismatchError(
                f"{where}: REFUSED, the host key differs from the one pinned for "
                f"{self.target.known_hosts_name!r} in {self.target.known_hosts_file}. Someone may be "
                "intercepting the connection; if you rebuilt this VM yourself, remove the old entry with "
                f"`ssh-keygen -R '{self.target.known_hosts_name}' -f {self.target.known_hosts_file}`" + said
            )
        if any(phrase in stderr for phrase in _AUTH_PHRASES):
            key = (f"the key {self.target.identity_file}" if self.target.identity_file
                   else "the ssh-agent / default keys")
            return SSHAuthenticationError(
                f"{where}: authentication failed: the VM refused {key} for user {self.target.user!r}; "
                "check ssh_user and ssh_identity_file (and that the VM has the matching public key)" + said
            )
        if any(phrase in stderr for phrase in _LOCAL_PORT_PHRASES):
            return TunnelError(f"{where}: a local port ({self._local_ports}) is taken by another process" + said)
        return TunnelError(f"{where}: ssh failed" + said)

    def healthy(self) -> bool:
        """True when the ssh process is alive and every local forward accepts a connection."""
        with self._lock:
            process = self._process
            if self._closed or process is None or process.poll() is not None:
                return False
            return all(_accepts(port) for port in self._local_ports.values())

    def ensure(self) -> bool:
        """Re-establish a dead tunnel on the same local ports; True when it had to.

        A closed tunnel stays closed (returns False). Raises like open() when it cannot.
        """
        with self._lock:
            if self._closed or self.healthy():
                return False
            self._start()
            self.restarts += 1
            return True

    def reopen(self) -> None:
        """Replace the ssh process now (same local ports), e.g. after the VM's disk was replaced."""
        with self._lock:
            if self._closed:
                raise TunnelError(f"SSH tunnel to {self.label} ({self.target.describe()}) is closed")
            self._start()
            self.restarts += 1

    def close(self) -> None:
        """Terminate the ssh process (safe to repeat); the tunnel cannot be used afterwards."""
        # Flag and signal first, without the lock: an open() waiting for a slow VM holds the
        # lock for up to its timeout, and close() (VM deletion) must not wait for it.
        self._closed = True
        process = self._process
        if process is not None and process.poll() is None:
            process.terminate()
        with self._lock:
            self._stop_process()
            _release(self._local_ports)

    @property
    def closed(self) -> bool:
        return self._closed

    def _stop_process(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)
        elif process is not None:
            process.wait()  # reap: no zombie left behind
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def __enter__(self) -> SSHTunnel:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SSHTunnel({self.label!r}, {self.target.describe()}, ports={self._local_ports}, pid={self.pid})"


class TunnelManager:
    """One SSH tunnel per VM id, and a monitor thread that re-establishes dead tunnels.

    The monitor starts with the first tunnel and stops in `close_all()`. Opening a VM's tunnel
    again with the same target keeps (and if needed revives) the existing one; with a new target
    (the VM got a new address after a stop/start) it replaces the process but keeps the local
    ports, so the VM's URLs do not change.
    """

    def __init__(
        self,
        *,
        monitor_interval: float = 10.0,
        open_timeout: float = 20.0,
        server_alive_interval: int = 10,
        server_alive_count_max: int = 3,
        ssh_binary: str | None = None,
    ) -> None:
        self.monitor_interval = monitor_interval
        self.open_timeout = open_timeout
        self.server_alive_interval = server_alive_interval
        self.server_alive_count_max = server_alive_count_max
        self._ssh_binary = ssh_binary
        self._lock = threading.Lock()
        self._tunnels: dict[str, SSHTunnel] = {}
        self._failures: dict[str, int] = {}
        self._stop = threading.Event()
        self._monitor: threading.Thread | None = None
        self.reestablished: list[str] = []  # VM ids, in order, whose tunnel the monitor revived
        _managers.add(self)  # closed at interpreter exit if nobody did: no orphaned ssh processes

    def open(self, key: str, target: SSHTarget, forwards: Mapping[str, int]) -> SSHTunnel:
        """The open tunnel of VM `key` to `target` (created, revived or re-targeted as needed)."""
        ssh = self._ssh_binary or find_ssh()
        with self._lock:
            existing = self._tunnels.get(key)
        if existing is not None and not existing.closed and existing.target == target \
                and existing.forwards == dict(forwards):
            existing.open()
            existing.ensure()
            return existing
        if existing is not None:
            existing.close()  # frees its local ports for the replacement
        tunnel = SSHTunnel(
            target, forwards, label=key,
            local_ports=existing.local_ports if existing is not None else None,
            open_timeout=self.open_timeout, server_alive_interval=self.server_alive_interval,
            server_alive_count_max=self.server_alive_count_max, ssh_binary=ssh,
        )
        with self._lock:
            self._tunnels[key] = tunnel
            self._failures.pop(key, None)
        tunnel.open()
        self._start_monitor()
        return tunnel

    def open_when_ready(
        self,
        key: str,
        target: SSHTarget,
        forwards: Mapping[str, int],
        *,
        timeout: float,
        poll_seconds: float = 5.0,
        forget_host_key_first: bool = False,
    ) -> SSHTunnel:
        """`open()`, retried until `timeout` while the VM boots (sshd not listening yet, or
        cloud-init not done installing the key). A changed host key or a missing ssh client is
        final at once: waiting cannot fix either. `forget_host_key_first`: see `reopen()`."""
        if forget_host_key_first:
            forget_host_key(target)
            existing = self.get(key)
            if existing is not None and not existing.closed:
                existing.close()  # its process may still hold a connection to the old disk's sshd
        deadline = time.monotonic() + timeout
        attempts = 0
        while True:
            attempts += 1
            try:
                return self.open(key, target, forwards)
            except (HostKeyMismatchError, SSHUnavailableError):
                raise
            except TunnelError as exc:
                if time.monotonic() + poll_seconds > deadline:
                    raise TunnelError(f"{exc} (gave up after {attempts} attempts in {timeout:g} s)") from exc
                log.info("SSH tunnel to %s not up yet (attempt %d): %s", key, attempts, exc)
                time.sleep(poll_seconds)

    def get(self, key: str) -> SSHTunnel | None:
        with self._lock:
            return self._tunnels.get(key)

    def keys(self) -> list[str]:
        with self._lock:
            return sorted(self._tunnels)

    def reopen(self, key: str, *, forget_host_key_first: bool = False) -> SSHTunnel:
        """Restart VM `key`'s ssh process on the same ports; optionally forget its pinned key first
        (only after the provider itself replaced the VM's disk, which may bring new host keys)."""
        tunnel = self.get(key)
        if tunnel is None:
            raise KeyError(f"no SSH tunnel for {key}")
        if forget_host_key_first:
            forget_host_key(tunnel.target)
        tunnel.reopen()
        return tunnel

    def close(self, key: str, *, forget: bool = False) -> None:
        """Close VM `key`'s tunnel (no error when there is none); `forget=True` also removes its
        pinned host key (the VM was deleted: its successor will have another key)."""
        with self._lock:
            tunnel = self._tunnels.pop(key, None)
            self._failures.pop(key, None)
        if tunnel is not None:
            tunnel.close()
            if forget:
                forget_host_key(tunnel.target)

    def close_all(self) -> None:
        """Stop the monitor and every tunnel (safe to repeat)."""
        self._stop.set()
        monitor = self._monitor
        if monitor is not None and monitor is not threading.current_thread():
            monitor.join(timeout=self.monitor_interval + 30)
        with self._lock:
            tunnels = list(self._tunnels.values())
            self._tunnels.clear()
            self._failures.clear()
        for tunnel in tunnels:
            tunnel.close()

    def check_now(self) -> list[str]:
        """One monitor pass: re-establish every dead tunnel; the ids of those revived."""
        with self._lock:
            items = list(self._tunnels.items())
        revived = []
        for key, tunnel in items:
            if self._stop.is_set():
                break
            try:
                if tunnel.ensure():
                    revived.append(key)
                    log.warning("SSH tunnel to %s (%s) had died; re-established on the same ports %s",
                                key, tunnel.target.describe(), tunnel.local_ports)
                    with self._lock:
                        self._failures.pop(key, None)
                        self.reestablished.append(key)
            except TunnelError as exc:
                with self._lock:
                    failures = self._failures[key] = self._failures.get(key, 0) + 1
                # The first failure and then every tenth: a VM that is down must not flood the log.
                if failures == 1 or failures % 10 == 0:
                    log.error("SSH tunnel to %s is down and could not be re-established (attempt %d): %s",
                              key, failures, exc)
        return revived

    def _start_monitor(self) -> None:
        with self._lock:
            if self._monitor is not None and self._monitor.is_alive():
                return
            self._stop.clear()
            self._monitor = threading.Thread(target=self._run_monitor, name="ssh-tunnel-monitor", daemon=True)
            self._monitor.start()

    def _run_monitor(self) -> None:
        while not self._stop.wait(self.monitor_interval):
            try:
                self.check_now()
            except Exception:  # noqa: BLE001 - the monitor must outlive any one surprise
                log.exception("SSH tunnel monitor pass failed")

    def __enter__(self) -> TunnelManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close_all()


_managers: weakref.WeakSet[TunnelManager] = weakref.WeakSet()


@atexit.register
def _close_all_managers() -> None:
    for manager in list(_managers):
        try:
            manager.close_all()
        except Exception:  # noqa: BLE001 - best effort at exit
            pass


@contextlib.contextmanager
def open_tunnel(target: SSHTarget, forwards: Mapping[str, int], **kwargs: object) -> Iterator[SSHTunnel]:
    """`with open_tunnel(target, {"waa": 5000}) as t: requests.get(t.url("waa") + "/probe")`."""
    tunnel = SSHTunnel(target, forwards, **kwargs)  # type: ignore[arg-type]
    try:
        yield tunnel.open()
    finally:
        tunnel.close()
