"""The postgres route's `layout = "langgraph"` with the real packages: Deep Agents'
`StoreBackend` on LangGraph's `PostgresStore` (langgraph-checkpoint-postgres) and an agentvfs
mount see the same files, both ways, with exact content, text and binary; so does a real
`create_deep_agent` graph whose `/memories/` is that StoreBackend.

A private PostgreSQL server (its own data directory, port and socket directory, run as the
`postgres` user, as the Rust tests' `src/backend/postgres/testing.rs` does) serves the module;
a finalizer stops it and removes its files.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

# scripts/setup.sh installs these; a missing one fails the run rather than skipping it.
import psycopg
import pytest
from conftest import Daemon, start_daemon, stop_daemon
from deepagents import create_deep_agent
from deepagents.backends import CompositeBackend, StateBackend, StoreBackend
from langchain_core.messages import ToolMessage
from langgraph.store.postgres import PostgresStore
from scripted import answer, scripted, tool_call


def namespace_of(test: str) -> tuple[str, ...]:
    """A test's own StoreBackend namespace; LangGraph stores it as the prefix "alice.<test>",
    which is what the route's `namespace` says."""
    return ("alice", test.removeprefix("test_")[:40])


def _bin_dir() -> Path:
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"), key=lambda p: int(p.parts[-3]))
    if not versions:
        pytest.fail("PostgreSQL is not installed: run scripts/setup.sh")
    return versions[-1].parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A private server: `conninfo` for psycopg, `url` for agentvfs."""

    def __init__(self) -> None:
        self.bin = _bin_dir()
        self.user = "postgres" if _has_user("postgres") else "nobody"
        self.dir = Path(tempfile.mkdtemp(prefix="agentvfs-pytest-pg-"))
        pw = pwd.getpwnam(self.user)
        os.chown(self.dir, pw.pw_uid, pw.pw_gid)
        self.port = _free_port()
        self.data = self.dir / "data"

    def run(self, *args: str) -> None:
        out = subprocess.run(
            ["setpriv", "--reuid", self.user, "--regid", self.user, "--init-groups", "--", str(self.bin / args[0]), *args[1:]],
            cwd=self.dir,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
        )
        if out.returncode != 0:
            raise RuntimeError(f"{args[0]} failed: {out.stdout}{out.stderr}")

    def start(self) -> None:
        self.run("initdb", "-D", str(self.data), "-U", "postgres", "--auth-local=trust", "--no-sync", "-E", "UTF8", "--locale=C")
        options = f"-p {self.port} -k {self.dir} -c listen_addresses='' -c fsync=off"
        self.run("pg_ctl", "-D", str(self.data), "-l", str(self.dir / "server.log"), "-w", "-t", "60", "-o", options, "start")

    def stop(self) -> None:
        try:
            self.run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        except RuntimeError:
            pass  # never started, or already gone
        shutil.rmtree(self.dir, ignore_errors=True)

    @property
    def conninfo(self) -> str:
        return f"host={self.dir} port={self.port} user=postgres dbname=postgres"

    @property
    def url(self) -> str:
        return f"postgresql://postgres@{str(self.dir).replace('/', '%2F')}:{self.port}/postgres"


def _has_user(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    s = Server()
    try:
        s.start()
        yield s
    finally:
        s.stop()


@dataclass
class Both:
    """A daemon whose `/memories-lg` is the langgraph layout on the test's prefix, and a
    StoreBackend on the same rows."""

    daemon: Daemon
    root: Path
    store: PostgresStore
    namespace: tuple[str, ...]
    backend: StoreBackend


@pytest.fixture
def both(tmp_path: Path, server: Server, request: pytest.FixtureRequest) -> Iterator[Both]:
    namespace = namespace_of(request.node.name)
    route = f"""
[[routes]]
path = "/memories-lg"
backend = "postgres"
url = "{server.url}"
layout = "langgraph"
namespace = "{'.'.join(namespace)}"
"""
    d = start_daemon(tmp_path / "lg", execute=False, routes=route)
    try:
        # The daemon is up first: it made LangGraph's table, so setup() must have nothing to do.
        with PostgresStore.from_conn_string(server.conninfo) as store:
            store.setup()
            backend = StoreBackend(store=store, namespace=lambda _rt: namespace)
            yield Both(d, d.mountpoint / "memories-lg", store, namespace, backend)
    finally:
        stop_daemon(d)


def _versions(server: Server) -> list[int]:
    with psycopg.connect(server.conninfo) as conn:
        return [r[0] for r in conn.execute("SELECT v FROM store_migrations ORDER BY v")]


def _eventually(what: str, check, limit: float = 2.0) -> None:
    deadline = time.monotonic() + limit
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"not seen in time: {what}")
        time.sleep(0.01)


def _sh(cwd: Path, script: str) -> str:
    out = subprocess.run(["sh", "-c", script], cwd=cwd, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_the_daemon_creates_the_store_table_as_langgraph_would(server: Server, both: Both) -> None:
    # LangGraph's migrations 0-3 are recorded, and setup() added none.
    assert _versions(server) == list(range(len(PostgresStore.MIGRATIONS)))
    with psycopg.connect(server.conninfo) as conn:
        indexes = {r[0] for r in conn.execute("SELECT indexname FROM pg_indexes WHERE tablename = 'store'")}
    assert {"store_pkey", "store_prefix_idx", "idx_store_expires_at"} <= indexes


def test_a_store_backend_write_is_read_in_the_mount(both: Both) -> None:
    root, backend = both.root, both.backend
    assert not (root / "notes.md").exists()  # the kernel caches the absence
    assert backend.write("/notes.md", "hello\nworld\n").error is None
    assert backend.write("/projects/a/plan.md", "step 1\n").error is None
    _eventually("the new file", lambda: (root / "notes.md").exists())
    assert _sh(root, "cat notes.md") == "hello\nworld\n"
    with open(root / "projects" / "a" / "plan.md") as f:
        assert f.read() == "step 1\n"
    assert sorted(os.listdir(root)) == ["notes.md", "projects"]
    # An edit by the agent replaces what the kernel cached.
    assert backend.edit("/notes.md", "world", "there").error is None
    _eventually("the edit", lambda: (root / "notes.md").read_text() == "hello\nthere\n")
    # Binary uploads are base64 in the store and bytes in the mount.
    payload = bytes(range(256)) + b"\x00\xff"
    assert backend.upload_files([("/img.bin", payload)])[0].error is None
    _eventually("the upload", lambda: (root / "img.bin").exists())
    assert (root / "img.bin").read_bytes() == payload
    # A deletion by the agent takes the file out of the mount.
    assert backend.delete("/projects").error is None
    _eventually("the deletion", lambda: not (root / "projects").exists())


def test_a_file_written_through_the_mount_is_read_by_the_store_backend(both: Both) -> None:
    root, backend = both.root, both.backend
    _sh(root, "mkdir -p shell/deep && printf 'from the shell\\n' > shell/deep/log.txt")
    with open(root / "mounted.md", "w") as f:
        f.write("line one\n")
        f.write("line two\n")
    (root / "raw.bin").write_bytes(b"\x89PNG\r\n\x1a\n\x00\xfe")
    read = backend.read("/mounted.md")
    assert read.error is None and read.file_data["content"] == "line one\nline two\n"
    assert backend.read("/shell/deep/log.txt").file_data["content"] == "from the shell\n"
    [down] = backend.download_files(["/raw.bin"])
    assert down.error is None and down.content == b"\x89PNG\r\n\x1a\n\x00\xfe"
    item = both.store.get(both.namespace, "/raw.bin")
    assert item.value["encoding"] == "base64"
    listing = {e["path"]: e["is_dir"] for e in backend.ls("/").entries}
    assert listing == {"/mounted.md": False, "/raw.bin": False, "/shell/": True}
    # A rename in the mount is a rename for the agent, and the agent can edit the result.
    os.rename(root / "mounted.md", root / "shell" / "moved.md")
    assert backend.read("/mounted.md").error is not None
    assert backend.edit("/shell/moved.md", "two", "2").error is None
    _eventually("the agent's edit", lambda: (root / "shell" / "moved.md").read_text() == "line one\nline 2\n")


def test_a_deep_agent_with_store_memories_shares_them_with_the_mount(both: Both) -> None:
    """The setup the layout is for: a real `create_deep_agent` graph whose `/memories/` is a
    StoreBackend (through CompositeBackend, which strips the route) on the PostgresStore."""
    (both.root / "from-shell.md").write_text("written in the mount\n")
    steps = [
        ("read_file", {"file_path": "/memories/from-shell.md"}),
        ("write_file", {"file_path": "/memories/agent/notes.md", "content": "the agent's memory\n"}),
        ("edit_file", {"file_path": "/memories/from-shell.md", "old_string": "mount", "new_string": "mount, edited"}),
    ]
    model = scripted(*[tool_call(n, a, f"call_{i}") for i, (n, a) in enumerate(steps)], answer("Done."))
    backend = CompositeBackend(
        default=StateBackend(), routes={"/memories/": StoreBackend(namespace=lambda _rt: both.namespace)}
    )
    agent = create_deep_agent(model=model, backend=backend, store=both.store)
    result = agent.invoke({"messages": [{"role": "user", "content": "Remember."}]})
    shown = [m.content for m in result["messages"] if isinstance(m, ToolMessage)]
    assert "written in the mount" in shown[0], shown
    assert shown[1:] == [
        "Updated file /memories/agent/notes.md",
        "Successfully replaced 1 instance(s) of the string in '/memories/from-shell.md'",
    ]
    # StoreBackend's keys are the paths below its route, with the leading slash.
    assert sorted(i.key for i in both.store.search(both.namespace)) == ["/agent/notes.md", "/from-shell.md"]
    _eventually("the agent's write", lambda: (both.root / "agent" / "notes.md").exists())
    assert _sh(both.root, "cat agent/notes.md") == "the agent's memory\n"
    _eventually("the agent's edit", lambda: (both.root / "from-shell.md").read_text() == "written in the mount, edited\n")
