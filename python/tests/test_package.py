"""`pip install ./python` installs the package: built from a copy of this directory (so no
build files land in the tree) into a temporary target, and imported from there."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import REPO


def test_pip_installs_the_package(tmp_path: Path) -> None:
    source = tmp_path / "source"
    shutil.copytree(
        REPO / "python", source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", ".pytest_cache", "tests")
    )
    target = tmp_path / "site"
    command = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target)]
    # Where setuptools and wheel are installed, build with them rather than fetch them.
    if all(importlib.util.find_spec(name) is not None for name in ("setuptools", "wheel")):
        command.append("--no-build-isolation")
    installed = subprocess.run([*command, str(source)], capture_output=True, text=True)
    if installed.returncode != 0 and "externally-managed" in installed.stderr:
        installed = subprocess.run([*command, "--break-system-packages", str(source)], capture_output=True, text=True)
    assert installed.returncode == 0, installed.stderr
    probe = (
        "import agentvfs, agentvfs.deepagents as d; from deepagents.backends.protocol import SandboxBackendProtocol as S;"
        " print(d.__file__); print(issubclass(d.AgentvfsBackend, S)); print(agentvfs.resolve_socket('/s'))"
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    ran = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines() == [str(target / "agentvfs" / "deepagents.py"), "True", "/s"]
    assert (target / "agentvfs" / "py.typed").exists()
