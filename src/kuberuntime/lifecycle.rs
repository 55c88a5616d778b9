//! Container lifecycle hooks (kubelet's `kuberuntime_container.go` and `lifecycle/handlers.go`):
//! postStart right after a container starts (a failure kills it: `FailedPostStartHook`), and
//! preStop before a container is stopped, its time taken out of the grace period (kubelet's
//! `killContainer`: the hook runs at most the grace period; the container then gets what is
//! left, but at least [`super::MIN_GRACE_PERIOD_SECONDS`], see [`super::kill::stop_timeout`]).

use k8s_openapi::api::core::v1::{Container, Pod};
use tracing::{info, warn};

use super::KubeRuntimeManager;
use crate::cri::CriRuntime;
use crate::pod::pod_ref;
use crate::prober::handlers::{self, Target};
use crate::prober::spec::{handler_of_hook, Handler};

fn hook(c: &Container, post_start: bool) -> Option<Handler> {
    let l = c.lifecycle.as_ref()?;
    let h = if post_start {
        &l.post_start
    } else {
        &l.pre_stop
    };
    handler_of_hook(h.as_ref()?).ok()?
}

/// kubelet's message for a failed hook (`handlerRunner.Run`): `Exec lifecycle hook ([sh -c
/// exit 1]) for Container "c" in Pod "p_ns(uid)" failed - error: <error>, message: "<output>"`
/// (`Http lifecycle hook (<path>) …` for an httpGet); `failure` is the error and message
/// ([`handlers::run_hook`]'s output).
fn failure_message(h: &Handler, c: &Container, pod: &Pod, failure: &str) -> String {
    let (kind, what) = match h {
        Handler::Exec(cmd) => ("Exec", format!("[{}]", cmd.join(" "))),
        Handler::Http(get) => ("Http", get.path.clone()),
        Handler::Sleep(d) => ("Sleep", crate::duration::format_go_duration(*d)),
        Handler::Tcp { .. } | Handler::Grpc { .. } => ("Unsupported", String::new()),
    };
    format!(
        "{kind} lifecycle hook ({what}) for Container {:?} in Pod {:?} failed - error: {failure}",
        c.name,
        crate::pod::format_pod(pod),
    )
}

impl<R: CriRuntime> KubeRuntimeManager<R> {
    /// Runs the container's postStart hook, if any. Errors: kubelet's message naming the hook,
    /// the container and the pod, after a `Warning FailedPostStartHook` event.
    pub(super) async fn run_post_start(
        &self,
        pod: &Pod,
        c: &Container,
        id: &str,
        pod_ips: &[String],
    ) -> Result<(), String> {
        let Some(h) = hook(c, true) else {
            return Ok(());
        };
        let host_network = super::sandbox::is_host_network(pod);
        let t = Target {
            container: c,
            container_id: id,
            pod_ips,
            host_network,
        };
        let out = handlers::run_hook(self.probes.handler_context(), &h, &t).await;
        if out.success {
            self.report_http_fallback(pod, &out);
            return Ok(());
        }
        let msg = failure_message(&h, c, pod, &out.output);
        warn!(pod = %pod_ref(pod), container = %c.name, error = %out.output, "postStart hook failed");
        self.recorder.warning(
            crate::events::Involved::container(pod, &c.name),
            "FailedPostStartHook",
            msg.clone(),
        );
        Err(msg)
    }

    /// Runs the container's preStop hook, if any, for at most `grace` seconds, and returns the
    /// whole seconds it took (0 without a hook), to be taken off the grace period
    /// ([`super::kill::stop_timeout`]). A failed hook is a `Warning FailedPreStopHook` event;
    /// the stop goes on.
    pub(super) async fn run_pre_stop(
        &self,
        pod: &Pod,
        c: &Container,
        id: &str,
        pod_ips: &[String],
        grace: i64,
    ) -> i64 {
        let Some(h) = hook(c, false) else {
            return 0;
        };
        let t = Target {
            container: c,
            container_id: id,
            pod_ips,
            host_network: super::sandbox::is_host_network(pod),
        };
        let started = crate::clock::monotonic_now();
        let limit = std::time::Duration::from_secs(u64::try_from(grace.max(0)).unwrap_or(0));
        let run = handlers::run_hook(self.probes.handler_context(), &h, &t);
        match tokio::time::timeout(limit, run).await {
            Ok(out) if !out.success => {
                let msg = failure_message(&h, c, pod, &out.output);
                warn!(pod = %pod_ref(pod), container = %c.name, error = %out.output, "preStop hook failed");
                self.recorder.warning(
                    crate::events::Involved::container(pod, &c.name),
                    "FailedPreStopHook",
                    msg,
                );
            }
            Ok(out) => self.report_http_fallback(pod, &out),
            Err(_) => {
                warn!(pod = %pod_ref(pod), container = %c.name, grace, "preStop hook did not finish within the grace period");
            }
        }
        let elapsed = i64::try_from(started.elapsed().as_secs()).unwrap_or(i64::MAX);
        info!(pod = %pod_ref(pod), container = %c.name, elapsed, grace, "preStop hook ran");
        elapsed
    }

    /// A hook that succeeded over HTTP after its HTTPS request got a plain HTTP answer: a
    /// `Warning LifecycleHTTPFallback` event and `kubelet_lifecycle_handler_http_fallbacks_total`,
    /// as kubelet reports it.
    fn report_http_fallback(&self, pod: &Pod, out: &handlers::Outcome) {
        if !out.warning {
            return;
        }
        warn!(pod = %pod_ref(pod), "{}", out.output);
        self.metrics.lifecycle_http_fallbacks.inc();
        self.recorder.warning(
            crate::events::Involved::pod(pod),
            "LifecycleHTTPFallback",
            out.output.clone(),
        );
    }
}
