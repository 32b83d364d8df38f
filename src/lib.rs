//! agentvfs: a FUSE filesystem for AI agents, with path rules enforced on every syscall.
//!
//! Two doors (the FUSE adapter in [`fuse`] and the control socket) call one [`engine::Engine`],
//! which normalises paths, asks the policy gate ([`policy`]) and routes to a backend
//! ([`route`], [`backend`]).

pub mod audit;
pub mod backend;
pub mod cli;
pub mod config;
pub mod control;
pub mod daemon;
pub mod display;
pub mod engine;
pub mod error;
pub mod exec;
pub mod fuse;
pub mod host_changes;
pub mod log_limit;
pub mod mountinfo;
pub mod policy;
pub mod private_file;
pub mod route;
pub mod run;
pub mod vpath;
