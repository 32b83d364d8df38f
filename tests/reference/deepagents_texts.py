#!/usr/bin/env python3
"""Runs Deep Agents' own file tools (deepagents==0.7.32) on the cases in cases.json and prints
one JSON object {case_name: text}, the reference agentvfs' tool texts are compared with.

Each case runs in a fresh backend: a FilesystemBackend in virtual mode over a temporary
directory ("fs"), or a StateBackend ("state"). Host paths in texts are rewritten to virtual
ones, since agentvfs never shows them. Media results print as "media <mime> <base64>".

Exit status 3 means deepagents is not importable (the Rust test then skips the comparison).
Usage: deepagents_texts.py [cases.json] [case_name ...]
"""

import json
import os
import shutil
import sys
import tempfile

try:
    from deepagents.backends import FilesystemBackend, StateBackend
    from deepagents.backends.utils import create_file_data
    from deepagents.middleware.filesystem import FilesystemMiddleware, FilesystemPermission
    from langchain.tools import ToolRuntime
    from langchain_core.runnables.config import var_child_runnable_config
    from langgraph._internal._constants import CONFIG_KEY_READ, CONFIG_KEY_SEND
except ImportError as exc:  # pragma: no cover - depends on the machine
    print(f"deepagents is not importable: {exc}", file=sys.stderr)
    sys.exit(3)


def entry_content(entry):
    """The bytes of a setup entry, or None for directories and symlinks."""
    if "text" in entry:
        return entry["text"].encode("utf-8")
    if "hex" in entry:
        return bytes.fromhex(entry["hex"])
    if "repeat" in entry:
        return (entry["repeat"] * entry["times"]).encode("utf-8")
    if "pieces" in entry:
        return "".join(text * times for text, times in entry["pieces"]).encode("utf-8")
    return None


def expand(setup):
    """Setup entries with "many" (a directory of generated files) expanded."""
    for entry in setup:
        if "many" in entry:
            many = entry["many"]
            for i in range(many["count"]):
                yield {"path": f"{many['dir']}/{many['prefix']}{i:05d}", "text": many.get("text", "")}
        else:
            yield entry


class FsCase:
    def __init__(self, setup):
        self.root = tempfile.mkdtemp(prefix="da-ref-")
        self.backend = FilesystemBackend(root_dir=self.root, virtual_mode=True)
        for entry in expand(setup):
            self.put(entry)

    def host(self, vpath):
        return os.path.join(self.root, vpath.lstrip("/"))

    def put(self, entry):
        path = self.host(entry["path"])
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if entry.get("dir"):
            os.makedirs(path, exist_ok=True)
        elif "symlink" in entry:
            target = entry["symlink"]
            # Absolute link targets are virtual paths in agentvfs; on the host they live under
            # the root.
            os.symlink(self.host(target) if target.startswith("/") else target, path)
        else:
            with open(path, "wb") as f:
                f.write(entry_content(entry))

    def scrub(self, text):
        real = os.path.realpath(self.root)
        return text.replace(real, "").replace(self.root, "")

    def close(self):
        shutil.rmtree(self.root, ignore_errors=True)


class StateCase:
    """A StateBackend outside a graph: the `files` channel is a dict behind the config keys."""

    def __init__(self, setup):
        self.files = {}
        for entry in expand(setup):
            self.put(entry)

        def send(writes):
            for _channel, update in writes:
                for key, value in update.items():
                    if value is None:
                        self.files.pop(key, None)
                    else:
                        self.files[key] = value

        var_child_runnable_config.set(
            {"configurable": {CONFIG_KEY_READ: lambda _channel, _fresh=False: self.files, CONFIG_KEY_SEND: send}}
        )
        self.backend = StateBackend()

    def put(self, entry):
        content = entry_content(entry)
        if content is not None:
            self.files[entry["path"]] = create_file_data(content.decode("utf-8"))

    def scrub(self, text):
        return text

    def close(self):
        var_child_runnable_config.set(None)


def render(message):
    if isinstance(message.content, str):
        return message.content
    parts = []
    for block in message.content:
        if isinstance(block, dict) and block.get("type") == "text":
            parts.append(block["text"])
        elif isinstance(block, dict):
            parts.append(f"media {block.get('mime_type')} {block.get('base64')}")
        else:
            parts.append(str(block))
    return "\n".join(parts)


def run_case(case):
    env = (StateCase if case.get("backend") == "state" else FsCase)(case.get("setup", []))
    try:
        rules = [
            FilesystemPermission(operations=r["operations"], paths=r["paths"], mode=r.get("mode", "deny"))
            for r in case.get("rules", [])
        ]
        middleware = FilesystemMiddleware(backend=env.backend, permissions=rules or None)
        tools = {t.name: t for t in middleware.tools}
        runtime = ToolRuntime(
            state={"files": {}, "messages": []},
            context=None,
            config={},
            stream_writer=None,
            tool_call_id="call_ref",
            store=None,
        )
        text = None
        for step in [*case.get("steps", []), {"tool": case["tool"], "args": case["args"]}]:
            if "put" in step:
                env.put(step["put"])
                continue
            try:
                text = render(tools[step["tool"]].func(runtime=runtime, **step["args"]))
            except Exception as exc:  # noqa: BLE001 - a raising tool is a result too
                text = f"<raised {type(exc).__name__}: {exc}>"
        return env.scrub(text)
    finally:
        env.close()


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "cases.json")
    wanted = set(sys.argv[2:])
    with open(path, encoding="utf-8") as f:
        cases = json.load(f)
    out = {}
    for case in cases:
        if wanted and case["name"] not in wanted:
            continue
        out[case["name"]] = run_case(case)
    json.dump(out, sys.stdout, ensure_ascii=False, indent=1)
    print()


if __name__ == "__main__":
    main()
