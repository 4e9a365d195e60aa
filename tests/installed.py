"""Skipping a test module whose optional packages are missing, without importing them.

`pytest.importorskip` at a module's top imports the package while the module is collected, and
every pytest worker collects every module: the model SDKs, Azure's management clients, moto,
datasets and pandas cost 0.3-2 s of CPU each to import, paid by all five workers although only
the worker that runs the module's tests needs them (measured: about 5 s of each worker's 15 s of
collection). `require` only looks the packages up; the tests import them when they run.
"""

from __future__ import annotations

import importlib.util

import pytest


def installed(module: str) -> bool:
    """Whether `module` can be imported (found on the path; only its parent packages are loaded)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


def require(*modules: str, reason: str | None = None) -> None:
    """Skip the calling test module unless every one of `modules` is installed (call it at the
    module's top, before importing anything that needs them)."""
    missing = [module for module in modules if not installed(module)]
    if missing:
        pytest.skip(reason or f"not installed: {', '.join(missing)}", allow_module_level=True)
