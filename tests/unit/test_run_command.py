"""``kustos run``: its options parsed without typer, the same from the entry and the CLI."""

from __future__ import annotations

import subprocess
import sys

from typer.testing import CliRunner

from kustos.cli import app
from kustos.run import parser


def kustos(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kustos", *args], capture_output=True, text=True, timeout=60)


def test_kustos_run_help_lists_its_options_and_exits_cleanly() -> None:
    done = kustos("run", "--help")
    assert done.returncode == 0, done.stderr
    for option in ("--kubeconfig", "--no-leader-elect", "--webhook-service", "--cloud-provider"):
        assert option in done.stdout
    assert "--extra-controllers" not in done.stdout  # for benchmarks and tests only


def test_a_bad_webhook_service_is_refused_naming_the_flag_before_anything_connects() -> None:
    done = kustos("run", "--webhook-service", "kustos-system/kustos")
    assert done.returncode == 2
    assert "--webhook-service" in done.stderr and "expected namespace/name:port" in done.stderr


def test_the_other_commands_still_run_through_typer() -> None:
    done = kustos("--help")
    assert done.returncode == 0, done.stderr
    assert "run" in done.stdout and "dev" in done.stdout and "etcd" in done.stdout


def test_the_cli_forwards_run_with_its_arguments() -> None:
    """``python -m kustos.cli run`` (and typer's CliRunner) reach the same parser."""
    result = CliRunner().invoke(app, ["run", "--help"])
    assert result.exit_code == 0
    assert "--webhook-cert-secret" in result.output


def test_flags_pair_and_repeat() -> None:
    args = parser().parse_args(
        ["--no-leader-elect", "--json-logs", "--cloud-option", "a=1", "--cloud-option", "b=2",
         "--namespace", "x", "--webhook-service", "kustos-system/kustos-webhook:443"]
    )  # fmt: skip
    assert args.leader_elect is False and args.json_logs is True
    assert args.cloud_option == ["a=1", "b=2"] and args.namespace == ["x"]
    assert args.webhook_service == {"namespace": "kustos-system", "name": "kustos-webhook", "port": 443}


def test_a_shortened_flag_is_refused_not_taken_for_another() -> None:
    done = kustos("run", "--webhook-cert-secre", "kustos-webhook")
    assert done.returncode == 2
    assert "unrecognized arguments: --webhook-cert-secre" in done.stderr
