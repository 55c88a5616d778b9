//! A pod's row as `kubectl get pods` prints it (kubectl's `printPod`, pkg/printers/internalversion):
//! READY counts ready app containers and started ready sidecars, STATUS is the phase or the
//! reason of the first init container not done or of the last app container that is not
//! running (`CrashLoopBackOff`, `Init:0/1`, `PodInitializing`, `OOMKilled`, `Completed`,
//! `Error`, `ExitCode:N`), `Terminating` while a deletion is under way; RESTARTS adds
//! `(<age> ago)` of the last restart.

use k8s_openapi::api::core::v1::{Container, ContainerStatus, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// What `kubectl get pods` prints of one pod (AGE apart).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRow {
    /// `ready/total`.
    pub ready: String,
    /// STATUS.
    pub status: String,
    /// RESTARTS: the count, with `(<age> ago)` of the last restart when there was one.
    pub restarts: String,
}

fn is_sidecar(c: Option<&Container>) -> bool {
    c.and_then(|c| c.restart_policy.as_deref()) == Some("Always")
}

fn terminated_reason(reason: Option<&str>, signal: Option<i32>, code: i32, prefix: &str) -> String {
    match (reason.filter(|r| !r.is_empty()), signal.filter(|s| *s != 0)) {
        (Some(r), _) => format!("{prefix}{r}"),
        (None, Some(s)) => format!("{prefix}Signal:{s}"),
        (None, None) => format!("{prefix}ExitCode:{code}"),
    }
}

fn later(last: &mut Option<Time>, cs: &ContainerStatus) {
    let finished = cs
        .last_state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .and_then(|t| t.finished_at.clone());
    if let Some(f) = finished {
        if last.as_ref().is_none_or(|l| l.0 < f.0) {
            *last = Some(f);
        }
    }
}

fn condition_true(pod: &Pod, type_: &str) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == type_ && c.status == "True"))
}

/// Where the init containers leave the pod: `Some(reason)` while they are not done, with the
/// restarts, ready sidecars and last restart of the sidecars.
struct InitView {
    initializing: Option<String>,
    restarts: i32,
    sidecar_restarts: i32,
    ready_sidecars: usize,
    last: Option<Time>,
    last_sidecar: Option<Time>,
}

fn init_view(pod: &Pod) -> InitView {
    let spec_init = pod
        .spec
        .as_ref()
        .and_then(|s| s.init_containers.as_deref())
        .unwrap_or_default();
    let statuses = pod
        .status
        .as_ref()
        .and_then(|s| s.init_container_statuses.as_deref())
        .unwrap_or_default();
    let mut v = InitView {
        initializing: None,
        restarts: 0,
        sidecar_restarts: 0,
        ready_sidecars: 0,
        last: None,
        last_sidecar: None,
    };
    for (i, cs) in statuses.iter().enumerate() {
        let spec = spec_init.iter().find(|c| c.name == cs.name);
        v.restarts += cs.restart_count;
        later(&mut v.last, cs);
        if is_sidecar(spec) {
            v.sidecar_restarts += cs.restart_count;
            later(&mut v.last_sidecar, cs);
        }
        let state = cs.state.clone().unwrap_or_default();
        if state.terminated.as_ref().is_some_and(|t| t.exit_code == 0) {
            continue;
        }
        if is_sidecar(spec) && cs.started == Some(true) {
            v.ready_sidecars += usize::from(cs.ready);
            continue;
        }
        let reason = if let Some(t) = &state.terminated {
            terminated_reason(t.reason.as_deref(), t.signal, t.exit_code, "Init:")
        } else if let Some(r) = state
            .waiting
            .as_ref()
            .and_then(|w| w.reason.as_deref())
            .filter(|r| !r.is_empty() && *r != "PodInitializing")
        {
            format!("Init:{r}")
        } else {
            format!("Init:{i}/{}", spec_init.len())
        };
        v.initializing = Some(reason);
        break;
    }
    v
}

/// kubectl's READY, STATUS and RESTARTS of `pod` at `now`.
pub fn pod_row(pod: &Pod, now: jiff::Timestamp) -> PodRow {
    let status = pod.status.clone().unwrap_or_default();
    let spec_init = pod
        .spec
        .as_ref()
        .and_then(|s| s.init_containers.as_deref())
        .unwrap_or_default();
    let total = pod.spec.as_ref().map_or(0, |s| s.containers.len())
        + spec_init.iter().filter(|c| is_sidecar(Some(c))).count();
    let phase = status.phase.clone().unwrap_or_default();
    let mut reason = status
        .reason
        .clone()
        .filter(|r| !r.is_empty())
        .unwrap_or_else(|| phase.clone());
    let init = init_view(pod);
    let mut ready = init.ready_sidecars;
    let (mut restarts, mut last) = (init.restarts, init.last.clone());
    if let Some(r) = &init.initializing {
        reason = r.clone();
    }
    if init.initializing.is_none() || condition_true(pod, "Initialized") {
        restarts = init.sidecar_restarts;
        last = init.last_sidecar.clone();
        let mut running = false;
        for cs in status.container_statuses.iter().flatten().rev() {
            restarts += cs.restart_count;
            later(&mut last, cs);
            let state = cs.state.clone().unwrap_or_default();
            if let Some(w) = state
                .waiting
                .as_ref()
                .and_then(|w| w.reason.clone())
                .filter(|r| !r.is_empty())
            {
                reason = w;
            } else if let Some(t) = &state.terminated {
                reason = terminated_reason(t.reason.as_deref(), t.signal, t.exit_code, "");
            } else if cs.ready && state.running.is_some() {
                running = true;
                ready += 1;
            }
        }
        if reason == "Completed" && running {
            reason = if condition_true(pod, "Ready") {
                "Running".into()
            } else {
                "NotReady".into()
            };
        }
    }
    if pod.metadata.deletion_timestamp.is_some() {
        if status.reason.as_deref() == Some("NodeLost") {
            reason = "Unknown".into();
        } else if phase != "Succeeded" && phase != "Failed" {
            reason = "Terminating".into();
        }
    }
    let restarts = match (&last, restarts) {
        (Some(t), n) if n != 0 => format!("{n} ({} ago)", super::table::age(Some(t), now)),
        (_, n) => n.to_string(),
    };
    PodRow {
        ready: format!("{ready}/{total}"),
        status: reason,
        restarts,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(yaml: &str) -> Pod {
        serde_yaml::from_str(yaml).unwrap()
    }

    fn now() -> jiff::Timestamp {
        "2026-12-04T12:00:00Z".parse().unwrap()
    }

    #[test]
    fn crash_loop_with_the_last_restart() {
        let p = pod(r#"
spec: {containers: [{name: c}]}
status:
  phase: Running
  containerStatuses:
  - name: c
    ready: false
    restartCount: 4
    image: i
    imageID: ""
    state: {waiting: {reason: CrashLoopBackOff}}
    lastState: {terminated: {exitCode: 1, reason: Error, finishedAt: "2026-12-04T11:59:00Z"}}
"#);
        let r = pod_row(&p, now());
        assert_eq!(
            (r.ready.as_str(), r.status.as_str()),
            ("0/1", "CrashLoopBackOff")
        );
        assert_eq!(r.restarts, "4 (60s ago)");
    }

    #[test]
    fn init_waiting_then_pod_initializing() {
        let mut p = pod(r#"
spec: {initContainers: [{name: i}], containers: [{name: c}]}
status:
  phase: Pending
  initContainerStatuses:
  - {name: i, ready: false, restartCount: 0, image: x, imageID: "", state: {running: {}}}
  containerStatuses:
  - {name: c, ready: false, restartCount: 0, image: x, imageID: "", state: {waiting: {reason: PodInitializing}}}
"#);
        assert_eq!(pod_row(&p, now()).status, "Init:0/1");
        let s = p.status.as_mut().unwrap();
        s.init_container_statuses.as_mut().unwrap()[0].state =
            Some(serde_yaml::from_str("terminated: {exitCode: 0, reason: Completed}").unwrap());
        assert_eq!(pod_row(&p, now()).status, "PodInitializing");
        s_fail(&mut p);
        assert_eq!(pod_row(&p, now()).status, "Init:Error");
    }

    fn s_fail(p: &mut Pod) {
        let s = p.status.as_mut().unwrap();
        s.init_container_statuses.as_mut().unwrap()[0].state =
            Some(serde_yaml::from_str("terminated: {exitCode: 2, reason: Error}").unwrap());
    }

    #[test]
    fn oom_killed_completed_evicted_terminating() {
        let base = |state: &str, phase: &str| {
            pod(&format!(
                "spec: {{containers: [{{name: c}}]}}\nstatus:\n  phase: {phase}\n  containerStatuses:\n  - {{name: c, ready: false, restartCount: 0, image: x, imageID: \"\", state: {state}}}\n"
            ))
        };
        assert_eq!(
            pod_row(
                &base("{terminated: {exitCode: 137, reason: OOMKilled}}", "Failed"),
                now()
            )
            .status,
            "OOMKilled"
        );
        assert_eq!(
            pod_row(
                &base(
                    "{terminated: {exitCode: 0, reason: Completed}}",
                    "Succeeded"
                ),
                now()
            )
            .status,
            "Completed"
        );
        assert_eq!(
            pod_row(&base("{terminated: {exitCode: 3}}", "Failed"), now()).status,
            "ExitCode:3"
        );
        let mut evicted =
            pod("spec: {containers: [{name: c}]}\nstatus: {phase: Failed, reason: Evicted}\n");
        assert_eq!(pod_row(&evicted, now()).status, "Evicted");
        evicted.metadata.deletion_timestamp = Some(Time(now()));
        assert_eq!(
            pod_row(&evicted, now()).status,
            "Evicted",
            "a terminal pod is not Terminating"
        );
        let mut running = base("{running: {}}", "Running");
        running
            .status
            .as_mut()
            .unwrap()
            .container_statuses
            .as_mut()
            .unwrap()[0]
            .ready = true;
        assert_eq!(pod_row(&running, now()).ready, "1/1");
        running.metadata.deletion_timestamp = Some(Time(now()));
        assert_eq!(pod_row(&running, now()).status, "Terminating");
    }

    #[test]
    fn a_started_sidecar_counts_as_a_container() {
        let p = pod(r#"
spec: {initContainers: [{name: s, restartPolicy: Always}], containers: [{name: c}]}
status:
  phase: Running
  conditions: [{type: Initialized, status: "True"}]
  initContainerStatuses:
  - {name: s, ready: true, started: true, restartCount: 1, image: x, imageID: "", state: {running: {}}}
  containerStatuses:
  - {name: c, ready: true, restartCount: 0, image: x, imageID: "", state: {running: {}}}
"#);
        let r = pod_row(&p, now());
        assert_eq!(
            (r.ready.as_str(), r.status.as_str(), r.restarts.as_str()),
            ("2/2", "Running", "1")
        );
    }
}
