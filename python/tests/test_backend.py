"""Every `SandboxBackendProtocol` method of `AgentvfsBackend`, sync and async, against each
route kind (host, memory, sqlite) of a real daemon: results in Deep Agents' types, errors
with agentvfs's texts, bytes round-tripping, and the rules holding for every method."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import Daemon, start_daemon, stop_daemon
from deepagents.backends.protocol import (
    DeleteResult,
    EditResult,
    ExecuteResponse,
    FileDownloadResponse,
    FileUploadResponse,
    GlobResult,
    GrepResult,
    LsResult,
    ReadResult,
    WriteResult,
)

from agentvfs.deepagents import AgentvfsBackend

# One directory per route kind: `/workspace` is the host route, `/memories` the sqlite one,
# and `/scratch` lies on the memory backend that serves `/`.
ROUTES = ["/workspace", "/memories", "/scratch"]

# Every byte value, and more than one upload piece (512 KiB) in all.
BLOB = bytes(range(256)) * 4500

Call = Callable[..., Any]


def _caller(backend: AgentvfsBackend, mode: str) -> tuple[Call, Callable[[], None]]:
    if mode == "sync":
        return (lambda name, *a, **k: getattr(backend, name)(*a, **k)), (lambda: None)
    loop = asyncio.new_event_loop()

    def call(name: str, *a: Any, **k: Any) -> Any:
        return loop.run_until_complete(getattr(backend, "a" + name)(*a, **k))

    return call, loop.close


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("root", ROUTES)
def test_every_method_on_every_route(daemon: Daemon, root: str, mode: str) -> None:
    backend = AgentvfsBackend(str(daemon.agent_socket))
    call, done = _caller(backend, mode)
    try:
        _exercise(call, root)
    finally:
        done()
        backend.close()


def _exercise(call: Call, root: str) -> None:
    d = f"{root}/d"
    a = f"{d}/a.txt"
    assert call("write", a, "one\ntwo\nthree\n") == WriteResult(path=a)

    # read: a window, the rest, the degenerate windows, and the errors.
    whole = call("read", a)
    assert (whole.file_data, whole.start_line, whole.end_line, whole.total_lines, whole.next_offset) == (
        {"content": "one\ntwo\nthree\n", "encoding": "utf-8"},
        1,
        3,
        3,
        None,
    )
    assert call("read", a, offset=1, limit=1) == ReadResult(
        file_data={"content": "two\n", "encoding": "utf-8"}, start_line=2, end_line=2, total_lines=3, next_offset=2
    )
    assert call("read", a, offset=0, limit=0) == ReadResult(
        file_data={"content": "", "encoding": "utf-8"}, no_lines_requested=True
    )
    assert call("read", a, offset=7) == ReadResult(error="Line offset 7 exceeds file length (3 lines)")
    assert call("read", f"{d}/nope.txt") == ReadResult(error=f"File '{d}/nope.txt' not found")
    # As in Deep Agents' FilesystemBackend, a directory is not a file that exists.
    assert call("read", d) == ReadResult(error=f"File '{d}' not found")

    # edit: one replacement, and the errors.
    assert call("edit", a, "two", "TWO") == EditResult(path=a, occurrences=1)
    assert call("edit", a, "absent", "x") == EditResult(error="Error: String not found in file: 'absent'")
    assert call("edit", f"{d}/nope.txt", "a", "b") == EditResult(error=f"Error: File '{d}/nope.txt' not found")

    # ls, glob, grep.
    listed = call("ls", d)
    assert isinstance(listed, LsResult) and listed.error is None
    assert [(e["path"], e["is_dir"], e["size"]) for e in listed.entries] == [(a, False, 14)]
    assert call("ls", f"{d}/nope") == LsResult(error=f"Path '{d}/nope': path_not_found")
    assert call("ls", a) == LsResult(error=f"Path '{a}': not_a_directory")
    assert call("glob", "*.txt", path=root) == GlobResult(matches=[{"path": a, "is_dir": False}])
    assert call("grep", "TWO", path=root) == GrepResult(matches=[{"path": a, "line": 2, "text": "TWO"}])
    assert call("grep", "e", path=root, glob="*.txt", max_count=1) == GrepResult(
        matches=[{"path": a, "line": 1, "text": "one"}], truncated=True
    )

    # Bytes, byte for byte, and a binary file read as base64.
    blob = f"{d}/blob.bin"
    assert call("upload_files", [(blob, BLOB), (f"{d}/empty.bin", b"")]) == [
        FileUploadResponse(path=blob),
        FileUploadResponse(path=f"{d}/empty.bin"),
    ]
    assert call("download_files", [blob, f"{d}/empty.bin", f"{d}/nope.bin", d]) == [
        FileDownloadResponse(path=blob, content=BLOB),
        FileDownloadResponse(path=f"{d}/empty.bin", content=b""),
        FileDownloadResponse(path=f"{d}/nope.bin", error="file_not_found"),
        FileDownloadResponse(path=d, error="is_directory"),
    ]
    png = bytes([0x89]) + b"PNG\r\n\x1a\n" + bytes(range(256))
    assert call("upload_files", [(f"{d}/pic.png", png)]) == [FileUploadResponse(path=f"{d}/pic.png")]
    assert call("read", f"{d}/pic.png") == ReadResult(
        file_data={"content": base64.b64encode(png).decode(), "encoding": "base64"}
    )
    assert call("upload_files", [(d, b"x")]) == [FileUploadResponse(path=d, error="is_directory")]

    # The rules: a denied file is refused by every method, and hidden from the searches.
    secret = f"{root}/.env"
    assert call("write", secret, "K=1") == WriteResult(error=f"Error: permission denied for write on {secret}")
    assert call("upload_files", [(secret, b"K=1")]) == [FileUploadResponse(path=secret, error="permission_denied")]
    assert call("read", secret) == ReadResult(error=f"permission denied for read on {secret}")
    assert call("download_files", [secret]) == [FileDownloadResponse(path=secret, error="permission_denied")]

    # execute sees the same tree at the same paths.
    ran = call("execute", f"cat {a}; ls {root}/d")
    assert ran == ExecuteResponse(output="one\nTWO\nthree\na.txt\nblob.bin\nempty.bin\npic.png\n", exit_code=0)
    assert call("execute", "exit 3", timeout=5) == ExecuteResponse(output="<no output>\n\nExit code: 3", exit_code=3)

    # delete: a file; a directory, recursively, only when no deny rule could match beneath
    # it (`/**/.env` could); a directory with everything in it; and the error.
    assert call("delete", a) == DeleteResult(path=a)
    assert call("read", a) == ReadResult(error=f"File '{a}' not found")
    assert call("delete", d) == DeleteResult(
        error=f"Error: permission denied for write on {d} (matches deny rule(s): /**/.env)"
    )
    assert [e["path"] for e in call("ls", d).entries] == [blob, f"{d}/empty.bin", f"{d}/pic.png"]
    # A missing path might have been a directory with a denied file in it: refused alike.
    assert call("delete", f"{root}/nope").error.startswith(f"Error: permission denied for write on {root}/nope")


def test_delete_without_deny_rules(tmp_path: Path) -> None:
    daemon = start_daemon(tmp_path / "plain", rules="")
    try:
        backend = AgentvfsBackend(str(daemon.agent_socket))
        for root in ROUTES:
            assert backend.upload_files([(f"{root}/d/e/f.bin", b"\x00")]) == [FileUploadResponse(path=f"{root}/d/e/f.bin")]
            assert backend.delete(f"{root}/d") == DeleteResult(path=f"{root}/d")
            assert backend.ls(f"{root}/d") == LsResult(error=f"Path '{root}/d': path_not_found")
            assert backend.delete(f"{root}/d") == DeleteResult(error=f"Error: '{root}/d' not found")
        assert not (daemon.host_root / "d").exists()
    finally:
        stop_daemon(daemon)


def test_uploads_at_once_on_one_backend_never_mix(daemon: Daemon) -> None:
    """Async uploads share the backend's connection: two of one path, in several pieces each,
    both land whole (the later one wins), never as a mix of their pieces."""
    backend = AgentvfsBackend(str(daemon.agent_socket))
    a, b = b"A" * (2 << 20), b"B" * (2 << 20)
    path = "/workspace/same.bin"

    async def both() -> list[list[FileUploadResponse]]:
        return list(await asyncio.gather(backend.aupload_files([(path, a)]), backend.aupload_files([(path, b)])))

    try:
        for _ in range(3):
            assert asyncio.run(both()) == [[FileUploadResponse(path=path)]] * 2
            assert (daemon.host_root / "same.bin").read_bytes() in (a, b)
    finally:
        backend.close()


def test_the_hidden_file_is_absent_for_every_method(daemon: Daemon) -> None:
    (daemon.host_root / ".env").write_text("API_KEY=hidden\n")
    backend = AgentvfsBackend(str(daemon.agent_socket))
    assert [e["path"] for e in backend.ls("/workspace").entries] == [
        "/workspace/guarded/",
        "/workspace/locked/",
    ]
    assert backend.glob(".env", path="/workspace") == GlobResult(matches=[])
    assert backend.grep("API_KEY", path="/workspace") == GrepResult(matches=[])
    # Named outright, it is refused, as Deep Agents' permissions refuse it.
    assert backend.read("/workspace/.env") == ReadResult(error="permission denied for read on /workspace/.env")
    assert backend.download_files(["/workspace/.env"]) == [
        FileDownloadResponse(path="/workspace/.env", error="permission_denied")
    ]
    ran = backend.execute("cat /workspace/.env")
    assert ran.exit_code == 1 and "hidden" not in ran.output and "No such file or directory" in ran.output


def test_write_denied_without_hiding(daemon: Daemon) -> None:
    (daemon.host_root / "locked" / "keep.txt").write_text("kept\n")
    backend = AgentvfsBackend(str(daemon.agent_socket))
    path = "/workspace/locked/keep.txt"
    assert backend.read(path).file_data == {"content": "kept\n", "encoding": "utf-8"}
    assert backend.write(path, "x") == WriteResult(error=f"Error: permission denied for write on {path}")
    assert backend.edit(path, "kept", "x") == EditResult(error=f"Error: permission denied for write on {path}")
    assert backend.delete(path) == DeleteResult(
        error=f"Error: permission denied for write on {path} (matches deny rule(s): /workspace/locked/**)"
    )
    assert backend.upload_files([(path, b"x")]) == [FileUploadResponse(path=path, error="permission_denied")]
    assert backend.execute(f"echo x > {path}") == ExecuteResponse(
        output=f"[stderr] /bin/sh: 1: cannot create {path}: Permission denied\n\nExit code: 2", exit_code=2
    )
    assert (daemon.host_root / "locked" / "keep.txt").read_text() == "kept\n"
