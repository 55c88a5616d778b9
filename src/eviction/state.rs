//! Which thresholds act and which node conditions hold, over time (kubelet's
//! `thresholdsMet`, `thresholdsFirstObservedAt`, `thresholdsMetGracePeriod`, `nodeConditions`
//! and `nodeConditionsObservedSince`), with the clock passed in.
//!
//! A hard threshold acts as soon as it is met. A soft one acts once it has been met continuously
//! for its grace period; an observation where it is not met starts it over. A node condition
//! (MemoryPressure for memory signals, DiskPressure for nodefs/imagefs, PIDPressure for
//! pid.available) holds while a threshold of its signal is met and for
//! `evictionPressureTransitionPeriod` after the last time it was. A threshold that was met stays
//! met until the signal is back above the threshold plus its `evictionMinimumReclaim` (kubelet's
//! `thresholdsNotYetResolved`).

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use super::signals::Observation;
use super::threshold::{is_met, Threshold};

/// The node condition a signal drives.
pub fn condition_of(signal: &str) -> &'static str {
    match signal {
        "memory.available" | "allocatableMemory.available" => "MemoryPressure",
        "pid.available" => "PIDPressure",
        _ => "DiskPressure",
    }
}

/// Tracks thresholds and conditions between observations.
#[derive(Debug)]
pub struct PressureState {
    thresholds: Vec<Threshold>,
    transition: Duration,
    first_met: HashMap<usize, Instant>,
    unresolved: BTreeSet<usize>,
    condition_last_seen: HashMap<&'static str, Instant>,
}

/// The outcome of one observation.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// Thresholds to act on now (hard ones met, soft ones past their grace period).
    pub act_on: Vec<Threshold>,
    /// Node conditions in force.
    pub conditions: BTreeSet<&'static str>,
}

impl PressureState {
    /// State for `thresholds` with the given transition period.
    pub fn new(thresholds: Vec<Threshold>, transition: Duration) -> Self {
        Self {
            thresholds,
            transition,
            first_met: HashMap::new(),
            unresolved: BTreeSet::new(),
            condition_last_seen: HashMap::new(),
        }
    }

    /// Takes the observations made at `now` (by signal name) and decides.
    pub fn observe(
        &mut self,
        now: Instant,
        observations: &HashMap<String, Observation>,
    ) -> Decision {
        let mut act_on = Vec::new();
        for (i, t) in self.thresholds.iter().enumerate() {
            let was_met = self.unresolved.contains(&i);
            let met = observations.get(&t.signal).is_some_and(|o| {
                is_met(t, o.available, o.capacity)
                    || (was_met && o.available < reclaim_target(t, o.capacity))
            });
            if !met {
                self.first_met.remove(&i);
                self.unresolved.remove(&i);
                continue;
            }
            self.unresolved.insert(i);
            let since = *self.first_met.entry(i).or_insert(now);
            self.condition_last_seen
                .insert(condition_of(&t.signal), now);
            if now.saturating_duration_since(since) >= t.grace_period {
                act_on.push(t.clone());
            }
        }
        let conditions = self
            .condition_last_seen
            .iter()
            .filter(|(_, seen)| {
                now.saturating_duration_since(**seen) < self.transition || **seen == now
            })
            .map(|(c, _)| *c)
            .collect();
        Decision { act_on, conditions }
    }
}

/// The available amount at which a met threshold is resolved: the threshold plus its minimum
/// reclaim (kubelet's `thresholdsMet` with `enforceMinReclaim`).
pub fn reclaim_target(t: &Threshold, capacity: i64) -> i64 {
    t.value
        .amount(capacity)
        .saturating_add(t.min_reclaim.map_or(0, |m| m.amount(capacity)))
}

#[cfg(test)]
mod tests {
    use super::super::threshold::ThresholdValue;
    use super::*;

    fn t(signal: &str, bytes: i64, grace_s: u64) -> Threshold {
        Threshold {
            signal: signal.into(),
            value: ThresholdValue::Quantity(bytes),
            grace_period: Duration::from_secs(grace_s),
            min_reclaim: None,
        }
    }

    fn obs(available: i64) -> HashMap<String, Observation> {
        [(
            "memory.available".to_string(),
            Observation {
                available,
                capacity: 1000,
            },
        )]
        .into()
    }

    #[test]
    fn hard_acts_at_once_soft_after_continuous_grace_and_conditions_linger() {
        let mut s = PressureState::new(
            vec![
                t("memory.available", 100, 0),
                t("memory.available", 300, 30),
            ],
            Duration::from_secs(300),
        );
        let t0 = Instant::now();
        let s_ = |n| t0 + Duration::from_secs(n);
        // Only the soft threshold is met: nothing acts yet, but the condition is on.
        let d = s.observe(t0, &obs(200));
        assert!(d.act_on.is_empty());
        assert_eq!(d.conditions, ["MemoryPressure"].into());
        // It went away and came back: the grace period starts over.
        s.observe(s_(20), &obs(500));
        assert!(s.observe(s_(40), &obs(200)).act_on.is_empty());
        assert!(s.observe(s_(69), &obs(200)).act_on.is_empty());
        assert_eq!(
            s.observe(s_(70), &obs(200)).act_on.len(),
            1,
            "soft acts after 30s met continuously"
        );
        // Hard acts at once.
        let d = s.observe(s_(71), &obs(50));
        assert_eq!(
            d.act_on.iter().filter(|t| t.grace_period.is_zero()).count(),
            1
        );
        // Recovered: the condition stays for the transition period, then clears.
        assert_eq!(
            s.observe(s_(100), &obs(900)).conditions,
            ["MemoryPressure"].into()
        );
        assert!(s.observe(s_(71 + 300), &obs(900)).conditions.is_empty());
        assert_eq!(condition_of("nodefs.inodesFree"), "DiskPressure");
    }

    #[test]
    fn a_met_threshold_stays_met_until_minimum_reclaim_is_reached() {
        let mut th = t("memory.available", 100, 0);
        th.min_reclaim = Some(ThresholdValue::Quantity(200));
        let mut s = PressureState::new(vec![th], Duration::ZERO);
        let t0 = Instant::now();
        assert!(s.observe(t0, &obs(250)).act_on.is_empty(), "never met yet");
        assert_eq!(s.observe(t0, &obs(99)).act_on.len(), 1);
        assert_eq!(
            s.observe(t0, &obs(150)).act_on.len(),
            1,
            "above 100, below 300"
        );
        assert_eq!(s.observe(t0, &obs(299)).act_on.len(), 1);
        assert!(
            s.observe(t0, &obs(300)).act_on.is_empty(),
            "resolved at 100 + 200"
        );
        assert!(
            s.observe(t0, &obs(250)).act_on.is_empty(),
            "needs to be met afresh"
        );
        assert_eq!(condition_of("pid.available"), "PIDPressure");
    }
}
