"""A scripted chat model for driving real Deep Agents graphs in tests: it answers each model
call with the next prepared `AIMessage` (tool calls included) and records what it was shown."""

from __future__ import annotations

from typing import Any

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatResult


class ScriptedModel(GenericFakeChatModel):
    """`GenericFakeChatModel` that accepts `bind_tools` (the script already names the tools)
    and keeps the message lists it was called with in `seen`."""

    seen: list[list[BaseMessage]] = []

    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedModel:  # noqa: ARG002
        return self

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        self.seen.append(list(messages))
        return super()._generate(messages, *args, **kwargs)


def scripted(*steps: AIMessage) -> ScriptedModel:
    return ScriptedModel(messages=iter(steps), seen=[])


def tool_call(name: str, args: dict[str, Any], call_id: str) -> AIMessage:
    """A model turn that calls one tool."""
    return AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": call_id, "type": "tool_call"}])


def answer(text: str) -> AIMessage:
    """A final model turn."""
    return AIMessage(content=text)
