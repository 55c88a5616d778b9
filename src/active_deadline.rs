//! Active deadline (kubelet's `activeDeadlineHandler`, `pkg/kubelet/active_deadline.go`): a pod
//! with `spec.activeDeadlineSeconds` that has been active on the node longer than that, counted
//! from its `status.startTime`, is killed and marked Failed with reason `DeadlineExceeded`.
//!
//! The runtime manager checks it on every sync and asks to be synced again when the deadline
//! comes; the start time is the pod's first sandbox's (see
//! [`crate::container::RuntimePodStatus::start_time`]), so an agent restart does not reset it.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;

/// The status reason and event reason of a pod past its deadline.
pub const REASON: &str = "DeadlineExceeded";
/// The status message and event message, as kubelet writes them.
pub const MESSAGE: &str = "Pod was active on the node longer than the specified deadline";

/// Where a pod stands against its active deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deadline {
    /// No `activeDeadlineSeconds`, or the pod has not started.
    None,
    /// The deadline comes in this long.
    In(Duration),
    /// The pod has been active at least `activeDeadlineSeconds`.
    Exceeded,
}

/// The pod's deadline at `now_ns`, given its start time `started_ns` (both nanoseconds since the
/// epoch; `None`: not started). Reached when the time active is at least the deadline, as
/// kubelet's `pastActiveDeadline` (`duration >= allowedDuration`).
pub fn check(pod: &Pod, started_ns: Option<i64>, now_ns: i64) -> Deadline {
    let (Some(seconds), Some(started)) = (
        pod.spec.as_ref().and_then(|s| s.active_deadline_seconds),
        started_ns,
    ) else {
        return Deadline::None;
    };
    let allowed = i128::from(seconds) * 1_000_000_000;
    let active = i128::from(now_ns) - i128::from(started);
    if active >= allowed {
        Deadline::Exceeded
    } else {
        Deadline::In(Duration::from_nanos(
            u64::try_from(allowed - active).unwrap_or(u64::MAX),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(deadline: Option<i64>) -> Pod {
        Pod {
            spec: Some(k8s_openapi::api::core::v1::PodSpec {
                active_deadline_seconds: deadline,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    const S: i64 = 1_000_000_000;

    #[test]
    fn the_deadline_counts_from_the_start_and_is_reached_at_equality() {
        let p = pod(Some(5));
        assert_eq!(
            check(&p, Some(100 * S), 100 * S),
            Deadline::In(Duration::from_secs(5))
        );
        assert_eq!(
            check(&p, Some(100 * S), 103 * S + S / 2),
            Deadline::In(Duration::from_millis(1500))
        );
        assert_eq!(check(&p, Some(100 * S), 105 * S), Deadline::Exceeded);
        assert_eq!(check(&p, Some(100 * S), 900 * S), Deadline::Exceeded);
    }

    #[test]
    fn no_deadline_or_no_start_means_nothing_to_do() {
        assert_eq!(check(&pod(None), Some(0), 900 * S), Deadline::None);
        assert_eq!(check(&pod(Some(5)), None, 900 * S), Deadline::None);
        assert_eq!(check(&Pod::default(), Some(0), 900 * S), Deadline::None);
    }
}
