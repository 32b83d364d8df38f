//! The control door: a Unix socket speaking JSON-RPC 2.0 (one object per line) with
//! MCP-compatible methods, serving the agent tool API and the operator methods. Like the FUSE
//! door, it reaches storage only through the engine.

pub mod client;
pub mod interrupts;
pub mod methods;
pub mod proto;
pub mod server;
pub mod session;
pub mod tools;
pub mod vfs;
