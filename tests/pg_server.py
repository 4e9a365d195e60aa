"""A real PostgreSQL server on 127.0.0.1 for the team-store tests (Debian's `postgresql` binaries).

The server gets a throwaway data directory, password authentication (scram-sha-256, so a wrong
password is really refused) and its own port; it is stopped and deleted at the end. PostgreSQL
refuses to run as root, so under root it runs as the `postgres` system user. Tests skip cleanly
when no PostgreSQL binaries are installed.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from ports import server_port

USER = "arena"
PASSWORD = "arena-test-password"


def postgres_bindir() -> Path | None:
    """The directory of initdb/pg_ctl, or None when PostgreSQL is not installed."""
    on_path = shutil.which("pg_ctl")
    if on_path:
        return Path(on_path).resolve().parent
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    return Path(found[-1]).parent if found else None


def _as_server_user(cmd: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return cmd
    return ["runuser", "-u", "postgres", "--", *cmd]


class PostgresServer:
    """One throwaway PostgreSQL server: its data directory, port and the `arena` database's URL;
    `stop` and `start` take it down and bring it back (a restart, an outage) on the same port."""

    def __init__(self) -> None:
        bindir = postgres_bindir()
        if bindir is None:
            raise FileNotFoundError("PostgreSQL is not installed (no pg_ctl); install the postgresql package")
        self.bindir = bindir
        self.root = Path(tempfile.mkdtemp(prefix="arena-test-pg-"))
        self.data = self.root / "data"
        self.port = server_port()
        self.url = f"postgresql://{USER}:{PASSWORD}@127.0.0.1:{self.port}/arena"
        pwfile = self.root / "pw"
        pwfile.write_text(PASSWORD + "\n")
        if os.geteuid() == 0:
            account = pwd.getpwnam("postgres")
            os.chown(self.root, account.pw_uid, account.pw_gid)
            os.chown(pwfile, account.pw_uid, account.pw_gid)
        subprocess.run(
            _as_server_user([str(bindir / "initdb"), "-D", str(self.data), "-U", USER, f"--pwfile={pwfile}",
                             "--auth=scram-sha-256", "--encoding=UTF8", "--locale=C"]),
            check=True, capture_output=True, text=True,
        )
        self.start()
        subprocess.run(
            _as_server_user([str(bindir / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", USER, "arena"]),
            check=True, capture_output=True, text=True, env={**os.environ, "PGPASSWORD": PASSWORD},
        )

    def start(self) -> None:
        subprocess.run(
            _as_server_user([str(self.bindir / "pg_ctl"), "-D", str(self.data), "-w", "-t", "60", "-l",
                             str(self.root / "log"), "-o",
                             f"-p {self.port} -h 127.0.0.1 -k {self.root} -c max_connections=200 -c fsync=off", "start"]),
            check=True, capture_output=True, text=True,
        )

    def stop(self) -> None:
        subprocess.run(_as_server_user([str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop"]),
                       capture_output=True)

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


@contextlib.contextmanager
def running_postgres() -> Iterator[str]:
    """Start a PostgreSQL server and yield the URL of its `arena` database (user arena)."""
    with postgres_server() as server:
        yield server.url


@contextlib.contextmanager
def postgres_server() -> Iterator[PostgresServer]:
    """A PostgreSQL server of its own (for tests that stop and restart it), removed at the end."""
    server = PostgresServer()
    try:
        yield server
    finally:
        server.remove()
