"""The local WAA environment: a SIMULATED Windows desktop behind the WAA server's HTTP API.

No Windows VM runs on a developer's or CI machine, so this package serves the same routes,
payloads and status codes as the WAA Flask server inside a Windows VM, backed by a small
in-process model of a desktop (Notepad, File Explorer, Settings) and a sandboxed file tree.
Action code is parsed and whitelisted, never executed. Everything a user sees is labelled as a
simulation. Start it with :func:`adapters.waa.localenv.launcher.start_local_env`.
"""

SIMULATION_LABEL = "SIMULATED"
