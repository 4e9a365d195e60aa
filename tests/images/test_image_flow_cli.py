"""The image-build Prefect flow (one task per stage) and `arena image build|status`."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_image_build_aws import spec_for

from adapters.images.builders import BuilderOptions, load_build_settings, make_builder
from adapters.images.stages import Stage
from flows.cli import main
from flows.image_build import image_build


def _config(tmp_path: Path, moto) -> Path:
    path = tmp_path / "arena.toml"
    path.write_text(
        "[aws]\n"  # no ami_id: the image does not exist yet
        'region = "us-east-1"\ncontroller_cidr = "203.0.113.7/32"\nowner = "ci@example.com"\n'
        f'endpoint_url = "{moto.url}"\nwaiter_delay = 0.05\nwaiter_max_attempts = 40\n'
        "security_group_delete_timeout = 0\nready_poll_seconds = 0.05\n"
    )
    return path


def test_the_flow_builds_resumes_and_is_a_no_op_when_done(prefect_server, aws_env, waa_sim, registry,
                                                          tmp_path: Path, capsys) -> None:
    registry.push("windowsarena/winarena", "latest")
    spec = spec_for(registry)
    config = _config(tmp_path, aws_env)
    options = BuilderOptions(waa_url_for=lambda vm: waa_sim.base_url)

    class Killed(Exception):
        pass

    def kill_after_capture(stage: Stage) -> None:
        if stage is Stage.CAPTURE:
            raise Killed()

    with pytest.raises(Killed):
        image_build(spec=spec, cloud_config=config, options=options, after_stage=kill_after_capture)
    builder = make_builder(spec, config)
    try:
        status = builder.status()
        assert status.done()[Stage.CAPTURE] and not status.verified and status.builder_resources
        image_id = image_build(spec=spec, cloud_config=config, options=options)
        assert image_id == status.image_id and builder.status().complete
        assert image_build(spec=spec, cloud_config=config) == image_id  # done: no hooks needed
    finally:
        builder.close()
    assert main(["image", "status", spec.name, "--provider", "aws", "--config", str(config)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"build {spec.name} (aws)" and all(" done " in line for line in out[1:])
    assert image_id in out[3] and "builder deleted" in out[5]


def test_cli_bad_input_exits_2_with_one_line(capsys) -> None:
    code = main(["image", "build", "--provider", "aws", "--name", "b1", "--container-image", "x/y:$(reboot)",
                 "--windows-iso-url", "https://s.example.com/w.iso"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "container_image" in err
    code = main(["image", "build", "--provider", "azure", "--name", "b1", "--container-image", "x/y:1"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "windows_iso_url" in err and len(err.splitlines()) == 1


def test_cli_missing_cloud_section_exits_2(tmp_path: Path, capsys) -> None:
    config = tmp_path / "arena.toml"
    config.write_text("")
    code = main(["image", "status", "b1", "--provider", "azure", "--config", str(config)])
    assert code == 2 and "[azure] section" in capsys.readouterr().err


def test_cli_failed_build_exits_1_and_status_shows_the_stages(prefect_server, aws_env, tmp_path: Path,
                                                               capsys) -> None:
    config = _config(tmp_path, aws_env)
    assert load_build_settings("aws", config).ami_id == "ami-00000000"
    code = main(["image", "build", "--provider", "aws", "--name", "b1", "--config", str(config),
                 "--container-image", "windowsarena/winarena@sha256:" + "1" * 64,
                 "--windows-iso-url", "https://s.example.com/w.iso?sig=x", "--base-image", "ami-12345678"])
    err = capsys.readouterr().err
    assert code == 1 and "base AMI ami-12345678 not found" in err and "rerun the same command" in err
    assert main(["image", "status", "b1", "--provider", "aws", "--config", str(config)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "build b1 (aws)" and len(out) == 6
    assert all("todo" in line for line in out[1:])
