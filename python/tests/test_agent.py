"""A real `create_deep_agent` graph on `AgentvfsBackend`, driven by a scripted model, through
a real mount and the real agent socket: the file tools, `execute` and the hidden file, sync
and async; pauses on interrupt rules resumed with each decision; a subagent on a second
daemon under that daemon's rules."""

from __future__ import annotations

import asyncio
from typing import Any

from conftest import Daemon, start_daemon, stop_daemon
from deepagents import create_deep_agent
from langchain_core.messages import BaseMessage, ToolMessage
from scripted import answer, scripted, tool_call

from agentvfs.deepagents import AgentvfsBackend

SECRET = "sk-hidden-4242"
APP = "def main():\n    return 'hello'\n"

# The scripted session: list, read, edit, grep, look for the secret, write a memory, run two
# commands (the second reads the hidden file), finish.
STEPS = [
    ("ls", {"path": "/workspace"}),
    ("read_file", {"file_path": "/workspace/app.py"}),
    ("edit_file", {"file_path": "/workspace/app.py", "old_string": "'hello'", "new_string": "'hello, agentvfs'"}),
    ("grep", {"pattern": "agentvfs", "path": "/workspace", "output_mode": "content"}),
    ("grep", {"pattern": "API_KEY", "path": "/workspace"}),
    ("glob", {"pattern": ".env", "path": "/workspace"}),
    ("write_file", {"file_path": "/memories/notes.md", "content": "app.py greets agentvfs\n"}),
    ("execute", {"command": "wc -l < /workspace/app.py && grep -c agentvfs /workspace/app.py"}),
    ("execute", {"command": "cat /workspace/.env"}),
]

# What the model is shown for each step: Deep Agents' renderings of the backend's results.
EXPECTED = [
    "['/workspace/app.py', '/workspace/guarded/', '/workspace/locked/']",
    "@@ lines 1-2 of 2 @@\ndef main():\n    return 'hello'",
    "Successfully replaced 1 instance(s) of the string in '/workspace/app.py'",
    "/workspace/app.py:\n  2:     return 'hello, agentvfs'",
    "No matches found",
    "No files found",
    "Updated file /memories/notes.md",
    "2\n1\n\n[Command succeeded with exit code 0]",
    "[stderr] cat: /workspace/.env: No such file or directory\n\nExit code: 1\n[Command failed with exit code 1]",
]


def _script() -> Any:
    turns = [tool_call(name, args, f"call_{i}") for i, (name, args) in enumerate(STEPS)]
    return scripted(*turns, answer("All done."))


def _seed(daemon: Daemon) -> None:
    (daemon.host_root / "app.py").write_text(APP)
    (daemon.host_root / ".env").write_text(f"API_KEY={SECRET}\n")


def _check_session(daemon: Daemon, messages: list[BaseMessage]) -> None:
    tool_messages = [m for m in messages if isinstance(m, ToolMessage)]
    assert [m.name for m in tool_messages] == [name for name, _ in STEPS]
    assert [m.content for m in tool_messages] == EXPECTED
    assert messages[-1].content == "All done."
    # The files landed where the tools said, on the host and in the sqlite store.
    assert (daemon.host_root / "app.py").read_text() == "def main():\n    return 'hello, agentvfs'\n"
    assert (daemon.mountpoint / "memories" / "notes.md").read_text() == "app.py greets agentvfs\n"
    assert (daemon.host_root / ".env").read_text() == f"API_KEY={SECRET}\n"
    # The hidden file's content reached the model through none of the tools.
    for m in messages:
        assert SECRET not in str(m.content), m


def test_a_deep_agent_session_obeys_the_rules(daemon: Daemon) -> None:
    _seed(daemon)
    agent = create_deep_agent(model=_script(), backend=AgentvfsBackend(str(daemon.agent_socket)))
    result = agent.invoke({"messages": [{"role": "user", "content": "Greet agentvfs in app.py."}]})
    _check_session(daemon, result["messages"])


def test_the_same_session_through_ainvoke(daemon: Daemon) -> None:
    _seed(daemon)
    agent = create_deep_agent(model=_script(), backend=AgentvfsBackend(str(daemon.agent_socket)))
    result = asyncio.run(agent.ainvoke({"messages": [{"role": "user", "content": "Greet agentvfs in app.py."}]}))
    _check_session(daemon, result["messages"])


def test_the_socket_comes_from_the_environment(daemon: Daemon, monkeypatch: Any) -> None:
    monkeypatch.setenv("AGENTVFS_SOCKET", str(daemon.agent_socket))
    backend = AgentvfsBackend()
    assert backend.socket == str(daemon.agent_socket)
    assert backend.id == f"agentvfs:{daemon.agent_socket}"
    assert backend.write("/workspace/env.txt", "x").path == "/workspace/env.txt"


def test_execute_on_a_daemon_without_it_says_so(tmp_path: Any) -> None:
    daemon = start_daemon(tmp_path / "noexec", execute=False)
    try:
        model = scripted(tool_call("execute", {"command": "ls"}, "x1"), answer("No shell."))
        agent = create_deep_agent(model=model, backend=AgentvfsBackend(str(daemon.agent_socket)))
        result = agent.invoke({"messages": [{"role": "user", "content": "ls"}]})
        (message,) = [m for m in result["messages"] if isinstance(m, ToolMessage)]
        assert (message.content, message.status) == (
            "Error: Execution not available. the agentvfs daemon does not offer execute (its config needs `[exec] enabled = true`)",
            "error",
        )
    finally:
        stop_daemon(daemon)
