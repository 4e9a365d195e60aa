"""Training exports stream: peak memory of `arena export` at 1,000 and 10,000 steps.

Builds a results store per size (episodes of 10 steps, one 1280x800 PNG screenshot shared by
every step, real reasoning and actions) through `ResultStore.record_results`, then exports it as
sft (images as files, and embedded as data URLs) and as trajectories, each in its own process,
and prints that process's peak resident memory and Python's own peak allocation (tracemalloc).
Memory that stays flat from 1k to 10k steps is the target; it prints numbers and asserts nothing.

    python bench/export_stream.py [--sizes 1000 10000]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.conditions import conditions  # noqa: E402 - after the path is set

STEPS_PER_EPISODE = 10
FORMATS = (("sft", "files"), ("sft", "embed"), ("trajectories", "files"))


def build_store(root: Path, steps: int) -> Path:
    """A store with one run of `steps` steps (episodes of STEPS_PER_EPISODE) on the bundled suite."""
    from PIL import Image

    from adapters.benchmark import ActionType, BenchmarkAction, BenchmarkResult, OutcomeKind, StepRecord
    from adapters.store.duckdb_store import ResultStore, RunInfo
    from adapters.waa.catalog import WAATaskCatalog, bundled_suite_dir

    shot = root / "artifacts" / "screen.png"
    shot.parent.mkdir(parents=True)
    Image.new("RGB", (1280, 800), (40, 90, 140)).save(shot)
    catalog = WAATaskCatalog(bundled_suite_dir())
    tasks = catalog.tasks()
    db = root / "arena.duckdb"
    with ResultStore(db) as store:
        store.start_run(RunInfo(run_id="bench", agent="openai", model_id="bench-model", suite=str(bundled_suite_dir()),
                                suite_hash=catalog.content_hash(), task_count=len(tasks)))
        results = []
        for episode in range(steps // STEPS_PER_EPISODE):
            task = tasks[episode % len(tasks)]
            actions = [BenchmarkAction(type=ActionType.CLICK, x=100 + i, y=200 + i,
                                       reasoning=f"step {i}: the button is at the top left") for i in range(9)]
            actions.append(BenchmarkAction(type=ActionType.DONE))
            results.append(BenchmarkResult(
                task_id=task.task_id, domain=task.domain, outcome=OutcomeKind.SUCCESS, success=True, score=1.0,
                attempt=1 + episode // len(tasks), num_steps=len(actions),
                steps=[StepRecord(index=i, action=a, screenshot_path=str(shot)) for i, a in enumerate(actions)],
            ))
            if len(results) == 100:
                store.record_results("bench", results)
                results = []
        if results:
            store.record_results("bench", results)
        store.finish_run("bench", "completed")
    return db


def measure(db: Path, fmt: str, images: str, out: Path) -> dict[str, float]:
    """Run one export in a fresh process; its peak RSS, tracemalloc peak and time."""
    code = f"""
import json, resource, time, tracemalloc
from pathlib import Path
from adapters.training.export import export_training
from adapters.training.selection import EpisodeFilter
tracemalloc.start()
t0 = time.perf_counter()
s = export_training(Path({str(db)!r}), EpisodeFilter(run_ids=["bench"], final_attempts_only=False),
                    {fmt!r}, Path({str(out)!r}), images={images!r})
print(json.dumps({{"seconds": time.perf_counter() - t0, "steps": s.steps,
                   "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                   "py_peak_mb": tracemalloc.get_traced_memory()[1] / 2**20}}))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          cwd=Path(__file__).resolve().parents[1])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000])
    args = parser.parse_args()
    print(conditions(), flush=True)
    with tempfile.TemporaryDirectory(prefix="export-bench-") as tmp:
        rows = []
        for size in args.sizes:
            t0 = time.perf_counter()
            db = build_store(Path(tmp) / f"s{size}", size)
            print(f"built a store of {size} steps in {time.perf_counter() - t0:.1f} s")
            for fmt, images in FORMATS:
                result = measure(db, fmt, images, Path(tmp) / f"out-{size}-{fmt}-{images}")
                rows.append((size, f"{fmt} ({images})", result))
        print(f"{'steps':>7}  {'format':<18} {'seconds':>8} {'peak RSS MB':>12} {'Python peak MB':>15}")
        for size, name, r in rows:
            print(f"{size:>7}  {name:<18} {r['seconds']:>8.1f} {r['rss_mb']:>12.1f} {r['py_peak_mb']:>15.2f}")
        print("flat = the peaks at the largest size are close to those at the smallest (no growth with steps)")


if __name__ == "__main__":
    main()
