"""Interrupt rules in Deep Agents' human-in-the-loop flow: a write under an `interrupt` rule
pauses the graph (`__interrupt__`, in the shape of Deep Agents' `interrupt_on` pauses) while
the daemon holds the approval pending; `Command(resume=...)` sends the decision to the daemon
through the control socket and the call completes accordingly. Without an approver socket the
call waits on the daemon, and the agent socket can never answer an approval."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from conftest import DEFAULT_RULES, Daemon, start_daemon, stop_daemon
from deepagents import create_deep_agent
from langchain_core.messages import AIMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command
from scripted import ScriptedModel, answer, scripted, tool_call

from agentvfs.client import Client, RpcError
from agentvfs.deepagents import AgentvfsBackend

PLAN = "/workspace/guarded/plan.md"
WRITE = {"file_path": PLAN, "content": "the plan\n"}
CONFIG = {"configurable": {"thread_id": "review"}}
START = {"messages": [{"role": "user", "content": "Write the plan."}]}


def _agent(daemon: Daemon, model: ScriptedModel) -> Any:
    backend = AgentvfsBackend(str(daemon.agent_socket), approvals_socket=str(daemon.control_socket))
    return create_deep_agent(model=model, backend=backend, checkpointer=InMemorySaver())


def _pending(daemon: Daemon) -> list[dict[str, Any]]:
    with Client(daemon.control_socket) as control:
        return control.call("interrupts/list")["interrupts"]


def _paused(daemon: Daemon, agent: Any, result: dict[str, Any]) -> int:
    """Checks the pause and returns the daemon's approval number."""
    (pause,) = result["__interrupt__"]
    value = pause.value
    assert value["action_requests"][0]["name"] == "write_file"
    assert value["action_requests"][0]["args"] == WRITE
    assert value["review_configs"] == [
        {"action_name": "write_file", "allowed_decisions": ["approve", "edit", "reject", "respond"]}
    ]
    interrupt_id = value["agentvfs"]["interrupt_id"]
    assert value["action_requests"][0]["description"] == (
        f"agentvfs approval #{interrupt_id}: `write_file` on {PLAN} meets an interrupt rule (rule #2) and needs a human's decision."
    )
    # Nothing written yet; the daemon holds exactly this approval pending.
    assert not (daemon.host_root / "guarded" / "plan.md").exists()
    (ticket,) = _pending(daemon)
    assert (ticket["id"], ticket["path"], ticket["socket"], ticket["tool"]["arguments"]) == (interrupt_id, PLAN, "agent", WRITE)
    return interrupt_id


def _last_tool_message(result: dict[str, Any]) -> ToolMessage:
    return [m for m in result["messages"] if isinstance(m, ToolMessage)][-1]


def _review(daemon: Daemon, decision: dict[str, Any]) -> tuple[dict[str, Any], ScriptedModel]:
    model = scripted(tool_call("write_file", WRITE, "w1"), answer("Finished."))
    agent = _agent(daemon, model)
    _paused(daemon, agent, agent.invoke(START, CONFIG))
    result = agent.invoke(Command(resume={"decisions": [decision]}), CONFIG)
    assert result["messages"][-1].content == "Finished."
    assert _pending(daemon) == []
    return result, model


def test_approve_writes_the_file(daemon: Daemon) -> None:
    result, _ = _review(daemon, {"type": "approve"})
    assert _last_tool_message(result).content == f"Updated file {PLAN}"
    assert (daemon.host_root / "guarded" / "plan.md").read_text() == "the plan\n"


def test_reject_writes_nothing_and_the_model_sees_the_reason(daemon: Daemon) -> None:
    result, model = _review(daemon, {"type": "reject", "message": "plans go to the wiki"})
    text = "User rejected the tool call for `write_file` with reason: plans go to the wiki"
    message = _last_tool_message(result)
    assert (message.content, message.status) == (text, "error")
    assert not (daemon.host_root / "guarded" / "plan.md").exists()
    # The model's next turn was shown the rejection.
    assert [m.content for m in model.seen[-1] if isinstance(m, ToolMessage)] == [text]


def test_edit_runs_the_edited_call(daemon: Daemon) -> None:
    edited = {"file_path": PLAN, "content": "the reviewed plan\n"}
    result, _ = _review(daemon, {"type": "edit", "edited_action": {"name": "write_file", "args": edited}})
    assert _last_tool_message(result).content == f"Updated file {PLAN}"
    assert (daemon.host_root / "guarded" / "plan.md").read_text() == "the reviewed plan\n"


def test_an_edit_cannot_reach_a_denied_path(daemon: Daemon) -> None:
    edited = {"file_path": "/workspace/locked/plan.md", "content": "x"}
    result, _ = _review(daemon, {"type": "edit", "edited_action": {"name": "write_file", "args": edited}})
    # A failure's text is the daemon's, which says the call was replaced (a success renders
    # only Deep Agents' own "Updated file ..." of the edited call).
    assert _last_tool_message(result).content == (
        "Note: a human reviewer replaced this tool call before it ran. The call recorded in your message is the one you"
        " produced, not the one that executed. This was intentional and authorized. Do not re-issue your original call."
        ' Executed instead: write_file with arguments {"content": "x", "file_path": "/workspace/locked/plan.md"}.\n\n'
        "Tool response:\nError: permission denied for write on /workspace/locked/plan.md"
    )
    assert not (daemon.host_root / "locked" / "plan.md").exists()


def test_respond_returns_the_message_without_running(daemon: Daemon) -> None:
    result, _ = _review(daemon, {"type": "respond", "message": "Skip the plan; just summarise."})
    assert _last_tool_message(result).content == "Skip the plan; just summarise."
    assert not (daemon.host_root / "guarded" / "plan.md").exists()


def test_approve_through_ainvoke(daemon: Daemon) -> None:
    model = scripted(tool_call("write_file", WRITE, "w1"), answer("Finished."))
    agent = _agent(daemon, model)

    async def run() -> dict[str, Any]:
        first = await agent.ainvoke(START, CONFIG)
        _paused(daemon, agent, first)
        return await agent.ainvoke(Command(resume={"decisions": [{"type": "approve"}]}), CONFIG)

    result = asyncio.run(run())
    assert _last_tool_message(result).content == f"Updated file {PLAN}"
    assert (daemon.host_root / "guarded" / "plan.md").read_text() == "the plan\n"
    assert _pending(daemon) == []


def test_without_an_approver_socket_the_call_waits_for_the_daemon(daemon: Daemon) -> None:
    backend = AgentvfsBackend(str(daemon.agent_socket))
    results: list[Any] = []
    writer = threading.Thread(target=lambda: results.append(backend.write(PLAN, "waited\n")))
    writer.start()
    deadline = time.monotonic() + 10
    while not _pending(daemon):
        assert time.monotonic() < deadline, "no approval appeared"
        time.sleep(0.02)
    assert results == [] and not (daemon.host_root / "guarded" / "plan.md").exists()
    (ticket,) = _pending(daemon)
    with Client(daemon.control_socket) as control:
        control.call("interrupts/resolve", {"id": ticket["id"], "decision": "approve"})
    writer.join(10)
    assert results[0].path == PLAN
    assert (daemon.host_root / "guarded" / "plan.md").read_text() == "waited\n"


def test_the_agent_socket_cannot_answer_an_approval(daemon: Daemon) -> None:
    with Client(daemon.agent_socket) as agent:
        paused = agent.call("tools/call", {"name": "write_file", "arguments": WRITE, "wait": False})
        interrupt_id = paused["structuredContent"]["interrupt_id"]
        with pytest.raises(RpcError) as refused:
            agent.call("interrupts/resolve", {"id": interrupt_id, "decision": "approve"})
        assert refused.value.code == -32001
        # The same call asks again: the same approval, not a second one.
        again = agent.call("tools/call", {"name": "write_file", "arguments": WRITE, "wait": False})
        assert again["structuredContent"]["interrupt_id"] == interrupt_id
    assert [t["id"] for t in _pending(daemon)] == [interrupt_id]
    assert not (daemon.host_root / "guarded" / "plan.md").exists()


def test_two_calls_paused_in_one_step_are_resumed_each_by_its_id(daemon: Daemon) -> None:
    calls = [
        {"name": "write_file", "args": {"file_path": f"/workspace/guarded/{n}.md", "content": n}, "id": f"c_{n}", "type": "tool_call"}
        for n in ("a", "b")
    ]
    model = scripted(AIMessage(content="", tool_calls=calls), answer("Finished."))
    agent = _agent(daemon, model)
    paused = agent.invoke(START, CONFIG)["__interrupt__"]
    assert sorted(p.value["action_requests"][0]["args"]["file_path"] for p in paused) == [
        "/workspace/guarded/a.md",
        "/workspace/guarded/b.md",
    ]
    assert len(_pending(daemon)) == 2

    def decide(p: Any) -> dict[str, Any]:
        if p.value["action_requests"][0]["args"]["file_path"].endswith("a.md"):
            return {"decisions": [{"type": "approve"}]}
        return {"decisions": [{"type": "reject", "message": "not b"}]}

    result = agent.invoke(Command(resume={p.id: decide(p) for p in paused}), CONFIG)
    assert [m.content for m in result["messages"] if isinstance(m, ToolMessage)] == [
        "Updated file /workspace/guarded/a.md",
        "User rejected the tool call for `write_file` with reason: not b",
    ]
    assert sorted(p.name for p in (daemon.host_root / "guarded").iterdir()) == ["a.md"]
    assert _pending(daemon) == []


def test_a_resume_after_the_approval_expired_asks_again_and_applies_the_decision(tmp_path: Path) -> None:
    daemon = start_daemon(tmp_path / "short", approval_timeout=1)
    try:
        model = scripted(tool_call("write_file", WRITE, "w1"), answer("Finished."))
        agent = _agent(daemon, model)
        first = agent.invoke(START, CONFIG)["__interrupt__"][0].value["agentvfs"]["interrupt_id"]
        deadline = time.monotonic() + 10
        while _pending(daemon):
            assert time.monotonic() < deadline, "the approval did not expire"
            time.sleep(0.1)
        # The human answers late: the re-run tool opens a new approval, which gets the answer.
        result = agent.invoke(Command(resume={"decisions": [{"type": "approve"}]}), CONFIG)
        assert _last_tool_message(result).content == f"Updated file {PLAN}"
        assert (daemon.host_root / "guarded" / "plan.md").read_text() == "the plan\n"
        assert _pending(daemon) == []
        with Client(daemon.control_socket) as control:
            with pytest.raises(RpcError) as gone:
                control.call("interrupts/resolve", {"id": first, "decision": "approve"})
        assert gone.value.message == f"approval #{first} is no longer pending: it timed out"
    finally:
        stop_daemon(daemon)


def test_the_agents_shell_cannot_reach_the_approver_socket(daemon: Daemon) -> None:
    backend = AgentvfsBackend(str(daemon.agent_socket), approvals_socket=str(daemon.control_socket))
    ran = backend.execute(f"ls {daemon.control_socket}")
    assert ran.exit_code != 0
    assert f"cannot access '{daemon.control_socket}': No such file or directory" in ran.output


REFUSED = [
    (
        {"type": "edit", "edited_action": {"name": "edit_file", "args": {"file_path": PLAN, "old_string": "a", "new_string": "b"}}},
        "an edit cannot switch tools: the paused call is 'write_file', the edit names 'edit_file' (edit 'write_file'\'s args,"
        " or reject the call)",
    ),
    ({"type": "edit"}, "an edit decision needs edited_action: {'name': 'write_file', 'args': {...}}, got {'type': 'edit'}"),
    (
        {"type": "edit", "edited_action": {"name": "write_file"}},
        "an edit decision needs edited_action: {'name': 'write_file', 'args': {...}}",
    ),
    (
        {"type": "respond"},
        "a respond decision needs a message, the text the model gets as the tool's result; got {'type': 'respond'}",
    ),
]


@pytest.mark.parametrize(("decision", "why"), REFUSED, ids=["other-tool", "edit-without-action", "edit-without-args", "respond-without-message"])
@pytest.mark.parametrize("keyed", [False, True], ids=["plain", "by-id"])
def test_a_malformed_decision_is_refused_and_the_pause_can_be_answered_again(
    daemon: Daemon, decision: dict[str, Any], why: str, keyed: bool  # noqa: FBT001
) -> None:
    model = scripted(tool_call("write_file", WRITE, "w1"), answer("Finished."))
    agent = _agent(daemon, model)
    first = agent.invoke(START, CONFIG)
    interrupt_id = _paused(daemon, agent, first)
    (pause,) = first["__interrupt__"]

    def resume(value: dict[str, Any]) -> Command:
        return Command(resume={pause.id: value} if keyed else value)

    with pytest.raises(ValidationError) as refused:
        agent.invoke(resume({"decisions": [decision]}), CONFIG)
    assert why in str(refused.value)
    # Nothing reached the daemon: the same approval is pending, nothing ran, and the graph is
    # still paused on the same interrupt, which a valid decision then answers.
    assert [t["id"] for t in _pending(daemon)] == [interrupt_id]
    assert not (daemon.host_root / "guarded" / "plan.md").exists()
    assert [i.id for i in agent.get_state(CONFIG).interrupts] == [pause.id]
    result = agent.invoke(resume({"decisions": [{"type": "approve"}]}), CONFIG)
    assert _last_tool_message(result).content == f"Updated file {PLAN}"
    assert (daemon.host_root / "guarded" / "plan.md").read_text() == "the plan\n"
    assert _pending(daemon) == []


ASKED_READS = DEFAULT_RULES + '\n[[rules]]\noperations = ["read"]\npaths = ["/workspace/asked/**"]\nmode = "interrupt"\n'


@pytest.mark.parametrize(
    ("tool", "args", "seen"),
    [
        # The middleware puts `Error: ` before read_file's and ls's errors, where the message travels.
        ("read_file", {"file_path": "/workspace/asked/a.txt"}, "Error: Ask me later."),
        ("ls", {"path": "/workspace/asked"}, "Error: Ask me later."),
        ("grep", {"pattern": "sec", "path": "/workspace/asked"}, "Ask me later."),
    ],
)
def test_respond_on_a_paused_read_gives_the_model_the_message(tmp_path: Path, tool: str, args: dict[str, Any], seen: str) -> None:
    daemon = start_daemon(tmp_path / "asked", ASKED_READS)
    try:
        (daemon.host_root / "asked").mkdir()
        (daemon.host_root / "asked" / "a.txt").write_text("secret\n")
        agent = _agent(daemon, scripted(tool_call(tool, args, "t1"), answer("Finished.")))
        (pause,) = agent.invoke(START, CONFIG)["__interrupt__"]
        assert pause.value["action_requests"][0]["name"] == tool
        result = agent.invoke(Command(resume={"decisions": [{"type": "respond", "message": "Ask me later."}]}), CONFIG)
        message = _last_tool_message(result)
        assert (message.content, message.status) == (seen, "error")
        assert "secret" not in str(result["messages"])
        assert _pending(daemon) == []
    finally:
        stop_daemon(daemon)


def test_a_glob_cannot_pause_the_graph(tmp_path: Path) -> None:
    """Deep Agents' glob tool turns every exception of the backend call, LangGraph's pause
    included, into its error text; the approval stays pending in the daemon."""
    daemon = start_daemon(tmp_path / "asked", ASKED_READS)
    try:
        (daemon.host_root / "asked").mkdir()
        (daemon.host_root / "asked" / "a.txt").write_text("secret\n")
        agent = _agent(daemon, scripted(tool_call("glob", {"pattern": "*.txt", "path": "/workspace/asked"}, "g1"), answer("Finished.")))
        result = agent.invoke(START, CONFIG)
        assert "__interrupt__" not in result
        assert str(_last_tool_message(result).content).startswith("Error: glob failed: (Interrupt(")
        (ticket,) = _pending(daemon)
        assert ticket["tool"]["name"] == "glob"
    finally:
        stop_daemon(daemon)
