"""deploy/Dockerfile passes hadolint (installed from PyPI as a dev dependency) and keeps the
properties the chart relies on: non-root uid 65532, `kustos` as the entrypoint, etcdctl."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

DOCKERFILE = Path(__file__).resolve().parents[2] / "deploy" / "Dockerfile"


def test_hadolint_finds_nothing() -> None:
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent))
    assert hadolint, "hadolint is a dev dependency: run `make lint` to sync the venv"
    result = subprocess.run([hadolint, str(DOCKERFILE)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_image_runs_kustos_as_65532_with_etcdctl() -> None:
    lines = [line.strip() for line in DOCKERFILE.read_text().splitlines()]
    final = lines[max(i for i, line in enumerate(lines) if line.startswith("FROM ")) :]
    assert "USER 65532:65532" in final
    assert 'ENTRYPOINT ["kustos"]' in final
    assert any(line.startswith("COPY --from=etcdctl") and "/usr/local/bin/etcdctl" in line for line in final)
    assert any("uv sync --frozen" in line for line in lines)
