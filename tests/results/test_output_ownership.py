"""`--overwrite` replaces only what this product wrote: `arena export` (training formats and
Parquet) and `arena demos build`, through the CLI, on real folders and a real store.

A foreign folder that happens to hold a manifest.json (a web app's), a provenance.jsonl, or a
file named like an exported table is refused in one line naming the folder and why, and nothing
in it is deleted; an earlier output of this product (also one written before the marker existed)
is replaced."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest

from adapters.results.export import PARQUET_MARKER, export_run_parquet
from adapters.store.duckdb_store import ResultStore, RunInfo
from adapters.training.output import MARKER, PRODUCER
from flows.cli import main

WEB_APP = {
    "manifest.json": json.dumps({"name": "Team dashboard", "short_name": "dash", "start_url": "/", "icons": []}),
    "index.html": "<!doctype html><title>dash</title>",
    "assets/app.js": "console.log('mine')",
}


def _tree(root: Path) -> dict[str, bytes]:
    """Every file under `root` (hidden ones too) with its content."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _folder(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def _refused(argv: list[str], folder: Path, why: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`argv` exits 2 with one line naming `folder` and `why`, and leaves `folder` as it was."""
    before = _tree(folder)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"arena: error: {folder}") and err.count("\n") == 1, err
    assert why in err, err
    assert _tree(folder) == before


@pytest.fixture()
def one_run_db(tmp_path: Path) -> Path:
    db = tmp_path / "results.duckdb"
    with ResultStore(db) as store:
        store.start_run(RunInfo(run_id="r1", agent="scripted", suite="bundled"))
    return db


@pytest.mark.parametrize(("command", "why"), [
    (["export", "r1", "--format", "trajectories"], "its manifest.json is not one this product writes"),
    (["export", "r1", "--format", "sft"], "its manifest.json is not one this product writes"),
    (["demos", "build", "--from-run", "r1"], "no provenance.jsonl in it"),
])
def test_a_web_apps_folder_with_a_manifest_is_refused_and_kept(
    bundled_run_db, tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str], why: str
) -> None:
    # A run with episodes: before the fix, such an export wiped the folder.
    command = [bundled_run_db.scripted if word == "r1" else word for word in command]
    app = _folder(tmp_path / "webapp", WEB_APP)
    _refused([*command, "--out", str(app), "--overwrite", "--db", str(bundled_run_db.db)], app,
             f"holds files and is not an earlier {'demo library' if 'demos' in command else 'training export'} "
             f"({why}", capsys)


@pytest.mark.parametrize(("marker", "why"), [
    ("not json at all", f"{MARKER} is not JSON"),
    (json.dumps({"producer": "someone-else", "kind": "training-export"}), f"does not name {PRODUCER}"),
    (json.dumps({"producer": PRODUCER, "kind": "demo-library"}), "says it is a 'demo-library' output"),
    (json.dumps([PRODUCER]), f"does not name {PRODUCER}"),
])
def test_a_marker_that_is_unreadable_foreign_or_of_another_kind_is_refused(
    one_run_db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], marker: str, why: str
) -> None:
    folder = _folder(tmp_path / "out", {**WEB_APP, MARKER: marker})
    _refused(["export", "r1", "--format", "trajectories", "--out", str(folder), "--overwrite", "--db",
              str(one_run_db)], folder, why, capsys)


def test_a_marker_that_is_not_a_regular_file_is_refused_without_reading_it(
    one_run_db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import os

    folder = _folder(tmp_path / "out", {"manifest.json": "{}"})
    os.mkfifo(folder / MARKER)  # reading it would block forever
    assert main(["export", "r1", "--format", "trajectories", "--out", str(folder), "--overwrite", "--db",
                 str(one_run_db)]) == 2
    assert f"{MARKER} is not a regular file" in capsys.readouterr().err
    assert (folder / "manifest.json").read_text() == "{}"


def test_a_foreign_provenance_file_is_refused(one_run_db: Path, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    folder = _folder(tmp_path / "lib", {"provenance.jsonl": '{"commit": "abc", "author": "me"}\n', "notes.md": "x"})
    _refused(["demos", "build", "--from-run", "r1", "--out", str(folder), "--overwrite", "--db", str(one_run_db)],
             folder, "its provenance.jsonl is not one this product writes", capsys)


def test_exports_and_libraries_are_marked_and_replaced_also_from_before_the_marker(
    bundled_run_db, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = str(bundled_run_db.db)
    for command, kind in ((["export", bundled_run_db.scripted, "--format", "trajectories", "--images", "none"],
                           "training-export"),
                          (["demos", "build", "--from-run", bundled_run_db.scripted], "demo-library")):
        out = tmp_path / kind
        assert main([*command, "--out", str(out), "--db", db]) == 0
        assert json.loads((out / MARKER).read_text()) == {"producer": PRODUCER, "kind": kind, "version": 1}
        (out / "stale.txt").write_text("from the last export")
        assert main([*command, "--out", str(out), "--overwrite", "--db", db]) == 0
        assert not (out / "stale.txt").exists() and (out / MARKER).is_file()
        # An output written before the marker existed is recognised by its own files.
        (out / MARKER).unlink()
        (out / "stale.txt").write_text("from an older version's export")
        assert main([*command, "--out", str(out), "--overwrite", "--db", db]) == 0, capsys.readouterr().err
        assert not (out / "stale.txt").exists() and (out / MARKER).is_file()
    # One kind's folder is not the other's to replace.
    library = tmp_path / "demo-library"
    _refused(["export", bundled_run_db.scripted, "--format", "sft", "--out", str(library), "--overwrite", "--db", db],
             library, "says it is a 'demo-library' output, not a training-export", capsys)


# -- Parquet ---------------------------------------------------------------------------------------


def test_parquet_files_of_another_program_are_refused_and_kept(
    one_run_db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _folder(tmp_path / "data", {"runs.parquet": "a CSV someone named .parquet", "README": "mine"})
    _refused(["export", "r1", "--parquet", str(folder), "--overwrite", "--db", str(one_run_db)], folder,
             "runs.parquet was not written by an export of this product", capsys)
    # A real Parquet file of someone else's (DuckDB's too, but no run_id column and no marker).
    (folder / "runs.parquet").unlink()
    duckdb.connect().execute(f"COPY (SELECT 1 AS experiment, 'x' AS label) TO '{folder / 'steps.parquet'}' "
                             "(FORMAT parquet)")
    _refused(["export", "r1", "--parquet", str(folder), "--overwrite", "--db", str(one_run_db)], folder,
             "steps.parquet was not written by an export of this product (no waa-arena marker", capsys)


def test_parquet_exports_are_marked_and_replaced_also_from_before_the_marker(one_run_db: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    paths = export_run_parquet(one_run_db, "r1", out)
    conn = duckdb.connect()
    for path in paths:
        metadata = dict(conn.execute("SELECT decode(key), decode(value) FROM parquet_kv_metadata(?)",
                                     [str(path)]).fetchall())
        assert metadata.items() >= PARQUET_MARKER.items()
    assert export_run_parquet(one_run_db, "r1", out, overwrite=True) == paths
    # An export from before the marker: DuckDB's Parquet of the run's rows, without metadata.
    conn.execute(f"COPY (SELECT 'r1' AS run_id, 'scripted' AS agent) TO '{out / 'runs.parquet'}' (FORMAT parquet)")
    assert export_run_parquet(one_run_db, "r1", out, overwrite=True) == paths
    assert conn.execute("SELECT count(*) FROM parquet_kv_metadata(?) WHERE decode(key) = 'producer'",
                        [str(out / "runs.parquet")]).fetchone() == (1,)
