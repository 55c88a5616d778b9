//! One probe worker's decisions (kubelet's `prober/worker.go` `doProbe`), as a state machine
//! the async loop in [`super::manager`] drives once per period. Pure: time comes in as
//! arguments, so thresholds, the initial delay and the startup gate are tested without sleeping.

use std::time::Duration;

use super::spec::ProbeSpec;
use super::ProbeKind;

/// The probed container as the runtime last reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerView {
    /// CRI container ID of the newest instance.
    pub id: String,
    /// True while it runs.
    pub running: bool,
    /// When it started, nanoseconds since the epoch.
    pub started_at: i64,
}

/// What the worker does on this tick.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Nothing (no container yet, initial delay, gated, on hold).
    Wait,
    /// Run the probe, then call [`Worker::after`].
    Probe,
}

/// A change to publish for the current container instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Publish {
    /// Set the result (true: success).
    Set(bool),
    /// No result yet (a new instance under a startup probe).
    Clear,
}

/// The state of one worker.
#[derive(Debug, Clone)]
pub struct Worker {
    kind: ProbeKind,
    spec: ProbeSpec,
    container_id: Option<String>,
    on_hold: bool,
    last: Option<bool>,
    run: u32,
}

impl Worker {
    /// A worker for a probe of `kind` with `spec`.
    pub fn new(kind: ProbeKind, spec: ProbeSpec) -> Self {
        Self {
            kind,
            spec,
            container_id: None,
            on_hold: false,
            last: None,
            run: 0,
        }
    }

    /// The probe this worker runs.
    pub fn spec(&self) -> &ProbeSpec {
        &self.spec
    }

    /// The container instance the worker follows.
    pub fn container_id(&self) -> Option<&str> {
        self.container_id.as_deref()
    }

    /// kubelet's initial result of a new instance: readiness fails until a probe succeeds,
    /// liveness succeeds until a probe fails, startup has none.
    fn initial(&self) -> Publish {
        match self.kind {
            ProbeKind::Readiness => Publish::Set(false),
            ProbeKind::Liveness => Publish::Set(true),
            ProbeKind::Startup => Publish::Clear,
        }
    }

    /// Decides this tick at `now_ns` (nanoseconds since the epoch) given the container (`None`
    /// before it exists) and whether it has started (its startup probe succeeded, or it has
    /// none). Returns the step and a change to publish first, if any.
    pub fn before(
        &mut self,
        c: Option<&ContainerView>,
        started: bool,
        now_ns: i64,
    ) -> (Step, Option<Publish>) {
        let Some(c) = c else {
            return (Step::Wait, None);
        };
        let mut publish = None;
        if self.container_id.as_deref() != Some(c.id.as_str()) {
            self.container_id = Some(c.id.clone());
            self.on_hold = false;
            self.last = None;
            self.run = 0;
            publish = Some(self.initial());
        }
        if self.on_hold {
            return (Step::Wait, publish);
        }
        if !c.running {
            // A container not running (created, not yet started; or exited) is not ready. Its
            // liveness and startup results are left alone: kubelet sets Failure for every kind
            // here, and a Failure recorded before the container started would kill it once it
            // runs (seen with many containers starting slowly).
            self.last = None;
            self.run = 0;
            let publish = match self.kind {
                ProbeKind::Readiness => Some(Publish::Set(false)),
                _ => publish,
            };
            return (Step::Wait, publish);
        }
        let active = Duration::from_nanos(u64::try_from(now_ns - c.started_at).unwrap_or(0));
        if active < self.spec.initial_delay {
            return (Step::Wait, publish);
        }
        // The startup probe stops once the container has started; the others wait for it.
        let gated = match self.kind {
            ProbeKind::Startup => started,
            _ => !started,
        };
        if gated {
            return (Step::Wait, publish);
        }
        (Step::Probe, publish)
    }

    /// Counts a probe's outcome; returns the new result once `successThreshold` successes or
    /// `failureThreshold` failures in a row are reached. A liveness or startup failure puts the
    /// worker on hold until the container is replaced (kubelet's `onHold`).
    pub fn after(&mut self, success: bool) -> Option<bool> {
        if self.last == Some(success) {
            self.run = self.run.saturating_add(1);
        } else {
            self.last = Some(success);
            self.run = 1;
        }
        let needed = if success {
            self.spec.success_threshold
        } else {
            self.spec.failure_threshold
        };
        if self.run < needed {
            return None;
        }
        if !success && self.kind != ProbeKind::Readiness {
            self.on_hold = true;
            self.run = 0;
        }
        Some(success)
    }
}

#[cfg(test)]
mod tests {
    use super::super::spec::Handler;
    use super::*;

    const S: i64 = 1_000_000_000;

    fn spec(initial_delay: u64, success: u32, failure: u32) -> ProbeSpec {
        ProbeSpec {
            handler: Handler::Exec(vec!["true".into()]),
            initial_delay: Duration::from_secs(initial_delay),
            period: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
            success_threshold: success,
            failure_threshold: failure,
            termination_grace_seconds: None,
        }
    }

    fn running(id: &str, started_at: i64) -> ContainerView {
        ContainerView {
            id: id.into(),
            running: true,
            started_at,
        }
    }

    #[test]
    fn readiness_starts_false_waits_for_the_initial_delay_and_needs_its_thresholds() {
        let mut w = Worker::new(ProbeKind::Readiness, spec(5, 2, 3));
        let c = running("a", 100 * S);
        assert_eq!(w.before(None, true, 100 * S), (Step::Wait, None));
        assert_eq!(
            w.before(Some(&c), true, 102 * S),
            (Step::Wait, Some(Publish::Set(false))),
            "not ready before the first success; initial delay"
        );
        assert_eq!(w.before(Some(&c), true, 105 * S), (Step::Probe, None));
        assert_eq!(w.after(true), None, "1 of 2 successes");
        assert_eq!(w.after(true), Some(true));
        assert_eq!(w.after(false), None);
        assert_eq!(w.after(false), None);
        assert_eq!(w.after(true), None, "a success resets the failure run");
        assert_eq!(w.after(false), None);
        assert_eq!(w.after(false), None);
        assert_eq!(w.after(false), Some(false), "3 failures in a row");
        // Readiness keeps probing after a failure.
        assert_eq!(w.before(Some(&c), true, 110 * S), (Step::Probe, None));
    }

    #[test]
    fn liveness_fails_after_its_threshold_then_holds_until_the_container_is_replaced() {
        let mut w = Worker::new(ProbeKind::Liveness, spec(0, 1, 3));
        let c = running("a", 0);
        assert_eq!(
            w.before(Some(&c), true, S),
            (Step::Probe, Some(Publish::Set(true))),
            "alive until a probe fails"
        );
        assert_eq!(w.after(false), None);
        assert_eq!(w.after(false), None);
        assert_eq!(w.after(false), Some(false));
        assert_eq!(
            w.before(Some(&c), true, 2 * S),
            (Step::Wait, None),
            "on hold"
        );
        let stopped = ContainerView {
            running: false,
            ..c.clone()
        };
        assert_eq!(w.before(Some(&stopped), true, 3 * S).0, Step::Wait);
        let next = running("b", 4 * S);
        assert_eq!(
            w.before(Some(&next), true, 4 * S),
            (Step::Probe, Some(Publish::Set(true))),
            "the new instance starts afresh"
        );
    }

    #[test]
    fn the_startup_probe_gates_the_others_and_stops_once_started() {
        let c = running("a", 0);
        let mut live = Worker::new(ProbeKind::Liveness, spec(0, 1, 1));
        let mut startup = Worker::new(ProbeKind::Startup, spec(0, 1, 3));
        assert_eq!(
            live.before(Some(&c), false, S),
            (Step::Wait, Some(Publish::Set(true))),
            "liveness waits for startup"
        );
        assert_eq!(
            startup.before(Some(&c), false, S),
            (Step::Probe, Some(Publish::Clear))
        );
        assert_eq!(startup.after(true), Some(true));
        assert_eq!(startup.before(Some(&c), true, 2 * S), (Step::Wait, None));
        assert_eq!(live.before(Some(&c), true, 2 * S), (Step::Probe, None));
        // A startup probe that keeps failing fails the container once, then holds.
        let mut startup = Worker::new(ProbeKind::Startup, spec(0, 1, 2));
        startup.before(Some(&c), false, S);
        assert_eq!(startup.after(false), None);
        assert_eq!(startup.after(false), Some(false));
        assert_eq!(startup.before(Some(&c), false, 2 * S).0, Step::Wait);
    }
}
