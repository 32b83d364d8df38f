"""agentvfs's Python side: clients for the daemon's sockets (`agentvfs.client`) and a Deep
Agents backend (`agentvfs.deepagents.AgentvfsBackend`, which needs `deepagents`)."""

from agentvfs.client import (
    AsyncClient,
    Client,
    RequestError,
    RpcError,
    default_agent_socket,
    default_control_socket,
    resolve_socket,
)

__all__ = [
    "AsyncClient",
    "Client",
    "RequestError",
    "RpcError",
    "default_agent_socket",
    "default_control_socket",
    "resolve_socket",
]
