//! Integration tests: the real service on an ephemeral port, a temp
//! database, the mock model over HTTP.

#[path = "../common/mod.rs"]
mod common;

mod api;
mod bench;
mod crash;
mod loop_basics;
mod messaging;
mod model_faults;
mod schedules;
mod subagents;
