"""Pytest fixtures: a real agentvfs daemon (the built `target/debug/agentvfs`, or
`$AGENTVFS_BIN`) on a real FUSE mount with a temporary config, stopped by PID and unmounted
after each test even when it fails (`umount -l` as the last resort).

Every daemon has the three route kinds: `/` memory, `/workspace` host (a temporary
directory), `/memories` sqlite; `execute` is enabled (bubblewrap, run as root by CI).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# The package under test is this tree's, whether or not (and whichever version) is installed.
sys.path.insert(0, str(REPO / "python"))
BIN = Path(os.environ.get("AGENTVFS_BIN", REPO / "target" / "debug" / "agentvfs"))

# Secrets a Deep Agents user keeps from the model, and a directory whose writes need a human.
DEFAULT_RULES = """
[[rules]]
operations = ["read", "write"]
paths = ["/**/.env"]
mode = "deny"

[[rules]]
operations = ["write"]
paths = ["/workspace/locked/**"]
mode = "deny"
hide = false

[[rules]]
operations = ["write"]
paths = ["/workspace/guarded/**"]
mode = "interrupt"
"""


@dataclass
class Daemon:
    """One running daemon: where it mounted, its sockets and its host route's directory."""

    state: Path
    mountpoint: Path
    control_socket: Path
    agent_socket: Path
    host_root: Path
    process: subprocess.Popen[bytes] | None
    log: Path

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


def _mounted(path: Path) -> bool:
    want = str(path)
    with open("/proc/self/mountinfo") as f:
        return any(line.split(" ")[4] == want for line in f)


def start_daemon(
    state: Path, rules: str = DEFAULT_RULES, approval_timeout: int = 120, execute: bool = True, routes: str = ""
) -> Daemon:
    """Writes a config under `state` and starts `agentvfs mount`; returns once it is live.
    Unanswered approvals expire after `approval_timeout` seconds; `execute` says whether
    the daemon offers the execute tool; `routes` are more `[[routes]]` tables."""
    if not BIN.exists():
        pytest.fail(f"{BIN} is missing: build it first (`cargo build`; scripts/test.sh does)")
    state.mkdir(parents=True, exist_ok=True)
    host_root = state / "workspace"
    host_root.mkdir()
    # The host root belongs to root, so `execute` runs as nobody, whom the modes must let in.
    for d in (host_root, host_root / "locked", host_root / "guarded"):
        d.mkdir(exist_ok=True)
        d.chmod(0o777)
    mountpoint = state / "mnt"
    mountpoint.mkdir()
    control = state / "ctl.sock"
    config = state / "agentvfs.toml"
    config.write_text(
        f"""
socket = "{control}"

[default]
backend = "memory"

[[routes]]
path = "/workspace"
backend = "host"
root = "{host_root}"

[[routes]]
path = "/memories"
backend = "sqlite"
database = "{state / 'memories.db'}"
{routes}
[audit]
database = "{state / 'audit.db'}"

[interrupts]
timeout_seconds = {approval_timeout}

[exec]
enabled = {"true" if execute else "false"}
cwd = "/workspace"
timeout_seconds = 60
{rules}
"""
    )
    return _launch(Daemon(state, mountpoint, control, state / "ctl-agent.sock", host_root, None, state / "daemon.log"))


def restart_daemon(daemon: Daemon) -> None:
    """Stops `daemon` and starts it again on the same config and sockets (the memory route
    starts empty; the host and sqlite routes keep their files)."""
    stop_daemon(daemon)
    _launch(daemon)


def _launch(daemon: Daemon) -> Daemon:
    """Starts `agentvfs mount` on the config in `daemon.state`; returns once it is live."""
    env = {k: v for k, v in os.environ.items() if k not in ("SUDO_UID", "SUDO_GID")}
    env["RUST_LOG"] = "warn"
    config, mountpoint = daemon.state / "agentvfs.toml", daemon.mountpoint
    with open(daemon.log, "wb") as out:
        daemon.process = process = subprocess.Popen(
            [str(BIN), "mount", "--config", str(config), str(mountpoint)], stdout=out, stderr=out, env=env
        )
    deadline = time.monotonic() + 30
    while not (_mounted(mountpoint) and "agentvfs: mounted at" in daemon.log_text() and daemon.agent_socket.exists()):
        if process.poll() is not None:
            pytest.fail(f"agentvfs exited ({process.returncode}) before mounting:\n{daemon.log_text()}")
        if time.monotonic() > deadline:
            stop_daemon(daemon)
            pytest.fail(f"the mount did not appear:\n{daemon.log_text()}")
        time.sleep(0.02)
    return daemon


def stop_daemon(daemon: Daemon) -> None:
    """SIGTERM to the daemon's PID (SIGKILL if it lingers), then makes sure nothing stays
    mounted at its mountpoint."""
    process = daemon.process
    if process is not None and process.poll() is None:
        os.kill(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.kill(process.pid, signal.SIGKILL)
            process.wait()
    if _mounted(daemon.mountpoint):
        subprocess.run(["umount", "-l", str(daemon.mountpoint)], check=False)


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    d = start_daemon(tmp_path / "a")
    try:
        yield d
    finally:
        stop_daemon(d)


@pytest.fixture
def second_daemon(tmp_path: Path) -> Iterator[Daemon]:
    """Another daemon with stricter rules: `/workspace/**` may not be written at all."""
    rules = DEFAULT_RULES + '\n[[rules]]\noperations = ["write"]\npaths = ["/workspace/**"]\nmode = "deny"\nhide = false\n'
    d = start_daemon(tmp_path / "b", rules)
    try:
        yield d
    finally:
        stop_daemon(d)
