"""kustos's image is built again exactly when what deploy/Dockerfile copies changes."""

from __future__ import annotations

from pathlib import Path

from kustos.devcluster.kustosimage import archive_path, content_key


def tree(root: Path) -> Path:
    (root / "deploy").mkdir(parents=True)
    (root / "deploy" / "Dockerfile").write_text("FROM python:3.11-slim-bookworm\n")
    for name in ("pyproject.toml", "uv.lock", "README.md"):
        (root / name).write_text(name)
    (root / "src" / "kustos").mkdir(parents=True)
    (root / "src" / "kustos" / "cli.py").write_text("print('kustos')\n")
    return root


def test_an_unchanged_tree_keeps_its_archive_and_a_changed_one_gets_another(tmp_path: Path) -> None:
    root = tree(tmp_path / "checkout")
    key = content_key(root)
    # What Python writes while the tree is used is not what the image is built from.
    (root / "src" / "kustos" / "__pycache__").mkdir()
    (root / "src" / "kustos" / "__pycache__" / "cli.cpython-311.pyc").write_bytes(b"\0")
    (root / ".venv").mkdir()
    assert content_key(root) == key
    assert archive_path("ghcr.io/kustos/kustos:0.1.0", tmp_path, key).name == (
        f"ghcr.io_kustos_kustos+0.1.0-{key}.docker.tar"
    )

    (root / "src" / "kustos" / "cli.py").write_text("print('changed')\n")
    assert content_key(root) != key
    (root / "src" / "kustos" / "cli.py").write_text("print('kustos')\n")
    (root / "uv.lock").write_text("another lock")
    assert content_key(root) != key
