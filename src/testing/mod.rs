//! Test support shared by the unit tests: a recording fake CRI runtime ([`runtime`]), a
//! recording pod syncer ([`syncer`]), an in-memory cgroup manager ([`cgroups`]) and pod
//! fixtures ([`pods`]). Compiled for tests only.

pub mod cgroups;
pub mod pods;
pub mod runtime;
pub mod syncer;
