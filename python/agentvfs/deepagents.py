"""`AgentvfsBackend`: a Deep Agents backend (`SandboxBackendProtocol`) served by an agentvfs
daemon, so the agent's file tools, its `execute` shell and every process that shell starts
obey the daemon's rules.

Each method is one request on the agent socket: the file methods call the daemon's tools with
`structured: true`, which returns the data Deep Agents' result types hold (file windows,
entries, matches, raw command output) rather than rendered text, so Deep Agents'
FilesystemMiddleware renders what the model sees, as it does for its own backends. Errors
arrive in the result types' error fields with agentvfs's texts. `upload_files` and
`download_files` move bytes through `vfs/upload` and `vfs/download`. A request the daemon could
not read (over its 1 MiB line limit, or with a string that is not valid UTF-8) is not sent:
the method returns its error result instead (`invalid_path` for uploads and downloads). So
does a call the daemon did not answer (its socket cannot be reached, the connection ended, or
`timeout=` ran out), with the client's text, which names the socket: a failed tool call is the
model's to see, not an exception that ends the graph run.

Approvals: when a call meets an `interrupt` rule and the backend was given an approver socket
(the daemon's control socket, which the harness process may use and the agent may not), the
daemon answers at once with the pending approval instead of waiting (`wait: false`); the
backend pauses the graph with LangGraph's `interrupt()` inside the tool call, in the format of
Deep Agents' own `interrupt_on` pauses; on `Command(resume=...)` the tool runs again, the
same call gets the same approval back, `interrupt()` returns the human's decision, the backend
sends it to the daemon on the approver socket, and the daemon finishes the call
(`ticket: N`). A malformed decision (an edit naming another tool, or missing its
`edited_action`; a respond without its message) makes the resume raise
`pydantic.ValidationError` before anything reaches the daemon: the graph stays paused and the
approval pending, to be answered again. Without an approver socket the call waits on the
daemon until someone resolves it there (`agentvfs approve N`), as any agentvfs tool call does.
"""

from __future__ import annotations

import asyncio
import base64
import json
import threading
from collections.abc import Generator
from typing import Annotated, Any

from deepagents.backends.protocol import (
    DeleteResult,
    EditResult,
    ExecuteResponse,
    FileData,
    FileDownloadResponse,
    FileInfo,
    FileUploadResponse,
    GlobResult,
    GrepMatch,
    GrepResult,
    LsResult,
    ReadResult,
    SandboxBackendProtocol,
    WriteResult,
)

from agentvfs.client import MAX_LINE, AsyncClient, Client, RequestError, RpcError, resolve_socket

__all__ = ["AgentvfsBackend", "DECISIONS"]

DECISIONS = ["approve", "edit", "reject", "respond"]
"""The decisions an agentvfs approval accepts (all of Deep Agents' human-in-the-loop ones)."""

# Upload pieces: each request line must stay under the daemon's 1 MiB limit once base64'd.
_UPLOAD_PIECE = 512 * 1024

# The daemon's error codes that Deep Agents' upload/download results name with a literal.
_FILE_ERRORS = {
    "FS_NOT_FOUND": "file_not_found",
    "FS_PERMISSION_DENIED": "permission_denied",
    "FS_INTERRUPT_REJECTED": "permission_denied",
    "FS_INTERRUPT_TIMEOUT": "permission_denied",
    "FS_IS_DIRECTORY": "is_directory",
    "FS_INVALID_PATH": "invalid_path",
}


def _text(result: dict[str, Any]) -> str:
    return "\n".join(block["text"] for block in result.get("content", []) if block.get("type") == "text")


def _structured(result: dict[str, Any]) -> dict[str, Any]:
    return result.get("structuredContent") or {}


def _failure(result: dict[str, Any]) -> str | None:
    """The result's error text when the call failed or a human answered it with a message
    (`respond`: the tool did not run, and Deep Agents' result types can carry that message
    only in their error field); `None` when the tool ran."""
    if result.get("isError") or _structured(result).get("responded"):
        return _text(result)
    return None


def _unprefixed(text: str) -> str:
    """The middleware adds `Error: ` in front of ls, read and glob errors; agentvfs's texts
    already have it, so it is taken off once to keep the model's text agentvfs's."""
    return text[len("Error: ") :] if text.startswith("Error: ") else text


class AgentvfsBackend(SandboxBackendProtocol):
    """A Deep Agents backend on an agentvfs daemon's agent socket.

    Args:
        socket: The agent socket; else `$AGENTVFS_SOCKET`, else the daemon's default.
        approvals_socket: The daemon's control socket, used to send the human's decisions
            when a call pauses on an interrupt rule. Give it only to the harness process: the
            agent's own `execute` shell must not reach it (the daemon keeps it out of the
            sandbox). Without it, paused calls wait on the daemon for an approver.
        sandbox_id: The `id` Deep Agents shows; by default `agentvfs:<socket>`.
        timeout: Seconds to wait for any one reply (`None`: no limit; approvals and commands
            are bounded by the daemon's own timeouts). An `execute` given its own `timeout`
            waits for that and 10 s more when it is longer. A call out of time closes its
            connection, so that the daemon withdraws it, and returns its method's error
            result, as does a call whose socket cannot be reached.
    """

    def __init__(
        self,
        socket: str | None = None,
        *,
        approvals_socket: str | None = None,
        sandbox_id: str | None = None,
        timeout: float | None = None,
    ) -> None:
        self.socket = resolve_socket(socket)
        self.approvals_socket = approvals_socket
        self.timeout = timeout
        self._id = sandbox_id or f"agentvfs:{self.socket}"
        self._client = Client(self.socket)
        self._approver = Client(approvals_socket) if approvals_socket else None
        # One asyncio connection per event loop (a socket is driven by the loop it was opened
        # on). A connection holds its loop, so those of closed loops are dropped explicitly.
        self._async: dict[asyncio.AbstractEventLoop, tuple[AsyncClient, AsyncClient | None]] = {}
        self._async_lock = threading.Lock()

    @property
    def id(self) -> str:
        return self._id

    def close(self) -> None:
        """Closes the blocking connections, and the asyncio ones of closed event loops (those
        of a loop that is still running close once it is closed, at the backend's next use)."""
        self._client.close()
        if self._approver is not None:
            self._approver.close()
        with self._async_lock:
            self._sweep()

    # -- talking to the daemon -------------------------------------------------------------

    def _aclients(self) -> tuple[AsyncClient, AsyncClient | None]:
        loop = asyncio.get_running_loop()
        with self._async_lock:
            self._sweep()
            clients = self._async.get(loop)
            if clients is None:
                approver = AsyncClient(self.approvals_socket) if self.approvals_socket else None
                clients = (AsyncClient(self.socket), approver)
                self._async[loop] = clients
        return clients

    def _sweep(self) -> None:
        """Closes and drops the asyncio connections of closed event loops (each
        `asyncio.run` is a loop of its own); the caller holds `_async_lock`."""
        for loop in [loop for loop in self._async if loop.is_closed()]:
            for client in self._async.pop(loop):
                if client is not None:
                    client._discard()  # noqa: SLF001

    def _params(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        params: dict[str, Any] = {"name": name, "arguments": arguments, "structured": True}
        if self.approvals_socket:
            params["wait"] = False
        return params

    def _tool(self, name: str, arguments: dict[str, Any], wait: float | None = None) -> dict[str, Any]:
        """One tool call (paused and resumed when it meets an interrupt rule); a call that
        was not sent, or not answered, is its failed result. `wait` replaces `timeout` for the
        replies to the call itself."""
        wait = self.timeout if wait is None else wait
        try:
            result = _run(self._client, _call_requests(self._params(name, arguments)), wait)
            ticket = _structured(result)
            if not ticket.get("interrupted"):
                return result
            decision = _pause(name, arguments, ticket)
            if decision is not None and self._approver is not None:
                self._approver.call("interrupts/resolve", _resolution(ticket["interrupt_id"], decision), self.timeout)
            return _run(self._client, _call_requests(_finish(name, arguments, ticket)), wait)
        except RequestError as e:
            return _unsent(name, e)
        except _UNANSWERED as e:
            return _unanswered(name, e)

    async def _atool(self, name: str, arguments: dict[str, Any], wait: float | None = None) -> dict[str, Any]:
        wait = self.timeout if wait is None else wait
        client, approver = self._aclients()
        try:
            result = await _arun(client, _call_requests(self._params(name, arguments)), wait)
            ticket = _structured(result)
            if not ticket.get("interrupted"):
                return result
            decision = _pause(name, arguments, ticket)
            if decision is not None and approver is not None:
                await approver.call("interrupts/resolve", _resolution(ticket["interrupt_id"], decision), self.timeout)
            return await _arun(client, _call_requests(_finish(name, arguments, ticket)), wait)
        except RequestError as e:
            return _unsent(name, e)
        except _UNANSWERED as e:
            return _unanswered(name, e)

    def _execute_wait(self, timeout: int | None) -> float | None:
        """How long an `execute` waits for its reply: `timeout=`, or the command's own
        `timeout` and a margin when that is longer, so that the backend does not cut a command
        the daemon would still let run."""
        if self.timeout is None or timeout is None:
            return self.timeout
        return max(self.timeout, timeout + _EXECUTE_MARGIN)

    # -- BackendProtocol ---------------------------------------------------------------------

    def ls(self, path: str) -> LsResult:
        return _ls(self._tool("ls", {"path": path}))

    async def als(self, path: str) -> LsResult:
        return _ls(await self._atool("ls", {"path": path}))

    def read(self, file_path: str, offset: int = 0, limit: int = 2000) -> ReadResult:
        return _read(self._tool("read_file", {"file_path": file_path, "offset": offset, "limit": limit}))

    async def aread(self, file_path: str, offset: int = 0, limit: int = 2000) -> ReadResult:
        return _read(await self._atool("read_file", {"file_path": file_path, "offset": offset, "limit": limit}))

    def write(self, file_path: str, content: str) -> WriteResult:
        return _write(self._tool("write_file", {"file_path": file_path, "content": content}))

    async def awrite(self, file_path: str, content: str) -> WriteResult:
        return _write(await self._atool("write_file", {"file_path": file_path, "content": content}))

    def edit(self, file_path: str, old_string: str, new_string: str, replace_all: bool = False) -> EditResult:  # noqa: FBT001, FBT002
        return _edit(self._tool("edit_file", _edit_args(file_path, old_string, new_string, replace_all)))

    async def aedit(self, file_path: str, old_string: str, new_string: str, replace_all: bool = False) -> EditResult:  # noqa: FBT001, FBT002
        return _edit(await self._atool("edit_file", _edit_args(file_path, old_string, new_string, replace_all)))

    def delete(self, file_path: str) -> DeleteResult:
        return _delete(self._tool("delete", {"file_path": file_path}))

    async def adelete(self, file_path: str) -> DeleteResult:
        return _delete(await self._atool("delete", {"file_path": file_path}))

    def grep(self, pattern: str, path: str | None = None, glob: str | None = None, *, max_count: int | None = None) -> GrepResult:
        return _grep(self._tool("grep", _grep_args(pattern, path, glob, max_count)))

    async def agrep(self, pattern: str, path: str | None = None, glob: str | None = None, *, max_count: int | None = None) -> GrepResult:
        return _grep(await self._atool("grep", _grep_args(pattern, path, glob, max_count)))

    def glob(self, pattern: str, path: str | None = None) -> GlobResult:
        return _glob(self._tool("glob", _glob_args(pattern, path)))

    async def aglob(self, pattern: str, path: str | None = None) -> GlobResult:
        return _glob(await self._atool("glob", _glob_args(pattern, path)))

    def execute(self, command: str, *, timeout: int | None = None) -> ExecuteResponse:
        try:
            return _execute(self._tool("execute", _execute_args(command, timeout), self._execute_wait(timeout)))
        except RpcError as e:
            if not _execute_missing(e):
                raise
            raise NotImplementedError(_EXECUTE_DISABLED) from e

    async def aexecute(self, command: str, *, timeout: int | None = None) -> ExecuteResponse:  # noqa: ASYNC109
        try:
            return _execute(await self._atool("execute", _execute_args(command, timeout), self._execute_wait(timeout)))
        except RpcError as e:
            if not _execute_missing(e):
                raise
            raise NotImplementedError(_EXECUTE_DISABLED) from e

    def upload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        responses = []
        for path, content in files:
            try:
                reply = _run(self._client, _upload_steps(path, content), self.timeout)
            except RequestError:
                reply = _UNSENT_FILE
            except _UNANSWERED as e:
                reply = _unanswered_file(e)
            responses.append(FileUploadResponse(path=path, error=_file_error(reply)))
        return responses

    async def aupload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        client, _ = self._aclients()
        responses = []
        for path, content in files:
            try:
                reply = await _arun(client, _upload_steps(path, content), self.timeout)
            except RequestError:
                reply = _UNSENT_FILE
            except _UNANSWERED as e:
                reply = _unanswered_file(e)
            responses.append(FileUploadResponse(path=path, error=_file_error(reply)))
        return responses

    def download_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        responses = []
        for path in paths:
            try:
                reply = self._client.call("vfs/download", {"path": path}, self.timeout)
            except RequestError:
                reply = _UNSENT_FILE
            except _UNANSWERED as e:
                reply = _unanswered_file(e)
            responses.append(_download(path, reply))
        return responses

    async def adownload_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        client, _ = self._aclients()
        responses = []
        for path in paths:
            try:
                reply = await client.call("vfs/download", {"path": path}, self.timeout)
            except RequestError:
                reply = _UNSENT_FILE
            except _UNANSWERED as e:
                reply = _unanswered_file(e)
            responses.append(_download(path, reply))
        return responses


# -- approvals ---------------------------------------------------------------------------------


def _pause(name: str, arguments: dict[str, Any], ticket: dict[str, Any]) -> dict[str, Any] | None:
    """Pauses the graph on the pending approval (LangGraph `interrupt()`, in the format of
    Deep Agents' `interrupt_on` pauses) and returns the human's decision once resumed.
    Outside a graph run there is nothing to pause: `None`, and the call waits on the daemon.

    The resume value is checked before LangGraph keeps it (`response_schema`), as LangChain's
    `HumanInTheLoopMiddleware` checks its per-call decisions: a malformed decision, or an edit
    naming another tool, makes the resume raise `pydantic.ValidationError` saying what is
    wrong, before anything reaches the daemon; the graph stays paused on the same interrupt
    and the daemon's approval stays pending, so the human answers again."""
    from langgraph.types import interrupt

    interrupt_id = ticket["interrupt_id"]
    described = ticket.get("interrupt") or {}
    description = (
        f"agentvfs approval #{interrupt_id}: `{name}` on {described.get('path', '?')} meets an interrupt rule"
        f"{'' if described.get('rule') is None else ' (rule #' + str(described['rule']) + ')'}"
        " and needs a human's decision."
    )
    payload = {
        "action_requests": [{"name": name, "args": arguments, "description": description}],
        "review_configs": [{"action_name": name, "allowed_decisions": list(DECISIONS)}],
        "agentvfs": {"interrupt_id": interrupt_id, "interrupt": described},
    }
    try:
        decision: dict[str, Any] = interrupt(payload, response_schema=_answer_schema(name))
    except RuntimeError as e:
        if "runnable context" not in str(e) and "get_config" not in str(e):
            raise
        return None
    return decision


def _answer_schema(name: str) -> Any:
    """The resume value a pause on `name` accepts: `_decision` checks it (LangGraph raises
    its `ValueError` as a `pydantic.ValidationError`); the JSON schema is what clients see."""
    from pydantic import AfterValidator, WithJsonSchema

    def check(answer: Any) -> dict[str, Any]:
        return _decision(name, answer)

    return Annotated[Any, AfterValidator(check), WithJsonSchema(_decision_json_schema(name))]


def _decision_json_schema(name: str) -> dict[str, Any]:
    message = {"type": "string"}
    one = {
        "oneOf": [
            {"type": "object", "properties": {"type": {"const": "approve"}}, "required": ["type"]},
            {"type": "object", "properties": {"type": {"const": "reject"}, "message": message}, "required": ["type"]},
            {"type": "object", "properties": {"type": {"const": "respond"}, "message": message}, "required": ["type", "message"]},
            {
                "type": "object",
                "properties": {
                    "type": {"const": "edit"},
                    "edited_action": {
                        "type": "object",
                        "properties": {"name": {"const": name}, "args": {"type": "object"}},
                        "required": ["name", "args"],
                    },
                },
                "required": ["type", "edited_action"],
            },
        ]
    }
    listed = {
        "type": "object",
        "properties": {"decisions": {"type": "array", "items": one, "minItems": 1, "maxItems": 1}},
        "required": ["decisions"],
    }
    return {"anyOf": [listed, one]}


def _decision(name: str, answer: Any) -> dict[str, Any]:
    """The one decision in a resume value for a pause on tool `name`: `{"decisions":
    [decision]}` (Deep Agents' shape) or a bare decision. `ValueError` says what is wrong with
    one that is malformed: a `respond` needs its `message`, an `edit` its `edited_action` with
    `args`, and, as in LangChain's per-call human-in-the-loop decisions, an edit cannot switch
    tools (its `name` must be the paused call's)."""
    if isinstance(answer, dict) and "decisions" in answer:
        decisions = answer["decisions"]
        if not isinstance(decisions, list) or len(decisions) != 1:
            msg = f"an agentvfs approval takes exactly one decision, got {decisions!r}"
            raise ValueError(msg)
        answer = decisions[0]
    if not isinstance(answer, dict) or answer.get("type") not in DECISIONS:
        msg = f"a decision is {{'type': one of {DECISIONS}, ...}}, got {answer!r}"
        raise ValueError(msg)
    kind = answer["type"]
    if kind == "edit":
        action = answer.get("edited_action")
        if not isinstance(action, dict) or not isinstance(action.get("args"), dict):
            msg = f"an edit decision needs edited_action: {{'name': {name!r}, 'args': {{...}}}}, got {answer!r}"
            raise ValueError(msg)
        if action.get("name") != name:
            msg = (
                f"an edit cannot switch tools: the paused call is {name!r}, the edit names {action.get('name')!r}"
                f" (edit {name!r}'s args, or reject the call)"
            )
            raise ValueError(msg)
    elif kind == "respond" and not isinstance(answer.get("message"), str):
        msg = f"a respond decision needs a message, the text the model gets as the tool's result; got {answer!r}"
        raise ValueError(msg)
    elif kind == "reject" and not isinstance(answer.get("message", ""), (str, type(None))):
        msg = f"a reject decision's message is a string (the reason), got {answer!r}"
        raise ValueError(msg)
    return answer


def _resolution(interrupt_id: int, decision: dict[str, Any]) -> dict[str, Any]:
    """`interrupts/resolve` params for a decision `_decision` accepted."""
    kind = decision["type"]
    params: dict[str, Any] = {"id": interrupt_id, "decision": kind}
    if kind == "edit":
        params["arguments"] = decision["edited_action"]["args"]
    elif kind in ("reject", "respond") and decision.get("message") is not None:
        params["message"] = decision["message"]
    return params


def _finish(name: str, arguments: dict[str, Any], ticket: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "arguments": arguments, "structured": True, "ticket": ticket["interrupt_id"]}


# -- requests the daemon could not read --------------------------------------------------------

# An upload or download whose request was not sent: only its path can make it unreadable
# (a string that is not UTF-8, or a path near 1 MiB long; upload pieces leave room).
_UNSENT_FILE: dict[str, Any] = {"error_code": "FS_INVALID_PATH"}


def _unsent(name: str, error: RequestError) -> dict[str, Any]:
    """A failed tool result for a call the client did not send, as the daemon could not have
    read its request (over its 1 MiB limit, or with a string that is not valid UTF-8)."""
    text = f"Error: {name} {error}"
    return {"content": [{"type": "text", "text": text}], "isError": True}


# -- the daemon unreachable, or out of time --------------------------------------------------

# A call that got no answer: its socket could not be reached (no daemon, not its socket), the
# connection ended, or `timeout=` ran out (the call was then abandoned and its connection closed).
_UNANSWERED = (ConnectionError, TimeoutError)

# What an `execute` with its own `timeout` waits for beyond it: the daemon kills the command
# at its timeout, then answers.
_EXECUTE_MARGIN = 10.0


def _unanswered(name: str, error: Exception) -> dict[str, Any]:
    """A failed tool result for a call the daemon did not answer; the client's text names the
    socket and says why."""
    return {"content": [{"type": "text", "text": f"Error: {name} failed: {error}"}], "isError": True}


def _unanswered_file(error: Exception) -> dict[str, Any]:
    """The reply standing for an upload or download the daemon did not answer: no
    `FileOperationError` literal fits, so its error is the text (which names the socket)."""
    return {"error_code": "UNANSWERED", "message": str(error)}


# -- arguments ---------------------------------------------------------------------------------


def _edit_args(file_path: str, old_string: str, new_string: str, replace_all: bool) -> dict[str, Any]:  # noqa: FBT001
    return {"file_path": file_path, "old_string": old_string, "new_string": new_string, "replace_all": replace_all}


def _grep_args(pattern: str, path: str | None, glob: str | None, max_count: int | None) -> dict[str, Any]:
    args: dict[str, Any] = {"pattern": pattern, "output_mode": "content"}
    if path is not None:
        args["path"] = path
    if glob is not None:
        args["glob"] = glob
    if max_count is not None:
        args["max_count"] = max_count
    return args


def _glob_args(pattern: str, path: str | None) -> dict[str, Any]:
    return {"pattern": pattern} if path is None else {"pattern": pattern, "path": path}


def _execute_args(command: str, timeout: int | None) -> dict[str, Any]:
    return {"command": command} if timeout is None else {"command": command, "timeout": timeout}


# Requests sent one at a time, each with the answer to the one before: a generator yields
# (method, params), is sent the reply, and returns the result.
Steps = Generator[tuple[str, dict[str, Any]], dict[str, Any], dict[str, Any]]


def _run(client: Client, steps: Steps, wait: float | None) -> dict[str, Any]:
    try:
        method, params = next(steps)
        while True:
            method, params = steps.send(client.call(method, params, wait))
    except StopIteration as done:
        return done.value


async def _arun(client: AsyncClient, steps: Steps, wait: float | None) -> dict[str, Any]:
    try:
        method, params = next(steps)
        while True:
            method, params = steps.send(await client.call(method, params, wait))
    except StopIteration as done:
        return done.value


# Room for the rest of a `tools/call` line beside its arguments; an argument that would take
# the line past it is staged first (`vfs/upload` with `argument: true`).
_CALL_ROOM = MAX_LINE - (64 << 10)


# The arguments that may be staged: file contents (a command or a pattern that long is a
# mistake the daemon should not run).
_STAGED_TEXTS = {"write_file": ("content",), "edit_file": ("old_string", "new_string")}


def _line_size(params: dict[str, Any]) -> int:
    return len(json.dumps(params, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass"))


def _call_requests(params: dict[str, Any]) -> Steps:
    """The requests of one `tools/call`, each sent with the answer to the one before: the call
    itself, after its longest string arguments when the line would be over the daemon's
    limit (a 3 MB `write_file` content, an `edit_file` appending to a long file), each staged
    in pieces and named in `staged_arguments`. Its result is the call's (or a staged piece's
    refusal as the call's failure)."""
    arguments = dict(params["arguments"])
    staged: dict[str, int] = {}
    texts = _STAGED_TEXTS.get(params["name"], ())
    longest = sorted((k for k in texts if isinstance(arguments.get(k), str)), key=lambda k: -len(arguments[k]))
    label = str(arguments.get("file_path") or "/")
    for key in longest:
        if _line_size({**params, "arguments": arguments}) <= _CALL_ROOM:
            break
        try:
            data = arguments[key].encode("utf-8")
        except UnicodeEncodeError as e:
            msg = f"request not sent: `{key}` holds {e.object[e.start]!r}, which is not valid UTF-8"
            raise RequestError(msg) from None
        reply = yield from _upload_steps(label, data, argument=True)
        if "error_code" in reply:
            return {"content": [{"type": "text", "text": reply.get("message", "")}], "isError": True, "structuredContent": reply}
        staged[key] = reply["upload"]
        del arguments[key]
    if staged:
        params = {**params, "arguments": arguments, "staged_arguments": staged}
    return (yield ("tools/call", params))


def _upload_steps(path: str, content: bytes, *, argument: bool = False) -> Steps:
    """The `vfs/upload` requests of one file (or, with `argument`, of a tool call's argument,
    every piece kept for the call), each sent with the answer to the one before: later pieces
    name the upload the first was given and where they begin, and a refused piece ends the
    upload (its answer is the result)."""
    pieces = [content[i : i + _UPLOAD_PIECE] for i in range(0, len(content), _UPLOAD_PIECE)] or [b""]
    reply: dict[str, Any] = {}
    number = None
    for i, piece in enumerate(pieces):
        params = {"path": path, "content": base64.b64encode(piece).decode("ascii"), "more": argument or i + 1 < len(pieces)}
        if argument:
            params["argument"] = True
        if number is not None:
            params.update({"upload": number, "offset": i * _UPLOAD_PIECE})
        reply = yield ("vfs/upload", params)
        if "error_code" in reply:
            break
        number = reply.get("upload", number)
    return reply


# -- results -----------------------------------------------------------------------------------


def _ls(result: dict[str, Any]) -> LsResult:
    if (error := _failure(result)) is not None:
        return LsResult(error=_unprefixed(error))
    entries = [
        FileInfo(path=e["path"], is_dir=e["is_dir"], size=e["size"], modified_at=e["modified_at"])
        for e in _structured(result).get("entries", [])
    ]
    return LsResult(entries=entries)


def _read(result: dict[str, Any]) -> ReadResult:
    if (error := _failure(result)) is not None:
        return ReadResult(error=_unprefixed(error))
    s = _structured(result)
    data = FileData(content=s.get("content", ""), encoding=s.get("encoding", "utf-8"))
    if s.get("no_lines_requested"):
        return ReadResult(file_data=data, no_lines_requested=True)
    if s.get("start_line") is None:
        return ReadResult(file_data=data)
    return ReadResult(
        file_data=data,
        start_line=s["start_line"],
        end_line=s["end_line"],
        total_lines=s["total_lines"],
        next_offset=s.get("next_offset"),
    )


def _write(result: dict[str, Any]) -> WriteResult:
    if (error := _failure(result)) is not None:
        return WriteResult(error=error)
    return WriteResult(path=_structured(result)["path"])


def _edit(result: dict[str, Any]) -> EditResult:
    if (error := _failure(result)) is not None:
        return EditResult(error=error)
    s = _structured(result)
    return EditResult(path=s["path"], occurrences=s["occurrences"])


def _delete(result: dict[str, Any]) -> DeleteResult:
    if (error := _failure(result)) is not None:
        return DeleteResult(error=error)
    return DeleteResult(path=_structured(result)["path"])


def _grep(result: dict[str, Any]) -> GrepResult:
    if (error := _failure(result)) is not None:
        return GrepResult(error=error)
    s = _structured(result)
    matches = [
        GrepMatch(path=f["path"], line=m["line"], text=m["text"]) for f in s.get("files", []) for m in f.get("matches", [])
    ]
    return GrepResult(matches=matches, truncated=bool(s.get("truncated")))


def _glob(result: dict[str, Any]) -> GlobResult:
    if (error := _failure(result)) is not None:
        return GlobResult(error=_unprefixed(error))
    s = _structured(result)
    reason = s.get("truncation_reason")
    reason = reason if reason in ("budget", "unreadable") else None
    matches = [FileInfo(path=m["path"], is_dir=False) for m in s.get("matches", [])]
    return GlobResult(matches=matches, truncated=reason is not None, truncation_reason=reason)


def _execute(result: dict[str, Any]) -> ExecuteResponse:
    s = _structured(result)
    if "output" not in s:
        # Not a command's result: a refused approval or a human's response.
        return ExecuteResponse(output=_text(result), exit_code=None)
    return ExecuteResponse(output=s["output"], exit_code=s.get("exit_code"), truncated=bool(s.get("truncated")))


_EXECUTE_DISABLED = "the agentvfs daemon does not offer execute (its config needs `[exec] enabled = true`)"


def _execute_missing(error: RpcError) -> bool:
    """Whether the daemon refused `execute` because it does not offer it; Deep Agents'
    middleware turns the `NotImplementedError` into "Error: Execution not available. ..."."""
    return error.code == -32602 and error.message.startswith('unknown tool "execute"')


def _file_error(reply: dict[str, Any]) -> str | None:
    if "error_code" not in reply:
        return None
    return _FILE_ERRORS.get(reply["error_code"], reply.get("message") or reply["error_code"])


def _download(path: str, reply: dict[str, Any]) -> FileDownloadResponse:
    if (error := _file_error(reply)) is not None:
        return FileDownloadResponse(path=path, error=error)
    return FileDownloadResponse(path=path, content=base64.b64decode(reply["content"]))
