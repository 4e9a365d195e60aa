"""Guest-level resets through the QEMU monitor, shared by the Azure and AWS providers.

On a cloud VM, WAA's container runs Windows in QEMU and exposes QMP on TCP port 7200. Two reset
levels work inside that guest without touching the cloud API:

* ``ResetLevel.SNAPSHOT``: ``loadvm`` of an internal snapshot taken once the WAA server answered
  ``/probe`` (:func:`take_baseline_snapshot`). It restores RAM, devices and disks in seconds.
  After it the guest clock jumps and TCP connections that were open at save time are dead, so
  the WAA server is probed again, with a fresh HTTP session, before the VM is handed back.
* ``ResetLevel.REBOOT``: ``system_reset`` (the reset button). Disk changes survive; Windows boots
  again (about 90 s on real VMs) and the WAA server is waited for.

The monitor address is ``(host, port)`` for the cloud VMs' TCP monitor or the path of a Unix
socket (the kvm provider's own QEMU processes); both speak the same protocol.

Requirements on the QEMU side (see the cloud notes): every writable drive must be qcow2 (dockur's
``DISK_FMT`` defaults to raw), otherwise savevm fails with a text error that surfaces here as a
:class:`~adapters.vms.base.ProviderError`.

Every failure is a ``ProviderError`` naming the monitor address, the WAA URL and the step. A bad
snapshot name is a caller bug and raises ``ValueError`` before anything is sent.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from adapters.vms.base import ProviderError, ResetLevel
from adapters.vms.qmp import (
    QMPAddress,
    QMPClient,
    QMPConnectionError,
    QMPError,
    describe_address,
    qmp_client,
    validate_snapshot_name,
)
from adapters.waa.client import WAAClient
from adapters.waa.errors import WAAError

DEFAULT_SNAPSHOT_NAME = "waa-baseline"
DEFAULT_MONITOR_TIMEOUT = 600.0  # savevm/loadvm of a 16 GB guest takes seconds to minutes
BASELINE_READY_DEADLINE = 1800.0  # a fresh VM may still be booting Windows
SNAPSHOT_READY_DEADLINE = 300.0
REBOOT_READY_DEADLINE = 900.0


@dataclass(frozen=True)
class ResetTiming:
    """How long a guest-level reset took, in seconds.

    ``monitor_seconds`` covers the QMP session (connect, the command, the run-state check);
    ``ready_seconds`` is the wait for ``/probe`` afterwards. For :func:`take_baseline_snapshot`
    ``ready_seconds`` is the wait *before* the savevm.
    """

    level: ResetLevel
    monitor_seconds: float
    ready_seconds: float
    total_seconds: float


def _where(qmp_address: QMPAddress, waa_url: str) -> str:
    return f"VM {describe_address(qmp_address)} (WAA {waa_url})"


def _waa_client(waa_url: str) -> WAAClient:
    # One attempt per probe (the readiness loop repeats) and a new session each time: pooled
    # keep-alive connections from before a loadvm are dead afterwards.
    return WAAClient(waa_url, read_retries=0)


def _wait_ready(qmp_address: QMPAddress, waa_url: str, step: str, deadline: float, poll_seconds: float) -> float:
    client = _waa_client(waa_url)
    try:
        return client.wait_until_ready(deadline, poll_seconds=poll_seconds)
    except WAAError as exc:
        raise ProviderError(f"{_where(qmp_address, waa_url)}: {step}: WAA server not ready: {exc}") from exc
    finally:
        client.close()


def _ensure_running(qmp: QMPClient, where: str, step: str) -> None:
    """Resume the guest when the monitor left it paused; ProviderError when it will not run."""
    state = qmp.status()
    if state == "running":
        return
    if state in ("paused", "restore-vm", "save-vm", "prelaunch", "suspended", "debug"):
        qmp.cont()
        state = qmp.status()
        if state == "running":
            return
    raise ProviderError(f"{where}: {step}: the guest is {state!r}, not running")


def _monitor_failure(where: str, step: str, exc: Exception, qmp: QMPClient | None = None) -> ProviderError:
    detail = str(exc)
    if qmp is not None and isinstance(exc, QMPError):
        try:
            detail += f"; the guest is now {qmp.status()!r}"
        except (QMPError, QMPConnectionError):
            pass
    return ProviderError(f"{where}: {step} failed: {detail}")


def take_baseline_snapshot(
    qmp_address: QMPAddress,
    waa_url: str,
    name: str = DEFAULT_SNAPSHOT_NAME,
    ready_deadline: float = BASELINE_READY_DEADLINE,
    *,
    monitor_timeout: float = DEFAULT_MONITOR_TIMEOUT,
    poll_seconds: float = 1.0,
) -> ResetTiming:
    """Wait until the WAA server answers ``/probe``, then ``savevm name`` and check it is listed.

    Saving before the server answers would bake a half-booted guest into every later reset.
    """
    validate_snapshot_name(name)
    where = _where(qmp_address, waa_url)
    start = time.monotonic()
    ready = _wait_ready(qmp_address, waa_url, "before savevm", ready_deadline, poll_seconds)
    monitor_start = time.monotonic()
    step = f"savevm {name}"
    try:
        with qmp_client(qmp_address, timeout=monitor_timeout) as qmp:
            try:
                qmp.savevm(name)
            except QMPError as exc:
                raise _monitor_failure(where, step, exc, qmp) from exc
            step = "info snapshots"
            listed = qmp.snapshots()
            if name not in listed:
                raise ProviderError(f"{where}: savevm {name}: snapshot not listed afterwards (have {listed})")
            step = "resume after savevm"
            _ensure_running(qmp, where, step)
    except (QMPError, QMPConnectionError) as exc:
        raise _monitor_failure(where, step, exc) from exc
    end = time.monotonic()
    return ResetTiming(ResetLevel.SNAPSHOT, end - monitor_start, ready, end - start)


def snapshot_reset(
    qmp_address: QMPAddress,
    waa_url: str,
    name: str = DEFAULT_SNAPSHOT_NAME,
    ready_deadline: float = SNAPSHOT_READY_DEADLINE,
    *,
    monitor_timeout: float = DEFAULT_MONITOR_TIMEOUT,
    poll_seconds: float = 1.0,
) -> ResetTiming:
    """``loadvm name``, make sure the guest runs, then wait for ``/probe`` again.

    A failed loadvm leaves QEMU's VM stopped ("restore-vm"); the error says so and the caller
    should escalate (REBOOT resumes a stopped guest, DISK replaces it).
    """
    validate_snapshot_name(name)
    where = _where(qmp_address, waa_url)
    start = time.monotonic()
    step = f"loadvm {name}"
    try:
        with qmp_client(qmp_address, timeout=monitor_timeout) as qmp:
            try:
                qmp.loadvm(name)
            except QMPError as exc:
                raise _monitor_failure(where, step, exc, qmp) from exc
            step = "resume after loadvm"
            _ensure_running(qmp, where, step)
    except (QMPError, QMPConnectionError) as exc:
        raise _monitor_failure(where, step, exc) from exc
    monitor_done = time.monotonic()
    ready = _wait_ready(qmp_address, waa_url, f"after loadvm {name}", ready_deadline, poll_seconds)
    end = time.monotonic()
    return ResetTiming(ResetLevel.SNAPSHOT, monitor_done - start, ready, end - start)


def reboot_reset(
    qmp_address: QMPAddress,
    waa_url: str,
    ready_deadline: float = REBOOT_READY_DEADLINE,
    *,
    monitor_timeout: float = 60.0,
    poll_seconds: float = 1.0,
    settle_seconds: float = 2.0,
) -> ResetTiming:
    """``system_reset`` (resuming a stopped guest), then wait for ``/probe``.

    ``settle_seconds`` waits before the first probe so that an answer still in flight from the
    old boot is not taken for the new one (negligible next to a ~90 s Windows boot).
    """
    where = _where(qmp_address, waa_url)
    start = time.monotonic()
    step = "system_reset"
    try:
        with qmp_client(qmp_address, timeout=monitor_timeout) as qmp:
            qmp.system_reset()
            step = "resume after system_reset"
            _ensure_running(qmp, where, step)
    except (QMPError, QMPConnectionError) as exc:
        raise _monitor_failure(where, step, exc) from exc
    monitor_done = time.monotonic()
    if settle_seconds > 0:
        time.sleep(settle_seconds)
    ready = _wait_ready(qmp_address, waa_url, "after system_reset", ready_deadline, poll_seconds)
    end = time.monotonic()
    return ResetTiming(ResetLevel.REBOOT, monitor_done - start, ready, end - start)
