"""Where the evaluation host keeps files it downloads for tasks: one copy per URL.

Setup `download` steps and the evaluator's `cloud_file` getter share the cache, so a file a
task uploads and a gold file are fetched once for every task, attempt and run that names them,
and `arena tasks lint --offline --cache-dir DIR` checks what an offline run would find.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from adapters.host_paths import inside


def cached_download_path(download_dir: Path, url: str, name: str) -> Path:
    """`<download_dir>/<sha256(url)>/<basename(name)>`: the URL keys the copy; the name keeps the
    file's extension (metrics look at it). `name` may be a Windows or POSIX path; a base name
    that leads out of the folder ('..') raises `PathEscapeError`."""
    digest = hashlib.sha256(url.encode("utf-8")).hexdigest()
    base = os.path.basename(name.replace("\\", "/")) or "file"
    return inside(Path(download_dir) / digest, base, what="download file name")
