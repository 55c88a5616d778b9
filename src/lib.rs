#![doc = include_str!("ARCHITECTURE.md")]
#![warn(missing_docs)]
#![forbid(unsafe_code)]
// Test code may read the machine's clocks and sleep (clippy.toml refuses it elsewhere).
#![cfg_attr(
    test,
    allow(clippy::disallowed_methods, clippy::cast_possible_truncation)
)]

pub mod active_deadline;
pub mod admission;
pub mod agent;
pub mod blocking;
pub mod cli;
pub mod clock;
pub mod cluster;
pub mod cm;
pub mod config;
pub mod container;
pub mod crash;
pub mod credentialprovider;
pub mod cri;
pub mod duration;
pub mod envvars;
pub mod events;
pub mod eviction;
pub mod fieldpath;
pub mod gc;
pub mod hash;
pub mod housekeeping;
pub mod kuberuntime;
pub mod metrics;
pub mod node;
pub mod nodeapi;
pub mod nodeshutdown;
pub mod objects;
pub mod parsers;
pub mod plan;
pub mod pleg;
pub mod pod;
pub mod podsync;
pub mod podworkers;
pub mod prober;
pub mod qos;
pub mod quantity;
pub mod resources;
pub mod runtime_state;
pub mod server;
pub mod source;
pub mod status;
pub mod syncloop;
#[cfg(test)]
pub mod testing;
pub mod token;
pub mod volume;
pub mod yaml;
