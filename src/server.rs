//! The agent's HTTP endpoints on `healthzBindAddress:healthzPort` (kubelet's healthz listener and
//! read-only server): `GET /healthz`, `GET /pods` (a v1 PodList with status), `GET /node` (node
//! pressure conditions, eviction signals and recent evictions), `GET /metrics`
//! (OpenMetrics text, which Prometheus scrapes natively), `GET /metrics/probes` (the prober's
//! metrics, apart as kubelet serves them) and `GET /events` (in memory: the last
//! 1000 since the agent started).
//!
//! Each listener serves at most [`MAX_CONNECTIONS`] connections at once (one more is closed at
//! once) and cuts a client that takes longer than [`HEADER_TIMEOUT`] to send a request head,
//! an idle keep-alive connection included: these ports need no credentials, and a client
//! holding thousands of connections open must not take the agent's descriptors (which its
//! sources and the runtime need).

use std::sync::Arc;

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};

use crate::events::Recorder;
use crate::metrics::Metrics;
use crate::status::StatusManager;

/// What the endpoints read.
#[derive(Clone)]
pub struct ServerState {
    /// Pod statuses.
    pub status: StatusManager,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Events.
    pub recorder: Recorder,
    /// The PLEG, once started: its relist age decides `/healthz`.
    pub pleg: Arc<std::sync::OnceLock<Arc<crate::pleg::Pleg>>>,
    /// Node pressure from the eviction manager (`/node`).
    pub pressure: crate::eviction::NodePressure,
    /// Whether the container runtime answers (`/healthz`, the Ready condition on `/node`).
    pub runtime: crate::runtime_state::RuntimeState,
}

/// `ok`, or 500 with the reasons: the PLEG has not relisted within its threshold, or not yet at
/// all (kubelet's healthz with its PLEG check: it fails until the runtime has been listed); the
/// container runtime does not answer ([`crate::runtime_state`]).
async fn healthz(State(s): State<ServerState>) -> (StatusCode, String) {
    let health = match s.pleg.get() {
        Some(p) => p.healthy(crate::clock::monotonic_now()),
        None => Err("pleg has yet to be successful (waiting for the container runtime)".into()),
    };
    let mut failed = String::new();
    if let Err(msg) = health {
        failed.push_str(&format!("[-]pleg failed: {msg}\n"));
    }
    if let Err(msg) = s.runtime.health() {
        failed.push_str(&format!("[-]runtime failed: {msg}\n"));
    }
    if failed.is_empty() {
        (StatusCode::OK, "ok".into())
    } else {
        (StatusCode::INTERNAL_SERVER_ERROR, failed)
    }
}

async fn pods(State(s): State<ServerState>) -> impl IntoResponse {
    Json(serde_json::json!({
        "kind": "PodList",
        "apiVersion": "v1",
        "metadata": {},
        "items": s.status.pods(),
    }))
}

async fn metrics(State(s): State<ServerState>) -> impl IntoResponse {
    (
        // prometheus-client writes the OpenMetrics text format (`_total` samples, `# EOF`).
        [(
            CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        s.metrics.encode(),
    )
}

async fn probe_metrics(State(s): State<ServerState>) -> impl IntoResponse {
    (
        [(
            CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        s.metrics.encode_probes(),
    )
}

/// kubelet's reasons on the node conditions (`nodestatus.MemoryPressureCondition` and friends).
fn condition_reason(condition: &str, on: bool) -> &'static str {
    match (condition, on) {
        ("MemoryPressure", true) => "KubeletHasInsufficientMemory",
        ("MemoryPressure", false) => "KubeletHasSufficientMemory",
        ("DiskPressure", true) => "KubeletHasDiskPressure",
        ("DiskPressure", false) => "KubeletHasNoDiskPressure",
        ("PIDPressure", true) => "KubeletHasInsufficientPID",
        _ => "KubeletHasSufficientPID",
    }
}

/// `GET /node`: the node's pressure conditions and its Ready condition (as `status.conditions`
/// entries of a v1 Node), the latest eviction signals, the thresholds in force, the recent
/// evictions and the recent reclaims of node-level resources under disk pressure.
async fn node(State(s): State<ServerState>) -> impl IntoResponse {
    let v = s.pressure.view();
    let mut conditions: Vec<serde_json::Value> = v
        .conditions
        .iter()
        .map(|(c, on)| {
            serde_json::json!({
                "type": c,
                "status": if *on { "True" } else { "False" },
                "reason": condition_reason(c, *on),
            })
        })
        .collect();
    // kubelet's Ready condition, from the runtime's health and the node's shutdown.
    conditions.push(match s.runtime.ready() {
        Ok(()) => serde_json::json!({
            "type": "Ready",
            "status": "True",
            "reason": "KubeletReady",
            "message": "kubelet is posting ready status",
        }),
        Err(msg) => serde_json::json!({
            "type": "Ready",
            "status": "False",
            "reason": "KubeletNotReady",
            "message": msg,
        }),
    });
    Json(serde_json::json!({
        "kind": "NodePressure",
        "conditions": conditions,
        "signals": v.signals,
        "thresholds": v.thresholds,
        "evictions": v.evictions,
        "reclaims": v.reclaims,
    }))
}

async fn events(State(s): State<ServerState>) -> impl IntoResponse {
    Json(serde_json::json!({ "kind": "EventList", "items": s.recorder.list() }))
}

/// The router with every endpoint.
pub fn router(state: ServerState) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/pods", get(pods))
        .route("/node", get(node))
        .route("/metrics", get(metrics))
        .route("/metrics/probes", get(probe_metrics))
        .route("/events", get(events))
        .with_state(state)
}

/// Longest a client may take to send a request head, waiting for the next one on a kept-alive
/// connection included (the node API's [`crate::nodeapi::HEADER_TIMEOUT`] too).
pub const HEADER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Most connections one listener serves at once.
pub const MAX_CONNECTIONS: usize = 512;

/// Binds `addr` and serves `app` (the [`router`], perhaps with more) until the task is
/// dropped, each connection on its own task, at most [`MAX_CONNECTIONS`] at once, request heads
/// bounded by [`HEADER_TIMEOUT`].
///
/// Errors: the bind error (address in use, permission denied).
pub fn serve(
    listener: std::net::TcpListener,
    app: Router,
) -> std::io::Result<impl std::future::Future<Output = std::io::Result<()>>> {
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let addr = listener.local_addr()?;
    Ok(async move {
        let slots = ConnectionSlots::default();
        loop {
            let (tcp, from) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    // Out of descriptors, say: a moment for connections to close.
                    tracing::warn!(%addr, error = %e, "accept failed");
                    crate::clock::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            };
            let Some(slot) = slots.take(&from) else {
                continue;
            };
            let app = app.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(
                    move |req: hyper::Request<hyper::body::Incoming>| {
                        tower::ServiceExt::oneshot(app.clone(), req.map(axum::body::Body::new))
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(HEADER_TIMEOUT)
                    .serve_connection(hyper_util::rt::TokioIo::new(tcp), service)
                    .await;
                drop(slot);
            });
        }
    })
}

/// The connections a listener may still take ([`MAX_CONNECTIONS`]); clones share them.
#[derive(Clone)]
pub struct ConnectionSlots(Arc<tokio::sync::Semaphore>);

impl Default for ConnectionSlots {
    fn default() -> Self {
        Self(Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS)))
    }
}

impl ConnectionSlots {
    /// A slot for the connection from `from`, held until dropped; `None` (the caller closes
    /// the connection) when every slot is taken.
    pub fn take(&self, from: &dyn std::fmt::Display) -> Option<tokio::sync::OwnedSemaphorePermit> {
        let slot = self.0.clone().try_acquire_owned().ok();
        if slot.is_none() {
            tracing::debug!(from = %from, limit = MAX_CONNECTIONS, "too many connections; closed");
        }
        slot
    }
}
