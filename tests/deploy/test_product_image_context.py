"""What the product's image is built from and when it is built again (tests/realk8s/product_image.py): the build
context holds exactly what the Dockerfile copies less what .dockerignore leaves out, and its key changes with
those files alone, so a test session whose sources did not change reuses the image."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.realk8s.product_image import REPO, context_sources, ignore_rules, ignored, stage_context


def fake_checkout(root: Path) -> Path:
    """A checkout with the real Dockerfile and .dockerignore, a few sources, and what the context leaves out."""
    root.mkdir()
    for name in ("Dockerfile", ".dockerignore"):
        shutil.copy2(REPO / name, root / name)
    files = {
        "pyproject.toml": "[project]\nname = 'x'\n", "README.md": "readme\n",
        "devplugin/__init__.py": "", "devplugin/app/cli.py": "print('cli')\n", "shim/gs_init.c": "int x;\n",
        "shim/gpushare_contract.h": "#define X 1\n",
        # left out: not copied by the Dockerfile, or local leftovers .dockerignore names
        "tests/test_x.py": "", "bench/b.py": "", "devplugin/__pycache__/cli.cpython-311.pyc": "pyc",
        "devplugin/app/cli.pyc": "pyc", "shim/gs_init.o": "obj", "shim/libgpushare.so": "so",
        "gpushare_devplugin.egg-info/PKG-INFO": "", "devplugin/x.egg-info/PKG-INFO": "",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_the_context_is_what_the_dockerfile_copies(tmp_path: Path) -> None:
    checkout = fake_checkout(tmp_path / "checkout")
    stage_context(checkout, tmp_path / "context")
    staged = sorted(p.relative_to(tmp_path / "context").as_posix()
                    for p in (tmp_path / "context").rglob("*") if p.is_file())
    assert staged == [".dockerignore", "Dockerfile", "README.md", "devplugin/__init__.py", "devplugin/app/cli.py",
                      "pyproject.toml", "shim/gpushare_contract.h", "shim/gs_init.c"]
    assert context_sources(REPO) == ["pyproject.toml", "README.md", "devplugin", "shim"]


def test_the_key_changes_with_the_copied_files_alone(tmp_path: Path) -> None:
    checkout = fake_checkout(tmp_path / "checkout")
    context = tmp_path / "context"
    key = stage_context(checkout, context)
    assert stage_context(checkout, context) == key
    for rel in ("tests/test_x.py", "devplugin/__pycache__/cli.cpython-311.pyc", "shim/gs_init.o"):
        (checkout / rel).write_text("changed")
        assert stage_context(checkout, context) == key, f"{rel} is not built from, yet the key changed"
    for rel in ("devplugin/app/cli.py", "shim/gs_init.c", "README.md", "Dockerfile"):
        (checkout / rel).write_text((checkout / rel).read_text() + "\n# changed\n")
        changed = stage_context(checkout, context)
        assert changed != key, f"{rel} changed, the key did not"
        key = changed
    (checkout / "devplugin/app/cli.py").chmod(0o755)
    assert stage_context(checkout, context) != key, "the executable bit is part of what is built"


def test_dockerignore_rules_as_docker_reads_them() -> None:
    rules = ignore_rules(REPO / ".dockerignore")
    for kept in ("pyproject.toml", "README.md", "devplugin", "devplugin/app/cli.py", "shim/gs_init.c"):
        assert not ignored(kept, rules), kept
    for left_out in (".git/config", ".venv/bin/python", "tests/test_image.py", "build/shim/libgpushare.so",
                     "devplugin/__pycache__/cli.cpython-311.pyc", "devplugin/app/x.pyo", "shim/gs_init.o",
                     "shim/libgpushare.so.1", "devplugin/x.egg-info/PKG-INFO"):
        assert ignored(left_out, rules), left_out
