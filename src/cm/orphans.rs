//! Orphaned pod cgroups (kubelet's `cleanupOrphanedPodCgroups`): `pod<UID>` cgroups under
//! `kubepods` that no desired, running or terminating pod owns are removed by housekeeping.
//!
//! One that cannot be removed (it still holds processes: `rmdir` gives EBUSY) is reported once —
//! a warning and an event naming the cgroup and its processes — then retried with back-off
//! ([`RETRY_INITIAL`] doubling to [`RETRY_MAX`]) and counted in `nodelet_orphaned_pod_cgroups`,
//! instead of being logged on every 2 s pass (kubelet's "orphaned pod" log flood, kubernetes
//! #60987). Its removal, when it finally succeeds, is logged once.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use tracing::{debug, info, warn};

use super::ContainerManager;

/// First delay before a failed removal is tried again.
pub const RETRY_INITIAL: Duration = Duration::from_secs(2);
/// Longest delay between two tries.
pub const RETRY_MAX: Duration = Duration::from_secs(300);

/// A pod cgroup that could not be removed.
#[derive(Debug, Clone)]
pub(super) struct Stuck {
    attempts: u32,
    next_try: Instant,
}

fn retry_delay(attempts: u32) -> Duration {
    RETRY_INITIAL
        .saturating_mul(1u32 << attempts.saturating_sub(1).min(16))
        .min(RETRY_MAX)
}

impl ContainerManager {
    /// Whether a pod cgroup that could not be removed awaits another try (housekeeping then
    /// reads the hierarchies at every pass, and the back-off decides).
    pub fn has_stuck_orphans(&self) -> bool {
        !self
            .orphans
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty()
    }

    /// Removes `pod<UID>` cgroups whose UID is in neither `desired` nor `in_use` (running or
    /// terminating pods, and pods of sandboxes that belong to other agents). Returns the UIDs
    /// removed; see the module for the ones that cannot be.
    pub fn cleanup_orphans(
        &self,
        desired: &HashSet<String>,
        in_use: &HashSet<String>,
    ) -> Vec<String> {
        let l = &self.cfg.layout;
        if !l.per_qos {
            return Vec::new();
        }
        let found: Vec<String> = self
            .cgroups
            .pod_uids_under(&l.spell(&l.kubepods()))
            .into_iter()
            .filter(|u| !desired.contains(u) && !in_use.contains(u) && crate::pod::is_safe_uid(u))
            .collect();
        let now = self.clock.now();
        let mut stuck = self.orphans.lock().unwrap_or_else(|e| e.into_inner());
        // Gone by other means, or owned again: forget.
        stuck.retain(|uid, _| found.contains(uid));
        let mut removed = Vec::new();
        for uid in found {
            if stuck.get(&uid).is_some_and(|s| s.next_try > now) {
                continue;
            }
            match self.destroy_pod_cgroups(&uid) {
                Ok(()) => {
                    match stuck.remove(&uid) {
                        Some(s) => info!(
                            uid,
                            attempts = s.attempts + 1,
                            "orphaned pod cgroup removed"
                        ),
                        None => info!(uid, "removed orphaned pod cgroup"),
                    }
                    self.forget_pod(&uid);
                    removed.push(uid);
                }
                Err((cgroup, e)) => {
                    let first = !stuck.contains_key(&uid);
                    let s = stuck.entry(uid.clone()).or_insert(Stuck {
                        attempts: 0,
                        next_try: now,
                    });
                    s.attempts += 1;
                    s.next_try = now + retry_delay(s.attempts);
                    if first {
                        let pids = self.cgroups.pids(&cgroup);
                        warn!(uid, cgroup = %cgroup, pids = ?pids, error = %e, "orphaned pod cgroup cannot be removed; it still holds processes; retrying with back-off");
                        if let Some(r) = &self.recorder {
                            r.warning(
                                format!("cgroup:{cgroup}"),
                                "OrphanedPodCgroup",
                                format!("orphaned pod cgroup {cgroup} (pod UID {uid}) cannot be removed: {e}; processes {pids:?}; retrying with back-off"),
                            );
                        }
                    } else {
                        debug!(uid, cgroup = %cgroup, attempts = s.attempts, error = %e, "orphaned pod cgroup still cannot be removed");
                    }
                }
            }
        }
        if let Some(m) = &self.metrics {
            m.orphaned_pod_cgroups.set(stuck.len() as i64);
        }
        removed
    }

    /// Removes every spelling of the pod's cgroup; the first that fails, with its error.
    pub(super) fn destroy_pod_cgroups(
        &self,
        uid: &str,
    ) -> Result<(), (String, super::cgroupfs::CgroupError)> {
        let mut first = Ok(());
        for cg in self.cfg.layout.pod_cgroup_candidates(uid) {
            if let Err(e) = self.timed("destroy", || self.cgroups.destroy(&cg)) {
                if first.is_ok() {
                    first = Err((cg, e));
                }
            }
        }
        first
    }
}

/// Stuck cgroups by pod UID.
pub(super) type StuckMap = HashMap<String, Stuck>;

#[cfg(test)]
mod tests {
    use super::*;

    use crate::cm::resources::{NodeResources, ResourceConfig};
    use crate::cm::CgroupManager;
    use crate::testing::cgroups::MemCgroups;
    use std::sync::Arc;

    #[test]
    fn a_busy_orphan_is_reported_once_retried_with_back_off_and_removed_when_free() {
        let cgroups = Arc::new(MemCgroups::default());
        let clock = crate::clock::FakeClock::new(0);
        let recorder = crate::events::Recorder::default();
        let metrics = crate::metrics::Metrics::new();
        let cm = ContainerManager::new(
            cgroups.clone(),
            crate::testing::cgroups::node_config(NodeResources::default()),
        )
        .with_recorder(recorder.clone())
        .with_clock(clock.shared())
        .with_metrics(metrics.clone());
        let orphan = "/kubepods/besteffort/podorphan";
        let foreign = "/kubepods/besteffort/podforeign";
        for cg in [orphan, foreign] {
            cgroups.create(cg, &ResourceConfig::default()).unwrap();
        }
        cgroups.set_busy(orphan, vec![4242]);
        let in_use: HashSet<String> = ["foreign".to_string()].into();
        let tries = || {
            cgroups
                .log()
                .iter()
                .filter(|l| l.starts_with("busy"))
                .count()
        };
        let pass = || cm.cleanup_orphans(&HashSet::new(), &in_use);
        assert!(pass().is_empty());
        assert_eq!(tries(), 1);
        assert_eq!(recorder.list().len(), 1);
        assert!(recorder.list()[0].message.contains("4242"));
        assert_eq!(metrics.orphaned_pod_cgroups.get(), 1);
        // The next passes, 2 s apart: tried again only as the back-off allows, reported once.
        let mut at = Vec::new();
        for s in 1..=15 {
            clock.advance(Duration::from_secs(2));
            let before = tries();
            pass();
            if tries() > before {
                at.push(s * 2);
            }
        }
        assert_eq!(at, vec![2, 6, 14, 30], "tries at 2 s, then +4, +8, +16");
        assert_eq!(recorder.list().len(), 1, "one event");
        // Free again: removed at its next try, and counted out.
        cgroups.set_busy(orphan, vec![]);
        clock.advance(Duration::from_secs(32));
        assert_eq!(pass(), vec!["orphan".to_string()]);
        assert!(!cgroups.has(orphan));
        assert_eq!(metrics.orphaned_pod_cgroups.get(), 0);
        assert!(
            cgroups.has(foreign),
            "another agent's pod cgroup is left alone"
        );
    }

    #[test]
    fn retries_back_off_from_two_seconds_to_five_minutes() {
        let d: Vec<u64> = (1..=10).map(|a| retry_delay(a).as_secs()).collect();
        assert_eq!(d, vec![2, 4, 8, 16, 32, 64, 128, 256, 300, 300]);
    }
}
