//! agentq: a durable job-queue runtime for LLM agents, backed by SQLite.
//!
//! Requests (HTTP, CLI, schedules) write rows and wake the worker pool; a
//! worker claims a turn job, the turn runner rebuilds the agent's context
//! from rows, calls the model, runs tools and records every step before the
//! next; settling an agent reports to its parent and webhooks in the same
//! transaction. See ARCHITECTURE.md for the map and the invariants.

#![forbid(unsafe_code)]

pub mod api;
pub mod app;
pub mod approvals;
pub mod bench;
pub mod cli;
pub mod clock;
pub mod config;
pub mod core;
pub mod creation;
pub mod db;
pub mod definitions;
pub mod delivery;
pub mod events;
pub mod handles;
pub mod lifecycle;
pub mod model;
pub mod notify;
pub mod scheduler;
pub mod services;
pub mod signals;
pub mod tools;
pub mod turn;
pub mod types;
pub mod worker;

pub use app::{App, RunningApp};
pub use config::Config;
