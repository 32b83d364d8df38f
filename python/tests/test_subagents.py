"""A Deep Agents subagent given its own `AgentvfsBackend` on a second daemon works under that
daemon's rules, while the parent keeps its own: declared with a `FilesystemMiddleware` of its
own (which replaces the inherited one), or compiled as an agent of its own."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import Daemon
from deepagents import create_deep_agent
from deepagents.middleware.filesystem import FilesystemMiddleware
from langchain_core.messages import ToolMessage
from scripted import answer, scripted, tool_call

from agentvfs.deepagents import AgentvfsBackend

REPORT = {"file_path": "/workspace/report.md", "content": "report\n"}


@pytest.mark.parametrize("kind", ["declared", "compiled"])
def test_a_subagent_obeys_its_own_daemon(daemon: Daemon, second_daemon: Daemon, kind: str) -> None:
    sub_model = scripted(tool_call("write_file", REPORT, "sub_w"), answer("I could not write the report."))
    sub_backend = AgentvfsBackend(str(second_daemon.agent_socket))
    described = {"name": "reporter", "description": "Writes reports."}
    subagent: dict[str, Any]
    if kind == "declared":
        subagent = {**described, "system_prompt": "Write reports.", "model": sub_model,
                    "middleware": [FilesystemMiddleware(backend=sub_backend)]}
    else:
        subagent = {**described, "runnable": create_deep_agent(model=sub_model, backend=sub_backend)}
    parent_model = scripted(
        tool_call("task", {"description": "Write the report.", "subagent_type": "reporter"}, "t1"),
        tool_call("write_file", REPORT, "w1"),
        answer("Report written."),
    )
    agent = create_deep_agent(model=parent_model, backend=AgentvfsBackend(str(daemon.agent_socket)), subagents=[subagent])
    result = agent.invoke({"messages": [{"role": "user", "content": "Report."}]})

    # The subagent met its daemon's rule; the parent's write, on its own daemon, landed.
    sub_tools = [m for m in sub_model.seen[-1] if isinstance(m, ToolMessage)]
    assert [(m.name, m.content) for m in sub_tools] == [
        ("write_file", "Error: permission denied for write on /workspace/report.md")
    ]
    tools = [(m.name, m.content) for m in result["messages"] if isinstance(m, ToolMessage)]
    assert tools == [("task", "I could not write the report."), ("write_file", "Updated file /workspace/report.md")]
    assert (daemon.host_root / "report.md").read_text() == "report\n"
    assert not (second_daemon.host_root / "report.md").exists()
