"""Optional parts of the product that come with an extra (pyproject.toml), and the one error a
command gives when the extra it needs is not installed."""

from __future__ import annotations


class ExtraMissing(RuntimeError):
    """A command needs an extra that is not installed; the message names the extra and the
    command that installs it (the CLI prints it as one line, exit 2)."""
