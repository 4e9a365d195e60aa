"""The builder's #cloud-config: valid for the real validator (`cloud-init schema`), and no user
string (URL, tag, repository) can become code on the builder."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from adapters.images.cloud_init import (
    PREPARE_SCRIPT,
    RUN_SCRIPT,
    UNIT_PATH,
    ContainerPlan,
    prepare_script,
    render_user_data,
)
from adapters.images.spec import BuildSpec

CLOUD_INIT = shutil.which("cloud-init") or ("/usr/bin/cloud-init" if Path("/usr/bin/cloud-init").exists() else None)
DIGEST = "sha256:" + "ab" * 32
HOSTILE_URL = "https://store.example.com/iso/win'11\".iso?sig=$(touch${IFS}/tmp/pwned)&x=`id`;rm${IFS}-rf${IFS}/&y=${HOME}"


def _spec(**overrides: object) -> BuildSpec:
    values: dict[str, object] = dict(provider="aws", name="b1", container_image="windowsarena/winarena:latest",
                                     windows_iso_url="https://store.example.com/win11.iso?sv=1&sig=abc%3D")
    values.update(overrides)
    return BuildSpec(**values)


def _files(user_data: str) -> dict[str, str]:
    return {f["path"]: f["content"] for f in yaml.safe_load(user_data)["write_files"]}


def _validate(tmp_path: Path, user_data: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "user-data.yaml"
    path.write_text(user_data)
    return subprocess.run([CLOUD_INIT, "schema", "--config-file", str(path)], capture_output=True, text=True,
                          timeout=60)


needs_cloud_init = pytest.mark.skipif(CLOUD_INIT is None, reason="cloud-init is not installed (Debian's package "
                                      "provides `cloud-init schema`)")


@needs_cloud_init
@pytest.mark.parametrize("plan,overrides", [
    (ContainerPlan(reference=f"windowsarena/winarena@{DIGEST}"), {}),
    (ContainerPlan(repo="https://github.com/microsoft/WindowsAgentArena.git", commit="a" * 40),
     {"container_image": None, "waa_repo": "https://github.com/microsoft/WindowsAgentArena.git",
      "waa_commit": "a" * 40, "windows_iso_url": None,
      "prepared_storage_url": "https://acct.blob.core.windows.net/c/storage.tar.gz?sig=x"}),
    (ContainerPlan(reference=f"windowsarena/winarena@{DIGEST}"), {"windows_iso_url": HOSTILE_URL}),
], ids=["pull-iso", "git-storage", "hostile-url"])
def test_the_real_validator_accepts_the_user_data(tmp_path: Path, plan: ContainerPlan, overrides: dict) -> None:
    user_data = render_user_data(_spec(**overrides), plan)
    result = _validate(tmp_path, user_data)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Valid cloud-config" in result.stdout


@needs_cloud_init
def test_the_real_validator_rejects_a_broken_document(tmp_path: Path) -> None:
    """The check has teeth: a document with a wrongly typed key fails it."""
    broken = render_user_data(_spec(), ContainerPlan(reference="a/b:c")).replace("package_update: true",
                                                                                   "package_update: maybe")
    assert _validate(tmp_path, broken).returncode != 0


def test_the_document_installs_docker_runs_the_prepare_script_and_the_unit() -> None:
    user_data = render_user_data(_spec(), ContainerPlan(reference=f"windowsarena/winarena@{DIGEST}"))
    assert user_data.startswith("#cloud-config\n")
    config = yaml.safe_load(user_data)
    assert "docker.io" in config["packages"]
    assert config["runcmd"] == [[PREPARE_SCRIPT]]  # exec form: no shell parses it
    files = _files(user_data)
    assert set(files) == {PREPARE_SCRIPT, RUN_SCRIPT, UNIT_PATH}
    assert "WantedBy=multi-user.target" in files[UNIT_PATH] and "ExecStop=/usr/bin/docker stop -t 120" in files[UNIT_PATH]
    assert "--device=/dev/kvm" in files[RUN_SCRIPT] and "-p 5000:5000" in files[RUN_SCRIPT]
    assert "./entry.sh --prepare-image false --start-client false" in files[RUN_SCRIPT]
    # No copy of the (possibly SAS-bearing) user data stays on the disk the image is made from.
    assert "/var/lib/cloud/instance/user-data.txt" in files[PREPARE_SCRIPT] and 'rm -f -- "$0"' in files[PREPARE_SCRIPT]
    for script in (files[PREPARE_SCRIPT], files[RUN_SCRIPT]):
        assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0


@pytest.mark.parametrize("field,value", [
    ("windows_iso_url", HOSTILE_URL),
    ("prepared_storage_url", "https://h.example.com/s.tar.zst?a='$(id)'&b=\"`reboot`\""),
])
def test_hostile_urls_reach_the_shell_only_as_quoted_data(tmp_path: Path, field: str, value: str) -> None:
    overrides = {"windows_iso_url": None, field: value}
    spec = _spec(**overrides)
    script = prepare_script(spec, ContainerPlan(reference=f"windowsarena/winarena@{DIGEST}"))
    header = script.split("\nSTORAGE=", 1)[0]  # the assignments of user values, nothing else
    marker = tmp_path / "pwned"
    probe = header.replace("/tmp/pwned", str(marker)) if "/tmp/pwned" in value else header
    out = subprocess.run(["bash", "-c", probe + '\nprintf %s "$SOURCE_URL"'], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    expected = value.replace("/tmp/pwned", str(marker)) if "/tmp/pwned" in value else value
    assert out.stdout == expected  # the exact string, as data
    assert not marker.exists()
    # And the YAML carries it unchanged (no YAML injection either).
    plan = ContainerPlan(reference="a/b:c")
    user_data = render_user_data(spec, plan)
    assert _files(user_data)[PREPARE_SCRIPT] == prepare_script(spec, plan)
    assert set(yaml.safe_load(user_data)) == {"package_update", "packages", "write_files", "runcmd"}


@pytest.mark.parametrize("field,value", [
    ("container_image", "windowsarena/winarena:latest$(touch /tmp/x)"),
    ("container_image", "windowsarena/winarena:latest\nruncmd: [reboot]"),
    ("container_image", "windowsarena/winarena:'latest'"),
    ("windows_iso_url", "https://h.example.com/win.iso\nruncmd: [[reboot]]"),
    ("windows_iso_url", "https://h.example.com/win 11.iso"),
    ("waa_commit", "$(reboot)"),
    ("waa_repo", "https://github.com/x/y.git\n--upload-pack=touch"),
])
def test_hostile_tags_and_newlines_are_rejected(field: str, value: str) -> None:
    overrides: dict[str, object] = {field: value}
    if field.startswith("waa_"):
        overrides.update({"container_image": None, "waa_repo": "https://github.com/x/y.git", "waa_commit": "a" * 40,
                          field: value})
    with pytest.raises(ValueError, match=field):
        _spec(**overrides)
