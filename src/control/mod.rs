//! The control door: two Unix sockets speaking JSON-RPC 2.0 (one object per line) with
//! MCP-compatible methods: the agent socket serves the agent tool API, the control socket that
//! and the approver and operator methods (`roles`). Like the FUSE door, it reaches storage
//! only through the engine.

pub mod client;
pub mod deferred;
pub mod interrupts;
pub mod methods;
pub mod proto;
pub mod reply_budget;
pub mod roles;
pub mod running;
pub mod server;
pub mod session;
pub mod tools;
pub mod transfer;
pub mod vfs;
