//! Where eviction ranks pods (kubelet's `rankMemoryPressure` / `rankDiskPressure` in
//! `eviction/helpers.go`): first pods whose usage exceeds their requests, then lower priority,
//! then larger usage above requests. QoS class itself is not a key. Critical pods are never
//! candidates. Under disk pressure the same keys use ephemeral-storage.

use std::cmp::Ordering;

/// What ranking needs to know about one pod (memory or ephemeral-storage, in bytes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodUsage {
    /// Pod UID.
    pub uid: String,
    /// Pod priority (higher survives longer).
    pub priority: i32,
    /// Current usage, bytes.
    pub usage: i64,
    /// Sum of requests, bytes.
    pub request: i64,
    /// Never evicted.
    pub critical: bool,
}

fn exceeds(p: &PodUsage) -> bool {
    p.usage > p.request
}

/// The eviction order: the first pod is evicted first. Critical pods are left out.
pub fn rank(pods: &[PodUsage]) -> Vec<PodUsage> {
    let mut v: Vec<PodUsage> = pods.iter().filter(|p| !p.critical).cloned().collect();
    v.sort_by(|a, b| {
        exceeds(b)
            .cmp(&exceeds(a))
            .then(a.priority.cmp(&b.priority))
            .then_with(|| (b.usage - b.request).cmp(&(a.usage - a.request)))
            .then(Ordering::Equal)
    });
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(uid: &str, priority: i32, usage: i64, request: i64, critical: bool) -> PodUsage {
        PodUsage {
            uid: uid.into(),
            priority,
            usage,
            request,
            critical,
        }
    }

    #[test]
    fn ranks_by_exceeding_requests_then_priority_then_usage_above_requests() {
        let pods = [
            p("within-low-prio", 0, 50, 100, false),
            p("over-by-10", 0, 110, 100, false),
            p("over-by-500", 0, 600, 100, false),
            p("over-high-prio", 1000, 900, 0, false),
            p("critical-over", 0, 10_000, 0, true),
            p("besteffort-small", 0, 20, 0, false),
        ];
        let order: Vec<String> = rank(&pods).into_iter().map(|p| p.uid).collect();
        assert_eq!(
            order,
            vec![
                "over-by-500",
                "besteffort-small",
                "over-by-10",
                "over-high-prio",
                "within-low-prio"
            ]
        );
    }
}
