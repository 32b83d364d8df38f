//! Real-mount tests: a real daemon, real syscalls and shells, exact outcomes. Run as root.

mod harness;

mod conformance;
mod control;
mod control_wire;
mod data_path;
mod doors;
mod execute;
mod faults;
mod file_ops;
mod harness_api;
mod host_changes;
mod interrupt_shares;
mod interrupts;
mod langgraph_store;
mod lifecycle;
mod listings;
mod local_differences;
mod memory_cap;
mod model;
mod pauses;
mod persistence;
mod pg_faults;
mod races;
mod requests;
mod roles;
mod rules;
mod run;
mod run_home;
mod security;
mod shared_store;
mod stress;
mod tool_limits;
mod trailing_slash;
mod transport;
mod workloads;
