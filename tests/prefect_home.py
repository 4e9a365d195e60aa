"""New Prefect homes whose SQLite database is already migrated, for the tests that start servers.

A Prefect server started on a new home first runs all of Prefect's database migrations: about
5 of its 9 seconds of start-up here, spent again by every test that starts a server or runs
`arena run` in a fresh home. `seeded_home` copies one migrated database into the new home
instead. The template is made once per Prefect version by Prefect itself (`prefect server
database upgrade`, then the block-type registration a server's start runs next, the same call;
no server has run on it) and shared by the test processes through a lock; what a server then
finds is exactly what its own start would have left (the same 54 block types and 64 schemas,
checked against a server started on a migrated-only copy). A server told so
(`SEEDED_SERVER_SETTINGS`) skips that registration: about 0.8 s of CPU and 0.9 s of every start
here (measured: 3.5 s to healthy against 2.6 s).

Tests about the cold start itself (the first run migrating its home, runs starting together)
leave their homes unseeded.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

PREFECT_BIN = Path(sys.executable).parent / "prefect"
DATABASE = "prefect.db"  # the database file a home's server uses when no URL is configured
# Prefect settings of a server (or an `arena run` that starts one) on a seeded home: its block
# types are registered already.
SEEDED_SERVER_SETTINGS = {"PREFECT_API_BLOCKS_REGISTER_ON_START": "false"}

# What a server's start does after its migrations: register the block types Prefect knows.
_REGISTER_BLOCK_TYPES = """
import asyncio
from prefect.server.database import provide_database_interface
from prefect.server.models.block_registration import run_block_auto_registration

async def register():
    session = await provide_database_interface().session()
    async with session:
        await run_block_auto_registration(session=session)

asyncio.run(register())
"""


def _template() -> Path:
    """The migrated database for this Prefect version, its block types registered, made on first use."""
    import prefect

    folder = Path(tempfile.gettempdir()) / "arena-test-prefect-templates"
    folder.mkdir(exist_ok=True)
    template = folder / f"prefect-{prefect.__version__}-with-block-types.db"
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one test process makes it; the others wait for it
        if not template.exists():
            home = Path(tempfile.mkdtemp(dir=folder))
            env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
            env["PREFECT_HOME"] = str(home)
            subprocess.run([str(PREFECT_BIN), "server", "database", "upgrade", "-y"], env=env,
                           check=True, capture_output=True, timeout=300)
            subprocess.run([sys.executable, "-c", _REGISTER_BLOCK_TYPES], env=env, check=True, capture_output=True,
                           timeout=300)
            with sqlite3.connect(home / DATABASE) as con:
                con.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # everything in the one file
            os.replace(home / DATABASE, template)  # complete or absent, never half-written
            shutil.rmtree(home, ignore_errors=True)
    return template


def seeded_home(home: Path) -> Path:
    """`home`, created, with the template's database in it (migrated, block types registered;
    nothing else in the home); returns `home`. A server on it may skip registering block types
    (`SEEDED_SERVER_SETTINGS`)."""
    home.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(_template(), home / DATABASE)
    return home


def seeded_run_env(home: Path) -> dict[str, str]:
    """This process's environment without Prefect's settings, for an `arena run` whose own local
    server lives in `home`, seeded (`seeded_home`) and told to skip registering block types."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    return {**env, "PREFECT_HOME": str(seeded_home(home)), **SEEDED_SERVER_SETTINGS}
