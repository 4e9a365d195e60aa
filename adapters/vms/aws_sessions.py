"""boto3 sessions that share one botocore data loader per process.

A new ``boto3.Session()`` comes with a new data loader, and its first client then parses
botocore's JSON models again: about 0.25 s of CPU for an EC2 client (the EC2 model is several
megabytes), where a session using a loader that already read them takes about 0.03 s (measured
with botocore 1.43 on this project's machine). The models are read-only data and the loader
caches them per instance, so sessions may share it. Credentials, region and profile stay each
session's own: only the loader is shared.
"""

from __future__ import annotations

import threading
from typing import Any

_lock = threading.Lock()
_loaders: dict[str | None, Any] = {}  # by botocore's data_path setting (AWS_DATA_PATH)


def new_session() -> Any:
    """A new ``boto3.Session`` (boto3's own credential chain) whose data loader is shared."""
    import boto3
    import botocore.session

    core = botocore.session.get_session()
    with _lock:
        data_path = core.get_config_variable("data_path")
        loader = _loaders.get(data_path)
        if loader is None:
            loader = _loaders[data_path] = core.get_component("data_loader")
        else:
            core.register_component("data_loader", loader)
        session = boto3.Session(botocore_session=core)
        # boto3 appends its resource models' folder to the loader's search path at every session;
        # on a shared loader that would grow by one entry per session.
        paths = loader.search_paths
        while len(paths) > 1 and paths[-1] in paths[:-1]:
            paths.pop()
    return session
