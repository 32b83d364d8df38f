"""Clients for the agentvfs daemon's Unix sockets (JSON-RPC 2.0, one JSON object per line).

`Client` is blocking and thread-safe; `AsyncClient` runs on asyncio's own Unix-socket
streams. Both keep one connection open, because the daemon's read-before-write memory belongs
to the connection (a file read on one connection counts as read for edits on that
connection only), and both let several requests be in flight at once: a reader matches the
daemon's replies to their requests by id, as replies may come out of order (a tool call
waiting for an approval does not hold the others up).

The agent socket serves the agent's methods (tools, path mappings, uploads and downloads);
the control socket also serves the approvers' (`interrupts/*`). Which path is which:
`default_agent_socket()` and `default_control_socket()`.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import socket as socketlib
import tempfile
import threading
from typing import Any

__all__ = [
    "AsyncClient",
    "Client",
    "RpcError",
    "default_agent_socket",
    "default_control_socket",
    "resolve_socket",
]

# The daemon refuses request lines over 1 MiB; asyncio's reader must accept replies of any
# size (a download is one line), so its limit is raised well past what the daemon sends.
_READ_LIMIT = 1 << 30


class RpcError(Exception):
    """A JSON-RPC error from the daemon (`code` is the JSON-RPC code, e.g. -32001)."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(f"{message} (JSON-RPC error {code})")
        self.code = code
        self.message = message
        self.data = data


def default_control_socket() -> str:
    """The daemon's default control socket: `/run/agentvfs/agentvfs.sock` for root, else
    `agentvfs.sock` in `$XDG_RUNTIME_DIR` (or the temp directory)."""
    if os.geteuid() == 0:
        return "/run/agentvfs/agentvfs.sock"
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    base = runtime if os.path.isabs(runtime) else tempfile.gettempdir()
    return os.path.join(base, "agentvfs.sock")


def default_agent_socket() -> str:
    """The daemon's default agent socket: beside the control socket, `-agent` added."""
    control = default_control_socket()
    stem = os.path.splitext(os.path.basename(control))[0]
    return os.path.join(os.path.dirname(control), f"{stem}-agent.sock")


def resolve_socket(socket: str | os.PathLike[str] | None) -> str:
    """The agent socket to use: the argument, else `$AGENTVFS_SOCKET`, else the default."""
    if socket is not None:
        return os.fspath(socket)
    return os.environ.get("AGENTVFS_SOCKET") or default_agent_socket()


def _request_line(request_id: int, method: str, params: dict[str, Any] | None) -> bytes:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params is not None:
        message["params"] = params
    return (json.dumps(message, separators=(",", ":")) + "\n").encode()


def _outcome(reply: dict[str, Any]) -> Any:
    if "error" in reply:
        err = reply["error"]
        raise RpcError(int(err.get("code", 0)), str(err.get("message", "")), err.get("data"))
    return reply.get("result")


class Client:
    """A blocking client on one connection; safe to share between threads."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._sock: socketlib.socket | None = None
        self._lock = threading.Lock()  # guards the connection, sending and `_waiting`
        self._ids = itertools.count(1)
        self._waiting: dict[int, tuple[threading.Event, list[Any]]] = {}
        self._reader: threading.Thread | None = None
        self._broken: Exception | None = None

    def _connect(self) -> socketlib.socket:
        if self._sock is None:
            sock = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM)
            sock.connect(self.path)
            self._sock, self._broken = sock, None
            self._reader = threading.Thread(target=self._read_replies, args=(sock,), daemon=True, name="agentvfs-client")
            self._reader.start()
        return self._sock

    def _read_replies(self, sock: socketlib.socket) -> None:
        buffer = b""
        error: Exception = ConnectionError(f"the daemon closed the connection on {self.path}")
        try:
            while True:
                chunk = sock.recv(1 << 20)
                if not chunk:
                    break
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip():
                        self._deliver(json.loads(line))
        except OSError as e:
            error = e
        with self._lock:
            if self._sock is sock:
                self._sock = None
            self._broken = error
            waiting, self._waiting = self._waiting, {}
        for event, slot in waiting.values():
            slot.append({"__broken__": error})
            event.set()

    def _deliver(self, reply: dict[str, Any]) -> None:
        if "id" not in reply or "method" in reply:
            return  # a notification: this client subscribes to none
        with self._lock:
            waiter = self._waiting.pop(reply["id"], None) if isinstance(reply["id"], int) else None
        if waiter is not None:
            waiter[1].append(reply)
            waiter[0].set()

    def call(self, method: str, params: dict[str, Any] | None = None, timeout: float | None = None) -> Any:
        """Sends one request and waits for its result (raises `RpcError` for an error)."""
        event, slot = threading.Event(), []
        with self._lock:
            sock = self._connect()
            request_id = next(self._ids)
            self._waiting[request_id] = (event, slot)
            try:
                sock.sendall(_request_line(request_id, method, params))
            except OSError:
                self._waiting.pop(request_id, None)
                raise
        if not event.wait(timeout):
            with self._lock:
                self._waiting.pop(request_id, None)
            raise TimeoutError(f"no reply to {method} from {self.path} within {timeout}s")
        reply = slot[0]
        if "__broken__" in reply:
            raise ConnectionError(f"lost the connection to {self.path}: {reply['__broken__']}")
        return _outcome(reply)

    def close(self) -> None:
        with self._lock:
            sock, self._sock = self._sock, None
        if sock is not None:
            try:
                sock.shutdown(socketlib.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncClient:
    """An asyncio client on one connection (`asyncio.open_unix_connection`), for one event
    loop; concurrent calls share the connection."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._connecting = asyncio.Lock()
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}

    async def _connect(self) -> asyncio.StreamWriter:
        async with self._connecting:
            if self._writer is None or self._writer.is_closing():
                reader, writer = await asyncio.open_unix_connection(self.path, limit=_READ_LIMIT)
                self._writer = writer
                self._reader_task = asyncio.get_running_loop().create_task(self._read_replies(reader, writer))
            return self._writer

    async def _read_replies(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        error: BaseException = ConnectionError(f"the daemon closed the connection on {self.path}")
        try:
            while True:
                line = await reader.readline()
                if not line:
                    break
                if not line.strip():
                    continue
                reply = json.loads(line)
                if "id" not in reply or "method" in reply:
                    continue
                future = self._waiting.pop(reply["id"], None) if isinstance(reply["id"], int) else None
                if future is not None and not future.done():
                    future.set_result(reply)
        except (OSError, ValueError) as e:
            error = e
        finally:
            if self._writer is writer:
                self._writer = None
            waiting, self._waiting = self._waiting, {}
            for future in waiting.values():
                if not future.done():
                    future.set_exception(ConnectionError(f"lost the connection to {self.path}: {error}"))

    async def call(self, method: str, params: dict[str, Any] | None = None, timeout: float | None = None) -> Any:
        """Sends one request and awaits its result (raises `RpcError` for an error)."""
        writer = await self._connect()
        request_id = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = future
        try:
            writer.write(_request_line(request_id, method, params))
            await writer.drain()
            reply = await asyncio.wait_for(future, timeout)
        finally:
            self._waiting.pop(request_id, None)
        return _outcome(reply)

    async def aclose(self) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()
            try:
                await writer.wait_closed()
            except OSError:
                pass
        if self._reader_task is not None:
            self._reader_task.cancel()
            self._reader_task = None
