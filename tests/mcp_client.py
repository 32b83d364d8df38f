#!/usr/bin/env python3
"""A real MCP client (the official `mcp` Python SDK) against `agentvfs mcp --socket S`.

Usage: mcp_client.py AGENTVFS_BINARY SOCKET

Initializes, lists the tools, calls each listed tool with arguments that succeed on the test
fixture (a memory route at /mem), and calls an unknown tool. Prints one line per step so
the Rust test (tests/integration/control.rs) can compare the whole output exactly.
"""

import sys

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

# In an order that makes every call valid: write, read (so the edit is allowed), edit, then
# the read-only tools, and delete last.
CALLS = [
    ("write_file", {"file_path": "/mem/mcp/hello.txt", "content": "hello\nworld\n"}),
    ("read_file", {"file_path": "/mem/mcp/hello.txt"}),
    ("edit_file", {"file_path": "/mem/mcp/hello.txt", "old_string": "world", "new_string": "there"}),
    ("ls", {"path": "/mem/mcp"}),
    ("glob", {"pattern": "*.txt", "path": "/mem/mcp"}),
    ("grep", {"pattern": "hello", "path": "/mem/mcp"}),
    ("execute", {"command": "true"}),
    ("delete", {"file_path": "/mem/mcp"}),
]


def field(obj, snake: str, camel: str):
    """SDK 2.x names model fields in snake_case, 1.x in camelCase."""
    return getattr(obj, snake) if hasattr(obj, snake) else getattr(obj, camel)


async def main(binary: str, socket: str) -> None:
    params = StdioServerParameters(command=binary, args=["mcp", "--socket", socket])
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            info = field(init, "server_info", "serverInfo")
            print(f"server {info.name} protocol {field(init, 'protocol_version', 'protocolVersion')}")
            tools = init.capabilities.tools
            print(f"tools capability listChanged={field(tools, 'list_changed', 'listChanged')}")
            await session.send_ping()
            print("ping ok")
            listed = await session.list_tools()
            names = [tool.name for tool in listed.tools]
            print("tools " + " ".join(names))
            for tool in listed.tools:
                read_only = field(tool.annotations, "read_only_hint", "readOnlyHint")
                schema = field(tool, "input_schema", "inputSchema")
                print(f"  {tool.name} readOnly={read_only} schema={schema.get('type')}")
            arguments = dict(CALLS)
            order = [name for name, _ in CALLS if name in names]
            order += [name for name in names if name not in arguments]
            for name in order:
                result = await session.call_tool(name, arguments.get(name, {}))
                print(f"call {name}: {type(result).__name__} isError={field(result, 'is_error', 'isError')}")
            try:
                await session.call_tool("no_such_tool", {})
                print("unknown tool: no error")
            except Exception as error:  # McpError (SDK 1.x) or MCPError (2.x)
                data = getattr(error, "error", None)
                print(f"unknown tool: error {getattr(data, 'code', None)}")


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], sys.argv[2])
