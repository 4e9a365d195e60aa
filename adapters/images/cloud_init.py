"""The builder VM's user data: a #cloud-config that turns a plain Ubuntu host into a WAA host.

On the builder's first boot cloud-init installs Docker, writes three files and runs the first:

    /usr/local/sbin/waa-arena-prepare   (once, at build time) pull the WAA container pinned by
                                        digest, or clone WAA at the commit and build it as WAA's
                                        scripts/build-container-image.sh does; download the
                                        Windows ISO or the prepared storage archive from the
                                        user's URL; enable and start the unit below
    /usr/local/sbin/waa-arena-run       (every boot) run the WAA container: /dev/kvm, the storage
                                        folder as /storage, the ISO as /custom.iso while Windows
                                        is not installed yet, WAA's entry.sh without its client;
                                        WAA 5000, QMP 7200 and DevTools 9222 published, noVNC
                                        (8006) on loopback only
    /etc/systemd/system/waa-arena.service  starts waa-arena-run at every boot of the builder and
                                        of every VM made from the image; stopping it stops the
                                        container with WAA's 120 s grace, so Windows shuts down
                                        cleanly before a capture

Windows is installed (from the ISO) or simply booted (prepared storage) by the container's first
run; the WAA server then answers on port 5000, which is what the build waits for.

User values never become code: the YAML is written by a YAML library, the scripts are built from
fixed text plus `shlex.quote`d assignments of the (already validated) values, and cloud-init runs
the prepare script in exec form (a list, no shell).
"""

from __future__ import annotations

import shlex

import yaml
from pydantic import BaseModel

from adapters.images.spec import BuildSpec, storage_archive_kind

WAA_ROOT = "/var/lib/waa-arena"
STORAGE_DIR = f"{WAA_ROOT}/storage"  # WAA's vm/storage: the prepared Windows disk lives here
ISO_PATH = f"{WAA_ROOT}/setup.iso"  # WAA's vm/image/setup.iso, mounted as /custom.iso
CONTAINER_REF_FILE = "/etc/waa-arena/container-image"
PREPARE_SCRIPT = "/usr/local/sbin/waa-arena-prepare"
RUN_SCRIPT = "/usr/local/sbin/waa-arena-run"
UNIT_NAME = "waa-arena.service"
UNIT_PATH = f"/etc/systemd/system/{UNIT_NAME}"
CONTAINER_NAME = "winarena"
BUILT_IMAGE_TAG = "waa-arena/winarena"  # the local tag of a container built from source


class ContainerPlan(BaseModel):
    """How the builder gets the WAA container: pull `reference` or build from `repo` at `commit`."""

    reference: str | None = None  # name@sha256:... (or a tag when the digest could not be resolved)
    repo: str | None = None
    commit: str | None = None

    @property
    def run_reference(self) -> str:
        """What `docker run` starts on every boot."""
        if self.reference:
            return self.reference
        return f"{BUILT_IMAGE_TAG}:{self.commit}"


def _assign(name: str, value: str) -> str:
    return f"{name}={shlex.quote(value)}"


def prepare_script(spec: BuildSpec, container: ContainerPlan) -> str:
    """The build-time script; every user value appears once, as a quoted assignment at the top."""
    values = [
        _assign("RUN_REF", container.run_reference),
        _assign("PULL_REF", container.reference or ""),
        _assign("WAA_REPO", container.repo or ""),
        _assign("WAA_COMMIT", container.commit or ""),
        _assign("SOURCE_KIND", spec.windows_source_kind),
        _assign("SOURCE_URL", spec.windows_source_url),
        _assign("ARCHIVE_KIND", storage_archive_kind(spec.prepared_storage_url or "") or ""),
    ]
    body = f"""\
#!/bin/bash
# WAA arena image build: prepare this host (written by waa-arena; runs once, on the builder).
set -euo pipefail
{chr(10).join(values)}
STORAGE={shlex.quote(STORAGE_DIR)}
ISO={shlex.quote(ISO_PATH)}
log() {{ echo "waa-arena-prepare: $*" | tee -a /var/log/waa-arena-build.log; }}
fail() {{ log "FAILED: $*"; echo "$*" > {shlex.quote(WAA_ROOT)}/build-failed; exit 1; }}
mkdir -p "$STORAGE" /etc/waa-arena
[ -e /dev/kvm ] || fail "/dev/kvm is missing: this instance type or VM size has no nested virtualization"
systemctl enable --now docker
if [ -n "$WAA_REPO" ]; then
    log "building the WAA container from $WAA_REPO at $WAA_COMMIT"
    rm -rf /opt/waa-src
    git clone --no-checkout -- "$WAA_REPO" /opt/waa-src
    git -C /opt/waa-src checkout --detach "$WAA_COMMIT"
    docker build -f /opt/waa-src/src/win-arena-container/Dockerfile-WinArena-Base \\
        -t windowsarena/winarena-base:latest /opt/waa-src
    docker build -f /opt/waa-src/src/win-arena-container/Dockerfile-WinArena \\
        -t "$RUN_REF" /opt/waa-src
else
    log "pulling $PULL_REF"
    for attempt in 1 2 3 4 5; do docker pull "$PULL_REF" && break; sleep 30; done
    docker image inspect "$PULL_REF" >/dev/null || fail "could not pull the WAA container"
fi
printf '%s\\n' "$RUN_REF" > {shlex.quote(CONTAINER_REF_FILE)}
if [ "$SOURCE_KIND" = iso ]; then
    log "downloading the Windows ISO"
    curl -fsSL --retry 5 --retry-delay 10 -o "$ISO.part" -- "$SOURCE_URL" || fail "Windows ISO download failed"
    mv "$ISO.part" "$ISO"
else
    log "downloading and unpacking the prepared WAA storage ($ARCHIVE_KIND)"
    case "$ARCHIVE_KIND" in
        tar) curl -fsSL --retry 5 -- "$SOURCE_URL" | tar -x -C "$STORAGE" ;;
        tar.gz) curl -fsSL --retry 5 -- "$SOURCE_URL" | tar -xz -C "$STORAGE" ;;
        tar.zst) curl -fsSL --retry 5 -- "$SOURCE_URL" | zstd -dc | tar -x -C "$STORAGE" ;;
        zip) curl -fsSL --retry 5 -o "$STORAGE.zip" -- "$SOURCE_URL" && unzip -q "$STORAGE.zip" -d "$STORAGE" \\
                 && rm -f "$STORAGE.zip" ;;
        *) fail "unknown storage archive kind" ;;
    esac || fail "prepared storage download failed"
fi
systemctl daemon-reload
systemctl enable --now {UNIT_NAME}
# The source URL may carry a SAS token or signature: keep no copy of the user data on the disk
# the image is captured from (cloud-init's and the Azure agent's copies, and this script).
rm -f /var/lib/cloud/instance/user-data.txt /var/lib/cloud/instance/user-data.txt.i \
    /var/lib/cloud/instance/cloud-config.txt /var/lib/cloud/instance/obj.pkl \
    /var/lib/waagent/CustomData /var/lib/waagent/ovf-env.xml || true
rm -f -- "$0"
log "the WAA container is starting; Windows is prepared on its first run"
"""
    return body


def run_script(spec: BuildSpec) -> str:
    """The every-boot script behind the systemd unit (no user value beyond validated numbers)."""
    return f"""\
#!/bin/bash
# WAA arena: run WAA's Windows-in-QEMU container (written by waa-arena; started by {UNIT_NAME}).
set -euo pipefail
REF="$(cat {shlex.quote(CONTAINER_REF_FILE)})"
ISO={shlex.quote(ISO_PATH)}
args=(--name {CONTAINER_NAME} --device=/dev/kvm --cap-add NET_ADMIN --stop-timeout 120
      -v {shlex.quote(STORAGE_DIR)}:/storage
      -e RAM_SIZE={shlex.quote(spec.vm_ram)} -e CPU_CORES={int(spec.vm_cpu_cores)}
      -e DISK_FMT=qcow2
      -p 5000:5000 -p 7200:7200 -p 9222:9222 -p 127.0.0.1:8006:8006)
# DISK_FMT=qcow2: the snapshot reset level (QEMU savevm/loadvm) needs a qcow2 disk; dockur's
# default is raw. The ISO is only needed until Windows is installed on the storage disk.
if [ -f "$ISO" ]; then args+=(--mount "type=bind,source=$ISO,target=/custom.iso,readonly"); fi
exec docker run --rm "${{args[@]}}" --entrypoint /bin/bash "$REF" \\
    -c './entry.sh --prepare-image false --start-client false'
"""


def systemd_unit() -> str:
    return f"""\
[Unit]
Description=WAA arena: Windows Agent Arena container (Windows in QEMU, WAA server on port 5000)
Requires=docker.service
After=docker.service network-online.target
Wants=network-online.target

[Service]
ExecStartPre=-/usr/bin/docker rm -f {CONTAINER_NAME}
ExecStart={RUN_SCRIPT}
ExecStop=/usr/bin/docker stop -t 120 {CONTAINER_NAME}
Restart=always
RestartSec=10
TimeoutStopSec=180

[Install]
WantedBy=multi-user.target
"""


class _Dumper(yaml.SafeDumper):
    """SafeDumper writing multi-line strings (the scripts) as literal blocks, readable on the VM."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def render_user_data(spec: BuildSpec, container: ContainerPlan) -> str:
    """The #cloud-config document (YAML written by PyYAML: no value is spliced into YAML text)."""
    packages = ["docker.io", "curl", "ca-certificates", "git", "zstd", "unzip"]
    config = {
        "package_update": True,
        "packages": packages,
        "write_files": [
            {"path": PREPARE_SCRIPT, "permissions": "0755", "owner": "root:root",
             "content": prepare_script(spec, container)},
            {"path": RUN_SCRIPT, "permissions": "0755", "owner": "root:root", "content": run_script(spec)},
            {"path": UNIT_PATH, "permissions": "0644", "owner": "root:root", "content": systemd_unit()},
        ],
        # Exec form: cloud-init runs the list directly, no shell parses it.
        "runcmd": [[PREPARE_SCRIPT]],
    }
    # PyYAML falls back to a quoted scalar wherever a literal block could not hold the text exactly.
    return "#cloud-config\n" + yaml.dump(config, Dumper=_Dumper, sort_keys=False, default_flow_style=False,
                                          width=4096)
