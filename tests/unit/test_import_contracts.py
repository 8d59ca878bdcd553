"""The layering contracts in pyproject.toml hold, and a wrong import breaks them.

`make test` runs `lint-imports` on the tree itself; this test proves the contracts
have teeth: the same check over a copy with one forbidden import must fail and say
which contract broke.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _lint(tree: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--no-logo"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    source = ROOT / "src" / "kustos"
    shutil.copytree(source, tmp_path / "src" / "kustos", ignore=shutil.ignore_patterns("gomod"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


@pytest.mark.parametrize(
    ("module", "bad_import", "contract"),
    [
        ("runtime/informer.py", "import kustos.etcd.controller", "runtime/ is shared by every family"),
        ("storage/planner.py", "import kustos.etcd.planner", "families do not import each other"),
        ("etcd/planner.py", "import kustos.devcluster.cluster", "devcluster/ is imported by nothing"),
        ("api/etcd.py", "import kustos.storage.controller", "api/ (the models"),
        ("etcd/controller.py", "import kustos.proof.recorder", "proof/ (the history recorder and checker)"),
        ("metrics/facts.py", "import kustos.etcd.observe", "metrics/ reads the models' status and"),
        ("etcd/controller.py", "import kustos.metrics.facts", "no family imports metrics/"),
        ("nodejob/planner.py", "import kustos.runtime.api", "planners decide without I/O"),
        ("nodes/nodeimage/planner.py", "import asyncio", "planners decide without I/O"),
    ],
)
def test_a_forbidden_import_breaks_its_contract(
    tree: Path, module: str, bad_import: str, contract: str
) -> None:
    path = tree / "src" / "kustos" / module
    path.write_text(path.read_text() + f"\n{bad_import}  # deliberate\n")
    result = _lint(tree)
    assert result.returncode != 0
    broken = result.stdout.split("Broken contracts", 1)[-1]
    assert contract in broken, result.stdout
