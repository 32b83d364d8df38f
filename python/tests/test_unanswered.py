"""Calls the daemon does not answer: an absent daemon, a reply out of time. The backend returns
each method's error result (per file for uploads and downloads), naming the socket, so a
Deep Agents graph gives the model a tool error instead of ending the run; an `execute` given
its own `timeout` waits for it, so a legitimately long command is not cut by the backend."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from conftest import Daemon, restart_daemon
from deepagents import create_deep_agent
from deepagents.backends.protocol import FileDownloadResponse, FileUploadResponse
from langchain_core.messages import AIMessage, ToolMessage
from scripted import answer, scripted, tool_call

from agentvfs.deepagents import AgentvfsBackend

START = {"messages": [{"role": "user", "content": "Go."}]}


def _absent(tmp_path: Path) -> tuple[AgentvfsBackend, str]:
    socket = str(tmp_path / "absent-agent.sock")
    why = f"cannot connect to the agentvfs socket {socket}: No such file or directory (is the daemon running, and is this its socket?)"
    return AgentvfsBackend(socket), why


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_every_method_without_a_daemon_returns_its_error_naming_the_socket(tmp_path: Path, mode: str) -> None:
    backend, why = _absent(tmp_path)

    async def calls() -> list[Any]:
        if mode == "sync":
            b = backend
            return [
                b.ls("/"), b.read("/a"), b.write("/a", "x"), b.edit("/a", "x", "y"), b.delete("/a"),
                b.grep("x"), b.glob("*"), b.execute("true"),
                b.upload_files([("/a", b"x"), ("/b", b"y")]), b.download_files(["/a", "/b"]),
            ]  # fmt: skip
        return [
            await backend.als("/"), await backend.aread("/a"), await backend.awrite("/a", "x"),
            await backend.aedit("/a", "x", "y"), await backend.adelete("/a"), await backend.agrep("x"),
            await backend.aglob("*"), await backend.aexecute("true"),
            await backend.aupload_files([("/a", b"x"), ("/b", b"y")]), await backend.adownload_files(["/a", "/b"]),
        ]  # fmt: skip

    ls, read, write, edit, delete, grep, glob, execute, uploads, downloads = asyncio.run(calls())
    # ls, read and glob: the middleware puts `Error: ` in front itself.
    assert (ls.error, read.error, glob.error) == (f"ls failed: {why}", f"read_file failed: {why}", f"glob failed: {why}")
    assert (write.error, edit.error, delete.error, grep.error) == (
        f"Error: write_file failed: {why}",
        f"Error: edit_file failed: {why}",
        f"Error: delete failed: {why}",
        f"Error: grep failed: {why}",
    )
    assert (execute.output, execute.exit_code) == (f"Error: execute failed: {why}", None)
    assert uploads == [FileUploadResponse(path="/a", error=why), FileUploadResponse(path="/b", error=why)]
    assert downloads == [FileDownloadResponse(path="/a", error=why), FileDownloadResponse(path="/b", error=why)]


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_a_graph_without_a_daemon_gives_the_model_the_error(tmp_path: Path, mode: str) -> None:
    backend, why = _absent(tmp_path)
    model = scripted(tool_call("read_file", {"file_path": "/workspace/a.txt"}, "r1"), answer("The daemon is down."))
    agent = create_deep_agent(model=model, backend=backend)
    result = agent.invoke(START) if mode == "invoke" else asyncio.run(agent.ainvoke(START))
    assert result["messages"][-1].content == "The daemon is down."
    (message,) = [m for m in result["messages"] if isinstance(m, ToolMessage)]
    assert (message.content, message.status) == (f"Error: read_file failed: {why}", "error")


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_an_execute_with_its_own_timeout_outlasts_the_backends(daemon: Daemon, mode: str) -> None:
    (daemon.host_root / "notes.txt").write_text("draft\n")
    notes = "/workspace/notes.txt"
    parallel = AIMessage(
        content="",
        tool_calls=[
            {"name": "execute", "args": {"command": "sleep 4; echo slept", "timeout": 10}, "id": "x1", "type": "tool_call"},
            {"name": "read_file", "args": {"file_path": notes}, "id": "r1", "type": "tool_call"},
        ],
    )
    model = scripted(
        parallel,
        # Read-before-write (`observation = "strict"`): the edit needs the read on its connection.
        tool_call("edit_file", {"file_path": notes, "old_string": "draft", "new_string": "final"}, "e1"),
        answer("Done."),
    )
    agent = create_deep_agent(model=model, backend=AgentvfsBackend(str(daemon.agent_socket), timeout=2))
    result = agent.invoke(START) if mode == "invoke" else asyncio.run(agent.ainvoke(START))
    assert result["messages"][-1].content == "Done."
    executed, read, edited = [m for m in result["messages"] if isinstance(m, ToolMessage)]
    assert executed.content == "slept\n\n[Command succeeded with exit code 0]"
    assert read.status == "success" and "draft" in str(read.content)
    assert edited.content == f"Successfully replaced 1 instance(s) of the string in '{notes}'"
    assert (daemon.host_root / "notes.txt").read_text() == "final\n"


def test_a_call_out_of_time_is_an_error_result_naming_the_socket(daemon: Daemon) -> None:
    backend = AgentvfsBackend(str(daemon.agent_socket), timeout=1)

    async def run() -> Any:
        return await backend.aexecute("sleep 3")

    for ran in (backend.execute("sleep 3"), asyncio.run(run())):
        assert ran.exit_code is None
        assert ran.output == (
            f"Error: execute failed: no reply to tools/call from {daemon.agent_socket} within 1s; the call was"
            " abandoned and its connection closed (the daemon withdraws it if it waits for an approval)"
        )


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_call_after_a_daemon_restart_reconnects(daemon: Daemon, mode: str) -> None:
    (daemon.host_root / "a.txt").write_text("before\n")
    backend = AgentvfsBackend(str(daemon.agent_socket))

    async def run() -> tuple[Any, Any]:
        if mode == "sync":
            first = backend.read("/workspace/a.txt")
            restart_daemon(daemon)
            return first, backend.read("/workspace/a.txt")
        first = await backend.aread("/workspace/a.txt")
        # The old connection's end is not seen yet: the loop has not run its reader since.
        restart_daemon(daemon)
        return first, await backend.aread("/workspace/a.txt")

    first, second = asyncio.run(run())
    assert first.error is None and second.error is None, second.error
    assert second.file_data == first.file_data
