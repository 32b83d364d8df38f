"""The clients' and the backend's handling of the connection itself: requests the daemon could
not read are refused before they are sent (and become the backend's error results), an error
reply naming no request fails the calls waiting on it, a call given up on withdraws its
approval, the connections of closed event loops are closed, `close()` leaves the next call
alone, and calls past the daemon's 256 in flight wait their turn."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Daemon
from deepagents.backends.protocol import (
    EditResult,
    ExecuteResponse,
    FileDownloadResponse,
    FileUploadResponse,
    LsResult,
    ReadResult,
    WriteResult,
)

from agentvfs.client import MAX_LINE, AsyncClient, Client, RequestError, RpcError, _request_line
from agentvfs.deepagents import AgentvfsBackend

# Every test that could hang without its fix bounds its calls by this instead.
BOUND = 20.0
BIG = "x" * MAX_LINE
SURROGATE = "it holds '\\udcff', which is not valid UTF-8 (a lone surrogate, as os.fsdecode makes of a name that is not UTF-8)"


def _pending(daemon: Daemon) -> list[dict[str, Any]]:
    with Client(daemon.control_socket) as control:
        return control.call("interrupts/list", timeout=BOUND)["interrupts"]


def _until(condition: Callable[[], bool], what: str, seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def _size(error: str | None) -> int:
    assert error is not None
    return int(error.split("it is ", 1)[1].split(" bytes", 1)[0])


def _run(mode: str, backend: AgentvfsBackend, name: str, *args: Any) -> Any:
    if mode == "sync":
        return getattr(backend, name)(*args)
    return asyncio.run(getattr(backend, "a" + name)(*args))


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_content_over_the_line_limit_goes_up_in_pieces_with_its_call(daemon: Daemon, mode: str) -> None:
    """`write` and `edit` of content larger than one request line stage it first (Deep Agents
    offloads a large tool result with `write`, and appends a summarized conversation with
    `edit`); other calls that long are not sent, and are their error result."""
    backend = AgentvfsBackend(str(daemon.agent_socket), timeout=BOUND)
    path = "/workspace/big.txt"
    big = "".join(f"line {i:07d}\n" for i in range(250_000))  # 3 MB
    assert _run(mode, backend, "write", path, big) == WriteResult(path=path)
    assert (daemon.host_root / "big.txt").read_text() == big
    # Read, then edited on one connection (an event loop's own, in async mode).
    if mode == "sync":
        assert backend.read(path, 0, 1).error is None
        edited = backend.edit(path, big, big + "appended\n")
    else:

        async def read_then_edit() -> EditResult:
            assert (await backend.aread(path, 0, 1)).error is None
            return await backend.aedit(path, big, big + "appended\n")

        edited = asyncio.run(read_then_edit())
    assert edited == EditResult(path=path, occurrences=1)
    assert (daemon.host_root / "big.txt").read_text() == big + "appended\n"
    # The rules hold for staged content as for any.
    denied = _run(mode, backend, "write", "/workspace/.env", big)
    assert denied == WriteResult(error="Error: permission denied for write on /workspace/.env")
    ran = _run(mode, backend, "execute", "echo " + BIG)
    assert isinstance(ran, ExecuteResponse) and ran.exit_code is None
    assert ran.output.startswith("Error: execute request not sent: it is ")
    written = _run(mode, backend, "write", "/workspace/" + BIG, "x")
    assert written.error is not None and written.error.startswith("Error: write_file request not sent: it is ")


def test_the_line_limit_is_the_daemons(daemon: Daemon) -> None:
    def params(pad: int) -> dict[str, Any]:
        return {"name": "write_file", "arguments": {"file_path": "/workspace/edge.txt", "content": "x" * pad}}

    # A fresh client's first request has id 1: the content that makes its line 1 MiB.
    pad = MAX_LINE - (len(_request_line(1, "tools/call", params(0))) - 1)
    with Client(daemon.agent_socket) as client:
        result = client.call("tools/call", params(pad), timeout=BOUND)
        assert not result["isError"], result
    assert len((daemon.host_root / "edge.txt").read_text()) == pad
    with Client(daemon.agent_socket) as client:
        with pytest.raises(RequestError) as refused:
            client.call("tools/call", params(pad + 1), timeout=BOUND)
        assert refused.value.size == MAX_LINE + 1
        assert str(refused.value) == (
            f"request not sent: it is {MAX_LINE + 1} bytes, over the daemon's limit of 1048576 bytes (1 MiB) for one request"
        )


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_string_that_is_not_utf8_is_an_error_result(daemon: Daemon, mode: str) -> None:
    backend = AgentvfsBackend(str(daemon.agent_socket), timeout=BOUND)
    bad = os.fsdecode(b"/workspace/bad-\xff.txt")
    assert bad == "/workspace/bad-\udcff.txt"
    unsent = "request not sent: " + SURROGATE
    assert _run(mode, backend, "write", bad, "x") == WriteResult(error=f"Error: write_file {unsent}")
    assert _run(mode, backend, "write", "/workspace/ok.txt", "\udcff") == WriteResult(error=f"Error: write_file {unsent}")
    assert _run(mode, backend, "read", bad) == ReadResult(error=f"read_file {unsent}")
    assert _run(mode, backend, "ls", bad) == LsResult(error=f"ls {unsent}")
    assert _run(mode, backend, "edit", bad, "a", "b") == EditResult(error=f"Error: edit_file {unsent}")
    assert _run(mode, backend, "upload_files", [(bad, b"x"), ("/workspace/ok.txt", b"ok")]) == [
        FileUploadResponse(path=bad, error="invalid_path"),
        FileUploadResponse(path="/workspace/ok.txt"),
    ]
    assert _run(mode, backend, "download_files", [bad, "/workspace/ok.txt"]) == [
        FileDownloadResponse(path=bad, error="invalid_path"),
        FileDownloadResponse(path="/workspace/ok.txt", content=b"ok"),
    ]
    # Text that is UTF-8 goes as it is.
    assert _run(mode, backend, "write", "/workspace/ünï.txt", "ü\U0001f600\n") == WriteResult(path="/workspace/ünï.txt")
    assert (daemon.host_root / "ünï.txt").read_text() == "ü\U0001f600\n"


UNADDRESSED = b'{"error":{"code":-32700,"message":"parse error: invalid unicode code point"},"id":null,"jsonrpc":"2.0"}\n'


class _Unaddressed:
    """A server that answers once `calls` requests have come with one error naming no
    request (as the daemon answers a line it cannot read), then keeps the connection open."""

    def __init__(self, path: Path, calls: int) -> None:
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        self.listener.listen()
        self.calls = calls
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        with conn:
            received = b""
            while received.count(b"\n") < self.calls:
                received += conn.recv(1 << 16)
            conn.sendall(UNADDRESSED)
            while conn.recv(1 << 16):
                pass

    def close(self) -> None:
        self.listener.close()
        self.thread.join(BOUND)


@pytest.fixture
def unaddressed(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    path = tmp_path / "fake.sock"
    server = _Unaddressed(path, 2)
    try:
        yield path, 2
    finally:
        server.close()


def test_an_error_naming_no_request_fails_the_waiting_calls(unaddressed: tuple[Path, int]) -> None:
    path, calls = unaddressed
    client = Client(path)
    errors: list[BaseException] = []

    def call() -> None:
        try:
            client.call("ping", timeout=BOUND)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=call) for _ in range(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(BOUND + 5)
    client.close()
    assert len(errors) == calls
    for e in errors:
        assert isinstance(e, RpcError) and e.code == -32700, repr(e)
        assert e.message.startswith("parse error: invalid unicode code point (an error reply from ")


def test_an_error_naming_no_request_fails_the_waiting_async_calls(unaddressed: tuple[Path, int]) -> None:
    path, calls = unaddressed

    async def run() -> list[BaseException]:
        client = AsyncClient(path)
        outcomes = await asyncio.gather(*(client.call("ping", timeout=BOUND) for _ in range(calls)), return_exceptions=True)
        await client.aclose()
        return outcomes

    for e in asyncio.run(run()):
        assert isinstance(e, RpcError) and e.code == -32700, repr(e)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _connections(daemon: Daemon) -> int:
    with Client(daemon.control_socket) as control:
        return control.call("vfs/status", timeout=BOUND)["counters"]["connections_open"]


def test_the_connections_of_closed_event_loops_are_closed(daemon: Daemon) -> None:
    backend = AgentvfsBackend(str(daemon.agent_socket), timeout=BOUND)
    assert asyncio.run(backend.als("/workspace")).error is None
    before = _open_fds()
    for _ in range(300):
        assert asyncio.run(backend.als("/workspace")).error is None
    for _ in range(100):  # loops closed without asyncio.run, whose tasks are left pending
        loop = asyncio.new_event_loop()
        assert loop.run_until_complete(backend.als("/workspace")).error is None
        loop.close()
    assert _open_fds() - before < 10
    assert _connections(daemon) < 10
    backend.close()
    assert _connections(daemon) <= 2  # this probe's own


def _write_call(path: str) -> dict[str, Any]:
    return {"name": "write_file", "arguments": {"file_path": path, "content": "late\n"}}


def _ticket_of(daemon: Daemon, path: str) -> int:
    found: list[int] = []

    def appeared() -> bool:
        found.extend(t["id"] for t in _pending(daemon) if t["path"] == path)
        return bool(found)

    _until(appeared, f"no approval appeared for {path}")
    return found[0]


def _withdrawn(daemon: Daemon, interrupt_id: int, file: Path) -> None:
    _until(lambda: _pending(daemon) == [], "the abandoned call's approval is still pending")
    with Client(daemon.control_socket) as control:
        with pytest.raises(RpcError) as gone:
            control.call("interrupts/resolve", {"id": interrupt_id, "decision": "approve"}, timeout=BOUND)
    assert "no longer pending" in gone.value.message
    time.sleep(0.3)
    assert not file.exists()


def test_a_call_out_of_time_withdraws_its_approval(daemon: Daemon) -> None:
    plan = "/workspace/guarded/plan.md"
    backend = AgentvfsBackend(str(daemon.agent_socket), timeout=1.5)
    found: list[int] = []
    watcher = threading.Thread(target=lambda: found.append(_ticket_of(daemon, plan)))
    watcher.start()
    late = backend.write(plan, "late\n")
    assert late.error is not None and late.error.startswith(f"Error: write_file failed: no reply to tools/call from {daemon.agent_socket}")
    watcher.join(BOUND)
    _withdrawn(daemon, found[0], daemon.host_root / "guarded" / "plan.md")
    # The backend goes on, on a new connection.
    assert backend.write("/workspace/after.txt", "x") == WriteResult(path="/workspace/after.txt")


def test_the_other_calls_on_an_abandoned_connection_fail(daemon: Daemon) -> None:
    client = Client(daemon.agent_socket)
    outcome: list[BaseException] = []

    def wait_for_a() -> None:
        try:
            client.call("tools/call", _write_call("/workspace/guarded/a.md"))
        except BaseException as e:  # noqa: BLE001
            outcome.append(e)

    waiter = threading.Thread(target=wait_for_a)
    waiter.start()
    a = _ticket_of(daemon, "/workspace/guarded/a.md")
    with pytest.raises(TimeoutError):
        client.call("tools/call", _write_call("/workspace/guarded/b.md"), timeout=1)
    waiter.join(BOUND)
    assert not waiter.is_alive()
    assert isinstance(outcome[0], ConnectionError) and "was closed: a tools/call call on it got no reply" in str(outcome[0])
    _withdrawn(daemon, a, daemon.host_root / "guarded" / "a.md")
    assert not (daemon.host_root / "guarded" / "b.md").exists()
    client.close()


@pytest.mark.parametrize("how", ["wait_for", "cancel"])
def test_an_async_call_given_up_on_withdraws_its_approval(daemon: Daemon, how: str) -> None:
    plan = "/workspace/guarded/plan.md"
    backend = AgentvfsBackend(str(daemon.agent_socket))

    async def run() -> None:
        if how == "wait_for":
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(backend.awrite(plan, "late\n"), 1.5)
        else:
            task = asyncio.get_running_loop().create_task(backend.awrite(plan, "late\n"))
            await asyncio.to_thread(_ticket_of, daemon, plan)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        # The approval is withdrawn while the loop still runs, and the backend goes on.
        await asyncio.to_thread(_until, lambda: _pending(daemon) == [], "the cancelled call's approval is still pending")
        assert await backend.awrite("/workspace/after.txt", "x") == WriteResult(path="/workspace/after.txt")

    asyncio.run(run())
    time.sleep(0.3)
    assert not (daemon.host_root / "guarded" / "plan.md").exists()


def test_close_then_call_uses_a_new_connection(daemon: Daemon) -> None:
    backend = AgentvfsBackend(str(daemon.agent_socket), timeout=BOUND)
    for _ in range(300):
        backend.close()
        assert backend.ls("/workspace").error is None
    backend.close()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_calls_past_the_daemons_limit_wait_their_turn(daemon: Daemon, mode: str) -> None:
    # Each call waits for an approval, so all of them would be in flight at once.
    count = 300
    backend = AgentvfsBackend(str(daemon.agent_socket), timeout=60)
    paths = [f"/workspace/guarded/{i}.md" for i in range(count)]
    stop = threading.Event()

    def approve() -> None:
        # Only once the daemon's limit of calls wait: a call past it meets that limit at once.
        _until(lambda: len(_pending(daemon)) >= 256 or stop.is_set(), "fewer than 256 calls are waiting", 30)
        with Client(daemon.control_socket) as control:
            while not stop.is_set():
                for ticket in control.call("interrupts/list", timeout=BOUND)["interrupts"]:
                    control.call("interrupts/resolve", {"id": ticket["id"], "decision": "approve"}, timeout=BOUND)
                time.sleep(0.02)

    approver = threading.Thread(target=approve)
    approver.start()
    try:
        if mode == "async":

            async def run() -> list[Any]:
                return await asyncio.gather(*(backend.awrite(p, "ok\n") for p in paths))

            results = asyncio.run(run())
        else:
            results = [None] * count

            def write(i: int) -> None:
                results[i] = backend.write(paths[i], "ok\n")

            threads = [threading.Thread(target=write, args=(i,)) for i in range(count)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(90)
    finally:
        stop.set()
        approver.join(BOUND)
        backend.close()
    assert results == [WriteResult(path=p) for p in paths]
    assert len(list((daemon.host_root / "guarded").iterdir())) == count


def test_a_call_interrupted_while_it_is_sent_leaves_no_half_line(daemon: Daemon) -> None:
    """A call interrupted in the middle of sending its line (Ctrl-C) closes the connection:
    the next request would otherwise be read as the tail of the half-sent one."""
    client = Client(str(daemon.agent_socket))
    client.call("ping")
    conn = client._connection()
    real = conn.sock

    class Interrupted:
        def sendall(self, data: bytes) -> None:
            real.send(data[: len(data) // 2])
            raise KeyboardInterrupt

        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

    conn.sock = Interrupted()  # type: ignore[assignment]
    with pytest.raises(KeyboardInterrupt):
        client.call("tools/list")
    conn.sock = real
    assert client.call("ping") == {}
    client.close()
