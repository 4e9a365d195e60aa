"""Defaults of the VM layer that are shown before anything runs (the `arena` help texts).

This module imports nothing, so a command line can show them without loading a cloud SDK or the
provider modules; those modules take their defaults from here.
"""

from __future__ import annotations

# How long a warm pool may sit unused before the janitor deletes it: a nightly pool is used
# daily, so two days leaves room for one missed night.
DEFAULT_POOL_TTL_HOURS = 48.0

# A service answering with the caller's public address (the controller's egress check).
DEFAULT_EGRESS_URL = "https://checkip.amazonaws.com"

# The existing provider: how long to wait for a server to answer (at start, and again after it
# failed an attempt) before it is retired.
DEFAULT_SERVER_WAIT_SECONDS = 60.0
