"""Clients for the agentvfs daemon's Unix sockets (JSON-RPC 2.0, one JSON object per line).

`Client` is blocking and thread-safe; `AsyncClient` runs on asyncio's socket operations in the
event loop (no threads). Both keep one connection open, because the daemon's read-before-write
memory belongs to the connection (a file read on one connection counts as read for edits on
that connection only), and both let several requests be in flight at once: a reader matches
the daemon's replies to their requests by id, as replies may come out of order (a tool call
waiting for an approval does not hold the others up).

What the clients guard against:

- A request the daemon could not read is refused before it is sent, with `RequestError`: a
  line over the daemon's limit (`MAX_LINE`, 1 MiB), or a string that is not valid UTF-8 (a
  lone surrogate, as `os.fsdecode` makes of a name that is not UTF-8). The daemon would
  answer those with an error that names no request.
- At most `MAX_IN_FLIGHT` (256, the daemon's limit) requests are in flight on a connection;
  more wait their turn instead of being refused.
- A call given up on before its reply (its `timeout` expires, its task is cancelled, its
  thread is interrupted) closes its connection: only a disconnect makes the daemon withdraw
  a call waiting for an approval, which would otherwise still run once approved. The other
  calls in flight on that connection fail with `ConnectionError`; the next call opens a new
  connection. So does a call whose line could not be sent because its connection had ended
  unseen (the daemon restarted): it is sent once more, on a new connection.
- An error reply that names no request fails every call waiting on the connection with
  `RpcError` and closes it, rather than leaving one waiting forever.
- A socket that cannot be reached raises `ConnectionError` naming it (not `connect`'s bare
  `OSError`), and a call out of time `TimeoutError` naming its method and socket (the async
  client's too, rather than asyncio's empty one).

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
import time
from typing import Any

__all__ = [
    "MAX_IN_FLIGHT",
    "MAX_LINE",
    "AsyncClient",
    "Client",
    "RequestError",
    "RpcError",
    "default_agent_socket",
    "default_control_socket",
    "resolve_socket",
]

MAX_LINE = 1 << 20
"""The daemon's limit on a request line, in bytes without its newline (replies have none)."""

MAX_IN_FLIGHT = 256
"""The daemon's limit on requests in flight on one connection."""

# The daemon's code for a request turned away as one too many in flight (also for a
# connection past its connection limit, which is answered with no id and closed).
_OVERLOADED = -32002
# The daemon counts a request done just after writing its reply, so a request sent as soon as
# a reply arrives can still meet the limit; it did not run, and is sent again after this pause.
_RETRY_PAUSE = 0.01


class RpcError(Exception):
    """A JSON-RPC error from the daemon (`code` is the JSON-RPC code, e.g. -32001)."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(f"{message} (JSON-RPC error {code})")
        self.code = code
        self.message = message
        self.data = data


class RequestError(ValueError):
    """A request the client refused to send because the daemon could not read it: its line
    is over `MAX_LINE` bytes (`size` is its length), or it holds a string that is not valid
    UTF-8 (`size` is `None`)."""

    def __init__(self, message: str, size: int | None = None) -> None:
        super().__init__(message)
        self.size = size


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
    """The request's line, newline included, in UTF-8; `RequestError` for one the daemon
    could not read."""
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params is not None:
        message["params"] = params
    text = json.dumps(message, ensure_ascii=False, separators=(",", ":"))
    try:
        line = text.encode("utf-8")
    except UnicodeEncodeError as e:
        msg = (
            f"request not sent: it holds {e.object[e.start]!r}, which is not valid UTF-8 (a lone surrogate,"
            " as os.fsdecode makes of a name that is not UTF-8)"
        )
        raise RequestError(msg) from None
    if len(line) > MAX_LINE:
        msg = f"request not sent: it is {len(line)} bytes, over the daemon's limit of {MAX_LINE} bytes (1 MiB) for one request"
        raise RequestError(msg, len(line))
    return line + b"\n"


def _outcome(reply: dict[str, Any]) -> Any:
    if "error" in reply:
        err = reply["error"]
        raise RpcError(int(err.get("code", 0)), str(err.get("message", "")), err.get("data"))
    return reply.get("result")


def _overloaded(reply: dict[str, Any]) -> bool:
    error = reply.get("error")
    return isinstance(error, dict) and error.get("code") == _OVERLOADED


def _addressee(reply: Any, path: str) -> int | RpcError | None:
    """Whom a message from the daemon is for: the id of the request it answers; an `RpcError`
    for every call waiting on the connection when it is an error naming no request (the daemon
    could not read one, or refused this peer); `None` for anything else (a notification: this
    client subscribes to none)."""
    if not isinstance(reply, dict) or "id" not in reply or "method" in reply:
        return None
    if reply["id"] is None and "error" in reply:
        return _unaddressed(reply, path)
    return reply["id"] if isinstance(reply["id"], int) else None


def _unaddressed(reply: dict[str, Any], path: str) -> RpcError:
    """The error for the calls waiting on a connection that got an error reply naming no
    request."""
    err = reply["error"]
    message = (
        f"{err.get('message', '')} (an error reply from {path} that names no request: every call waiting on the"
        " connection fails, and the connection is closed)"
    )
    return RpcError(int(err.get("code", 0)), message, err.get("data"))


def _raised(error: BaseException) -> BaseException:
    """A fresh exception for one of the calls a connection's end fails (they may raise it on
    several threads at once)."""
    if isinstance(error, RpcError):
        return RpcError(error.code, error.message, error.data)
    return ConnectionError(str(error))


def _unreachable(path: str, error: OSError) -> ConnectionError:
    """The error for a connection the daemon's socket refused (absent, not listening, not
    allowed), naming the socket."""
    why = error.strerror or str(error)
    return ConnectionError(f"cannot connect to the agentvfs socket {path}: {why} (is the daemon running, and is this its socket?)")


def _late(method: str, path: str, timeout: float | None) -> str:
    return (
        f"no reply to {method} from {path} within {timeout}s; the call was abandoned and its connection closed"
        " (the daemon withdraws it if it waits for an approval)"
    )


def _lines(buffer: bytearray, chunk: bytes) -> list[bytes]:
    """Adds `chunk` to `buffer` (which holds no whole line) and takes the whole lines out of
    it, blank ones left out."""
    start = len(buffer)
    buffer += chunk
    end = buffer.rfind(b"\n", start)
    if end < 0:
        return []
    lines = [line for line in bytes(buffer[:end]).split(b"\n") if line.strip()]
    del buffer[: end + 1]
    return lines


def _left(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


class _Connection:
    """One connection of a `Client`: its socket, the calls waiting on it (request id → the
    event to set and the slot for the reply or the error) and its turns (`MAX_IN_FLIGHT`).
    Only its own reader thread fails its calls for good and closes its socket."""

    def __init__(self, sock: socketlib.socket) -> None:
        self.sock = sock
        self.waiting: dict[int, tuple[threading.Event, list[Any]]] = {}
        self.turns = threading.BoundedSemaphore(MAX_IN_FLIGHT)
        self.sending = threading.Lock()  # one line at a time; the reader closes the socket under it
        self.error: BaseException | None = None  # why it ended, once it has
        self.reader: threading.Thread | None = None


class Client:
    """A blocking client on one connection; safe to share between threads."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._lock = threading.Lock()  # guards `_conn`, and each connection's `waiting` and `error`
        self._ids = itertools.count(1)
        self._conn: _Connection | None = None

    def _connection(self) -> _Connection:
        with self._lock:
            if self._conn is None:
                sock = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM)
                try:
                    sock.connect(self.path)
                except OSError as e:
                    sock.close()
                    raise _unreachable(self.path, e) from e
                conn = _Connection(sock)
                conn.reader = threading.Thread(target=self._read_replies, args=(conn,), daemon=True, name="agentvfs-client")
                conn.reader.start()
                self._conn = conn
            return self._conn

    def _read_replies(self, conn: _Connection) -> None:
        buffer = bytearray()
        error: BaseException = ConnectionError(f"the daemon closed the connection on {self.path}")
        try:
            while conn.error is None:
                chunk = conn.sock.recv(1 << 20)
                if not chunk:
                    break
                for line in _lines(buffer, chunk):
                    self._deliver(conn, json.loads(line))
        except (OSError, ValueError) as e:
            error = ConnectionError(f"lost the connection to {self.path}: {e}")
        self._fail(conn, error)
        with conn.sending, self._lock:
            conn.sock.close()

    def _deliver(self, conn: _Connection, reply: Any) -> None:
        to = _addressee(reply, self.path)
        if isinstance(to, RpcError):
            self._fail(conn, to)
            return
        with self._lock:
            waiter = conn.waiting.pop(to, None) if to is not None else None
        if waiter is not None:
            waiter[1].append(reply)
            waiter[0].set()

    def _fail(self, conn: _Connection, error: BaseException) -> None:
        """Ends `conn` (once): the calls waiting on it fail with `error`, its socket is shut
        down (its reader thread closes it), and the next call opens a new connection."""
        with self._lock:
            if conn.error is not None:
                return
            conn.error = error
            if self._conn is conn:
                self._conn = None
            waiting, conn.waiting = conn.waiting, {}
            try:
                conn.sock.shutdown(socketlib.SHUT_RDWR)
            except OSError:
                pass
        for event, slot in waiting.values():
            slot.append(error)
            event.set()

    def _abandon(self, conn: _Connection, request_id: int, method: str, why: str) -> bool:
        """Closes `conn` for a call given up on before its reply, so that the daemon withdraws
        it if it waits for an approval; `False` when its reply (or the connection's end) came
        first."""
        with self._lock:
            if conn.waiting.pop(request_id, None) is None:
                return False
        self._fail(conn, ConnectionError(f"the connection to {self.path} was closed: a {method} call on it {why}"))
        return True

    def call(self, method: str, params: dict[str, Any] | None = None, timeout: float | None = None) -> Any:
        """Sends one request and waits for its result (raises `RpcError` for an error,
        `RequestError` for a request the daemon could not read, `TimeoutError` when `timeout`
        seconds pass first: the call is then abandoned and its connection closed)."""
        request_id = next(self._ids)
        line = _request_line(request_id, method, params)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            reply = self._exchange(request_id, line, method, timeout, deadline)
            if not _overloaded(reply):
                return _outcome(reply)
            time.sleep(_RETRY_PAUSE)

    def _exchange(self, request_id: int, line: bytes, method: str, timeout: float | None, deadline: float | None) -> Any:
        late = f"no reply to {method} from {self.path} within {timeout}s"
        event, slot = threading.Event(), []
        while True:
            conn = self._connection()
            if not conn.turns.acquire(timeout=_left(deadline)):
                raise TimeoutError(f"{late} (it was not sent: {MAX_IN_FLIGHT} requests were in flight)")
            with self._lock:
                if conn.error is None:
                    conn.waiting[request_id] = (event, slot)
                    break
            conn.turns.release()  # that connection ended while the call waited its turn
        try:
            try:
                with conn.sending:
                    conn.sock.sendall(line)
            except OSError as e:
                self._fail(conn, ConnectionError(f"lost the connection to {self.path}: {e}"))
            except BaseException:
                # Interrupted mid-line (Ctrl-C): the rest of the line is not sent, so the next
                # request would be read as its tail. The connection cannot be used again.
                self._fail(conn, ConnectionError(f"the connection to {self.path} was closed: a {method} call was interrupted while it was sent"))
                raise
            try:
                answered = event.wait(_left(deadline))
            except BaseException:
                self._abandon(conn, request_id, method, "was interrupted")
                raise
            if not answered:
                if self._abandon(conn, request_id, method, f"got no reply within {timeout}s"):
                    raise TimeoutError(_late(method, self.path, timeout))
                event.wait()  # its reply (or the connection's end) is being handed over
        finally:
            conn.turns.release()
        outcome = slot[0]
        if isinstance(outcome, BaseException):
            raise _raised(outcome) from None
        return outcome

    def close(self) -> None:
        """Closes the connection (calls waiting on it fail with `ConnectionError`); the next
        call opens a new one."""
        with self._lock:
            conn = self._conn
        if conn is not None:
            self._fail(conn, ConnectionError(f"the connection to {self.path} was closed by close()"))
            if conn.reader is not None and conn.reader is not threading.current_thread():
                conn.reader.join()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _AsyncConnection:
    """One connection of an `AsyncClient`, on the event loop that opened it: its own socket
    (so that it can be closed once that loop is closed), the calls waiting on it and its
    turns (`MAX_IN_FLIGHT`)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socketlib.socket) -> None:
        self.loop = loop
        self.sock = sock
        self.waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.turns = asyncio.Semaphore(MAX_IN_FLIGHT)
        self.sending = asyncio.Lock()  # one line at a time
        self.error: BaseException | None = None  # why it ended, once it has
        self.reader: asyncio.Task[None] | None = None


class AsyncClient:
    """An asyncio client on one connection (a non-blocking socket driven by the loop's
    `sock_recv` and `sock_sendall`), for one event loop; concurrent calls share the
    connection."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._conn: _AsyncConnection | None = None
        self._connecting = asyncio.Lock()
        self._ids = itertools.count(1)

    async def _connection(self) -> _AsyncConnection:
        async with self._connecting:
            if self._conn is None:
                loop = asyncio.get_running_loop()
                sock = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM)
                try:
                    sock.setblocking(False)
                    await loop.sock_connect(sock, self.path)
                except OSError as e:
                    sock.close()
                    raise _unreachable(self.path, e) from e
                except BaseException:
                    sock.close()
                    raise
                conn = _AsyncConnection(loop, sock)
                conn.reader = loop.create_task(self._read_replies(conn))
                self._conn = conn
            return self._conn

    async def _read_replies(self, conn: _AsyncConnection) -> None:
        buffer = bytearray()
        error: BaseException = ConnectionError(f"the daemon closed the connection on {self.path}")
        try:
            while conn.error is None:
                chunk = await conn.loop.sock_recv(conn.sock, 1 << 20)
                if not chunk:
                    break
                for line in _lines(buffer, chunk):
                    self._deliver(conn, json.loads(line))
        except (OSError, ValueError) as e:
            error = ConnectionError(f"lost the connection to {self.path}: {e}")
        except asyncio.CancelledError:
            error = ConnectionError(f"the connection to {self.path} was closed with its event loop")
            raise
        finally:
            self._fail(conn, error)
            async with conn.sending:  # a send under way ends first (its socket is shut down)
                conn.sock.close()

    def _deliver(self, conn: _AsyncConnection, reply: Any) -> None:
        to = _addressee(reply, self.path)
        if isinstance(to, RpcError):
            self._fail(conn, to)
            return
        future = conn.waiting.pop(to, None) if to is not None else None
        if future is not None and not future.done():
            future.set_result(reply)

    def _fail(self, conn: _AsyncConnection, error: BaseException) -> None:
        """Ends `conn` (once): the calls waiting on it fail with `error`, its socket is shut
        down (its reader closes it), and the next call opens a new connection."""
        if conn.error is not None:
            return
        conn.error = error
        if self._conn is conn:
            self._conn = None
        waiting, conn.waiting = conn.waiting, {}
        for future in waiting.values():
            if not future.done():
                future.set_exception(_raised(error))
        try:
            conn.sock.shutdown(socketlib.SHUT_RDWR)
        except OSError:
            pass

    async def call(self, method: str, params: dict[str, Any] | None = None, timeout: float | None = None) -> Any:
        """Sends one request and awaits its result (raises `RpcError` for an error,
        `RequestError` for a request the daemon could not read). A call cancelled, or out of
        time, before its reply is abandoned and its connection closed."""
        request_id = next(self._ids)
        line = _request_line(request_id, method, params)
        exchange = self._call(request_id, line, method)
        if timeout is None:
            return _outcome(await exchange)
        try:
            reply = await asyncio.wait_for(exchange, timeout)
        except asyncio.TimeoutError:
            raise TimeoutError(_late(method, self.path, timeout)) from None
        return _outcome(reply)

    async def _call(self, request_id: int, line: bytes, method: str) -> dict[str, Any]:
        resend = True
        while True:
            conn = await self._connection()
            async with conn.turns:
                if conn.error is not None:
                    continue  # that connection ended while the call waited its turn
                reply = await self._exchange(conn, request_id, line, method, resend)
            if reply is None:
                resend = False  # the line was not sent: once more, on a new connection
                continue
            if not _overloaded(reply):
                return reply
            await asyncio.sleep(_RETRY_PAUSE)

    async def _exchange(
        self, conn: _AsyncConnection, request_id: int, line: bytes, method: str, resend: bool  # noqa: FBT001
    ) -> dict[str, Any] | None:
        """Sends the line on `conn` and awaits its reply. `None` when the line could not be
        sent and `resend` allows sending it again: the connection had ended unseen (its
        reader had not run since the daemon closed it, as after a daemon restart), and the
        daemon never read the request, whose newline comes last."""
        future: asyncio.Future[dict[str, Any]] = conn.loop.create_future()
        conn.waiting[request_id] = future
        sent = False
        try:
            async with conn.sending:
                if conn.error is None:  # else `future` holds the error already
                    sent = True
                    try:
                        await conn.loop.sock_sendall(conn.sock, line)
                    except OSError as e:
                        self._fail(conn, ConnectionError(f"lost the connection to {self.path}: {e}"))
                        if resend:
                            return None
            return await future
        finally:
            if conn.waiting.pop(request_id, None) is not None and sent:
                # Given up on before its reply (cancelled, or out of time): only a disconnect
                # makes the daemon withdraw a call waiting for an approval.
                why = f"the connection to {self.path} was closed: a {method} call on it was abandoned"
                self._fail(conn, ConnectionError(why))
            elif future.done() and not future.cancelled():
                future.exception()  # retrieved, for a call cancelled as its connection ended

    async def aclose(self) -> None:
        """Closes the connection (calls waiting on it fail with `ConnectionError`)."""
        conn = self._conn
        if conn is not None:
            self._fail(conn, ConnectionError(f"the connection to {self.path} was closed by aclose()"))
            if conn.reader is not None and conn.reader is not asyncio.current_task():
                await asyncio.wait([conn.reader])

    def _discard(self) -> None:
        """Closes the connection of a client whose event loop is closed (so its reader will
        never run again), without that loop."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.error = conn.error or ConnectionError(f"the connection to {self.path} was closed with its event loop")
            conn.sock.close()
            if conn.reader is not None:
                # A loop closed without cancelling its tasks leaves the reader pending for good;
                # asyncio would log it as destroyed while pending once it is freed.
                conn.reader._log_destroy_pending = False  # noqa: SLF001
