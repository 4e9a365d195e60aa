"""A throwaway OpenSSH server on 127.0.0.1 for the SSH tunnel tests.

`SSHServer(root)` generates a host key and an ed25519 client key under `root`, writes an
sshd_config that listens on a free loopback port, accepts only that client key (for the current
user, root included) and allows TCP forwarding, and runs `/usr/sbin/sshd -D` as a child
process. `stop()` / `start()` restart it on the same port; `new_host_key()` swaps the host key (a
"rebuilt or impersonated VM"). Nothing outside `root` is touched, except that sshd started as
root needs its privilege separation directory /run/sshd, which Debian's service unit normally
creates: it is created (empty, 0755) when missing.
"""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

from ports import server_port

SSHD = Path("/usr/sbin/sshd")
PRIVSEP_DIR = Path("/run/sshd")


def sshd_missing_reason() -> str | None:
    """Why the real-sshd tests cannot run here, or None when they can."""
    if not SSHD.exists():
        return f"{SSHD} is not installed (Debian: apt-get install openssh-server)"
    for tool in ("ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (Debian: apt-get install openssh-client)"
    if os.geteuid() == 0 and not PRIVSEP_DIR.is_dir():
        try:
            PRIVSEP_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
        except OSError as exc:
            return f"sshd as root needs {PRIVSEP_DIR}: {exc}"
    return None


def keygen(path: Path, comment: str) -> Path:
    """A fresh passphrase-less ed25519 key pair at `path` / `path`.pub."""
    for old in (path, path.with_suffix(".pub")):
        old.unlink(missing_ok=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                   check=True, capture_output=True, timeout=30)
    return path


class SSHServer:
    """One sshd process on 127.0.0.1:`port`, accepting `client_key` for `user`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.port = server_port()
        self.user = getpass.getuser()
        self.host_key = keygen(root / "host_ed25519", "test-host")
        self.client_key = keygen(root / "client_ed25519", "test-client")
        self.authorized_keys = root / "authorized_keys"
        self.authorized_keys.write_text(self.client_key.with_suffix(".pub").read_text())
        self.config = root / "sshd_config"
        self.pid_file = root / "sshd.pid"
        self.log_file = root / "sshd.log"
        self._process: subprocess.Popen[bytes] | None = None
        self._write_config()

    def _write_config(self) -> None:
        lines = [
            f"Port {self.port}",
            "ListenAddress 127.0.0.1",
            f"HostKey {self.host_key}",
            f"PidFile {self.pid_file}",
            f"AuthorizedKeysFile {self.authorized_keys}",
            "StrictModes no",  # the tmp folders' modes are not sshd's business here
            "UsePAM no",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "AllowTcpForwarding yes",
            "PermitTTY no",
            "X11Forwarding no",
            "MaxStartups 50",
            "LogLevel VERBOSE",
        ]
        if os.geteuid() == 0:
            lines.append("PermitRootLogin prohibit-password")
        self.config.write_text("\n".join(lines) + "\n")

    def start(self, timeout: float = 10.0) -> None:
        """Run sshd (-D: no daemonizing, so it is our child) until its port accepts."""
        if self.running:
            return
        log = self.log_file.open("ab")
        # An absolute path: sshd re-executes itself and refuses to start otherwise.
        self._process = subprocess.Popen([str(SSHD), "-D", "-e", "-f", str(self.config)],
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"sshd exited with {self._process.returncode}: {self.log_file.read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"sshd did not listen on {self.port} within {timeout} s")

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def stop(self) -> None:
        """Stop the listener. Per-connection sshd children are killed too (an SSH session
        survives its listener otherwise, as on a real host), so clients see the server gone."""
        process, self._process = self._process, None
        if process is None:
            return
        for child in self._children(process.pid):
            try:
                os.kill(child, 15)
            except ProcessLookupError:
                pass
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)

    @staticmethod
    def _children(pid: int) -> list[int]:
        """Descendants of `pid` (Linux /proc), deepest last."""
        found: list[int] = []
        frontier = [pid]
        while frontier:
            parent = frontier.pop()
            try:
                text = Path(f"/proc/{parent}/task/{parent}/children").read_text()
            except OSError:
                continue
            kids = [int(x) for x in text.split()]
            found += kids
            frontier += kids
        return found

    def new_host_key(self) -> None:
        """Replace the host key (takes effect at the next start)."""
        keygen(self.host_key, "test-host-rebuilt")

    def host_key_line(self) -> str:
        return self.host_key.with_suffix(".pub").read_text().strip()
