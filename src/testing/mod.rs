//! Test support shared by the unit tests: a recording fake CRI runtime ([`runtime`]), a
//! recording pod syncer ([`syncer`]) and an in-memory cgroup manager ([`cgroups`]). Compiled for
//! tests only.

pub mod cgroups;
pub mod runtime;
pub mod syncer;
