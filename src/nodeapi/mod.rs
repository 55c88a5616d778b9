//! The node API on `address:port` (kubelet's server on 10250, `pkg/kubelet/server`): what the
//! API server proxies `kubectl logs`, `exec`, `attach` and `port-forward` to, and what
//! Prometheus scrapes. HTTPS with kubelet's authentication and authorization ([`auth`], [`tls`]);
//! paths:
//!
//! - `/healthz`, `/pods`, `/metrics`, `/metrics/probes` (what the loopback healthz listener
//!   serves, [`crate::server`]), `/runningpods/` (the runtime's pods as a `PodList`),
//!   `/configz` (the configuration, `{"kubeletconfig": …}`), `/stats/summary` and
//!   `/metrics/resource` ([`stats`]), `/metrics/cadvisor` ([`cadvisor`]);
//! - with `enableDebuggingHandlers` (default true): `/containerLogs/{ns}/{pod}/{container}`
//!   ([`logs`]), `/exec/{ns}/{pod}[/{uid}]/{container}`, `/attach/…`,
//!   `/portForward/{ns}/{pod}[/{uid}]` ([`streaming`]), `/run/{ns}/{pod}[/{uid}]/{container}`
//!   (a command's output through CRI `ExecSync`).
//!
//! An unknown pod or container is 404 naming it; a bad parameter 400 naming it. A client that
//! connects and sends nothing is cut after [`HEADER_TIMEOUT`] (TLS handshake and request head
//! each), on its own task: it blocks no one else.

pub mod auth;
pub mod cadvisor;
pub mod cgroup_stats;
pub mod local;
pub mod logs;
pub mod network_stats;
pub mod rootfs_cache;
pub mod stats;
pub mod storage_stats;
pub mod streaming;
pub mod tls;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Query, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use k8s_openapi::api::core::v1::Pod;
use rustls_pki_types::CertificateDer;
use tower::ServiceExt;
use tracing::{debug, info, warn};

use crate::cri::api as cri;
use crate::cri::{Cri, RuntimeService};
use crate::status::StatusManager;
use auth::{Auth, AuthError};
use streaming::plain;

/// Longest a client may take for its TLS handshake, and then for its request head.
pub const HEADER_TIMEOUT: Duration = crate::server::HEADER_TIMEOUT;

/// What the node API serves from.
#[derive(Clone)]
pub struct NodeApi {
    /// Desired pods with their statuses (lookups by namespace and name).
    pub status: StatusManager,
    /// The runtime (streaming calls, sandboxes, `/runningpods/`).
    pub cri: Cri,
    /// Node facts and paths (the pods' log directories).
    pub settings: Arc<crate::kuberuntime::Settings>,
    /// The configuration as loaded, for `/configz`.
    pub configz: Arc<serde_json::Value>,
    /// `enableDebuggingHandlers`: logs, exec, attach, port-forward, run.
    pub debugging: bool,
    /// Where pods' cgroups are (`/local/node` on the local socket, for `nodelet describe`).
    pub layout: crate::cm::CgroupLayout,
}

/// Usage of the node, its pods and containers (`/stats/summary`, `/metrics/resource`,
/// `/metrics/cadvisor`), once the runtime has answered: the read-only port serves from before
/// that, and answers 503 until it is filled.
pub type StatsSlot = Arc<std::sync::OnceLock<Arc<stats::Stats>>>;

/// The stats paths, served from `slot`: what both the node API and the read-only port
/// (`readOnlyPort`, no authentication, as kubelet's) serve.
pub fn stats_router(slot: StatsSlot) -> Router {
    Router::new()
        .route("/stats/summary", get(summary).post(summary))
        .route("/metrics/resource", get(resource_metrics))
        .route("/metrics/cadvisor", get(cadvisor_metrics))
        .with_state(slot)
}

/// The stats of `slot`, or the 503 to answer while the runtime has not answered yet.
fn stats_of(slot: &StatsSlot) -> Result<Arc<stats::Stats>, Refusal> {
    slot.get().cloned().ok_or_else(|| {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "stats are served once the container runtime answers\n".to_owned(),
        )
    })
}

/// A request refused: its status and message.
type Refusal = (StatusCode, String);

/// The client's certificate chain, as the TLS handshake gave it (empty: none).
#[derive(Clone, Default)]
pub struct Peer(pub Arc<Vec<CertificateDer<'static>>>);

/// The router: [`routes`], every one behind `auth`.
pub fn router(
    api: NodeApi,
    healthz: crate::server::ServerState,
    stats: StatsSlot,
    auth: Arc<Auth>,
) -> Router {
    routes(api, healthz, stats).layer(axum::middleware::from_fn_with_state(auth, authenticate))
}

/// The node API's paths without authentication: the loopback listener's paths, the stats of
/// `stats`, the node's own (the debugging handlers when `api.debugging`). What [`router`] puts
/// behind kubelet's authentication, and [`local`] behind the socket's owner check.
pub fn routes(api: NodeApi, healthz: crate::server::ServerState, stats: StatsSlot) -> Router {
    let mut own = Router::new()
        .route("/runningpods/", get(running_pods))
        .route("/configz", get(configz));
    if api.debugging {
        own = own
            .route("/containerLogs/{ns}/{pod}/{container}", get(container_logs))
            .route("/exec/{ns}/{pod}/{container}", streaming())
            .route("/exec/{ns}/{pod}/{uid}/{container}", streaming())
            .route("/attach/{ns}/{pod}/{container}", streaming())
            .route("/attach/{ns}/{pod}/{uid}/{container}", streaming())
            .route("/run/{ns}/{pod}/{container}", post(run_in_container))
            .route("/run/{ns}/{pod}/{uid}/{container}", post(run_in_container))
            .route("/portForward/{ns}/{pod}", forwarding())
            .route("/portForward/{ns}/{pod}/{uid}", forwarding());
    }
    crate::server::router(healthz)
        .merge(stats_router(stats))
        .merge(own.with_state(api))
}

/// GET and POST of exec and attach (SPDY clients POST, WebSocket clients GET).
fn streaming() -> axum::routing::MethodRouter<NodeApi> {
    get(exec_or_attach).post(exec_or_attach)
}

/// GET and POST of port-forward.
fn forwarding() -> axum::routing::MethodRouter<NodeApi> {
    get(port_forward).post(port_forward)
}

/// kubelet's filter: authenticate (401 `Unauthorized`), then authorize (403 with kubelet's
/// message, 500 when the API server cannot be asked).
async fn authenticate(State(auth): State<Arc<Auth>>, req: Request, next: Next) -> Response {
    let chain = req.extensions().get::<Peer>().cloned().unwrap_or_default();
    let bearer = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let user = match auth.authenticate(&chain.0, bearer).await {
        Ok(u) => u,
        Err(e) => return plain(StatusCode::UNAUTHORIZED, e.to_string()),
    };
    match auth
        .authorize(&user, req.method().as_str(), req.uri().path())
        .await
    {
        Ok(()) => {
            debug!(user = %user.name, method = %req.method(), path = %req.uri().path(), "node API request");
            next.run(req).await
        }
        Err(AuthError::Forbidden(m)) => plain(StatusCode::FORBIDDEN, m),
        Err(e) => plain(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// Serves `app` over TLS on `listener` until the task is dropped: each connection on its own
/// task, at most [`crate::server::MAX_CONNECTIONS`] at once (a follow holds one for as long as
/// it runs; an exec, attach or port-forward gives its back once its upgraded connection is
/// handed to the relay), its handshake and request head bounded by [`HEADER_TIMEOUT`], upgrades
/// allowed.
pub async fn serve(listener: tokio::net::TcpListener, tls: Arc<rustls::ServerConfig>, app: Router) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let slots = crate::server::ConnectionSlots::default();
    loop {
        let (tcp, from) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // Out of descriptors, say: a moment for connections to close.
                warn!(error = %e, "node API: accept failed");
                crate::clock::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Some(slot) = slots.take(&from) else {
            continue;
        };
        // Relayed streams carry small frames: no Nagle delay (see streaming::proxy).
        let _ = tcp.set_nodelay(true);
        let (acceptor, app) = (acceptor.clone(), app.clone());
        tokio::spawn(async move {
            serve_connection(tcp, from, acceptor, app).await;
            drop(slot);
        });
    }
}

async fn serve_connection(
    tcp: tokio::net::TcpStream,
    from: SocketAddr,
    acceptor: tokio_rustls::TlsAcceptor,
    app: Router,
) {
    let tls = match tokio::time::timeout(HEADER_TIMEOUT, acceptor.accept(tcp)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            debug!(%from, error = %e, "node API: TLS handshake failed");
            return;
        }
        Err(_) => {
            debug!(%from, "node API: TLS handshake timed out");
            return;
        }
    };
    let chain: Vec<CertificateDer<'static>> = tls
        .get_ref()
        .1
        .peer_certificates()
        .map(|c| c.iter().map(|c| c.clone().into_owned()).collect())
        .unwrap_or_default();
    let peer = Peer(Arc::new(chain));
    let service =
        hyper::service::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
            req.extensions_mut().insert(peer.clone());
            app.clone().oneshot(req.map(axum::body::Body::new))
        });
    let served = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .serve_connection(TokioIo::new(tls), service)
        .with_upgrades()
        .await;
    if let Err(e) = served {
        debug!(%from, error = %e, "node API: connection ended");
    }
}

/// Serves the node API on `listener` (bound, non-blocking) on `rt`; returns its address.
///
/// Errors: the listener cannot join the runtime.
pub fn start(
    rt: &tokio::runtime::Runtime,
    listener: std::net::TcpListener,
    tls: Arc<rustls::ServerConfig>,
    app: Router,
) -> Result<SocketAddr, String> {
    let listener = {
        let _runtime = rt.enter();
        tokio::net::TcpListener::from_std(listener)
            .map_err(|e| format!("node API: cannot serve its port: {e}"))?
    };
    let bound = listener.local_addr().map_err(|e| e.to_string())?;
    rt.spawn(serve(listener, tls, app));
    info!(address = %bound, "node API: serving HTTPS");
    Ok(bound)
}

impl NodeApi {
    /// The desired pod `ns/name` (with `uid` when given).
    ///
    /// Errors: 404 naming it.
    fn pod(&self, ns: &str, name: &str, uid: Option<&str>) -> Result<Pod, Refusal> {
        self.status
            .pods_where(|p| {
                p.metadata.namespace.as_deref().unwrap_or("default") == ns
                    && p.metadata.name.as_deref() == Some(name)
                    && uid.is_none_or(|u| p.metadata.uid.as_deref() == Some(u))
            })
            .into_iter()
            .next()
            .ok_or_else(|| {
                (
                    StatusCode::NOT_FOUND,
                    format!("pod {ns}/{name} does not exist\n"),
                )
            })
    }
}

/// The container `name` of `pod` (an app, init or ephemeral container, as kubelet's
/// `validateContainerLogStatus` looks for it): what its status says of its instances, and its
/// runtime ID (empty before it ran).
///
/// Errors: 404 naming the container and the pod.
fn container_of(pod: &Pod, name: &str) -> Result<(logs::Instances, String), Refusal> {
    let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
    let in_spec = pod.spec.iter().any(|s| {
        s.containers
            .iter()
            .chain(s.init_containers.iter().flatten())
            .any(|c| c.name == name)
            || s.ephemeral_containers
                .iter()
                .flatten()
                .any(|c| c.name == name)
    });
    if !in_spec {
        return Err((
            StatusCode::NOT_FOUND,
            format!("container {name:?} not found in pod {pod_name:?}\n"),
        ));
    }
    let st = pod.status.as_ref().and_then(|s| {
        s.container_statuses
            .iter()
            .flatten()
            .chain(s.init_container_statuses.iter().flatten())
            .chain(s.ephemeral_container_statuses.iter().flatten())
            .find(|c| c.name == name)
            .cloned()
    });
    let instances = logs::Instances {
        restart: st.as_ref().map_or(0, |c| c.restart_count),
        waiting: st
            .as_ref()
            .and_then(|c| c.state.as_ref())
            .is_none_or(|s| s.waiting.is_some()),
        last_terminated: st
            .as_ref()
            .and_then(|c| c.last_state.as_ref())
            .is_some_and(|l| l.terminated.is_some()),
    };
    let id = st
        .and_then(|c| c.container_id)
        .map(|id| {
            id.split_once("://")
                .map_or(id.clone(), |(_, i)| i.to_owned())
        })
        .unwrap_or_default();
    Ok((instances, id))
}

async fn container_logs(
    State(api): State<NodeApi>,
    Path((ns, name, container)): Path<(String, String, String)>,
    Query(params): Query<Vec<(String, String)>>,
) -> Response {
    let options = match logs::parse_options(&params, crate::clock::system().epoch_ns()) {
        Ok(o) => o,
        Err(m) => return plain(StatusCode::BAD_REQUEST, m),
    };
    let pod = match api.pod(&ns, &name, None) {
        Ok(p) => p,
        Err((code, m)) => return plain(code, m),
    };
    let (instances, id) = match container_of(&pod, &container) {
        Ok(c) => c,
        Err((code, m)) => return plain(code, m),
    };
    let dir = crate::kuberuntime::sandbox::pod_logs_dir(&api.settings, &pod);
    let path: PathBuf = match logs::log_file(&dir, &pod, &container, instances, options.previous) {
        Ok(p) => p,
        Err((code, m)) => return plain(code, m),
    };
    let (status, uid) = (
        api.status.clone(),
        pod.metadata.uid.clone().unwrap_or_default(),
    );
    // The instance being read: a restart starts a new file, and ends this one's follow.
    let (c, following) = (container.clone(), (!options.previous).then_some(id));
    let running = Box::new(move || {
        status.get(&uid).is_some_and(|s| {
            s.container_statuses
                .iter()
                .flatten()
                .chain(s.init_container_statuses.iter().flatten())
                .any(|cs| {
                    cs.name == c
                        && cs.state.as_ref().is_some_and(|st| st.running.is_some())
                        && following.as_deref().is_some_and(|id| {
                            cs.container_id
                                .as_deref()
                                .is_some_and(|cid| cid.ends_with(id))
                        })
                })
        })
    });
    let body = logs::stream(logs::LogRequest {
        path,
        options,
        running,
    });
    let mut r = Response::new(body);
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("text/plain"),
    );
    r
}

/// Exec or attach into `container` of pod `ns/name`: the CRI call, then the relay.
async fn stream_into(
    api: NodeApi,
    (ns, name, uid, container): (String, String, Option<String>, String),
    attach: bool,
    req: Request,
) -> Response {
    let params = query_params(&req);
    let o = match streaming::stream_options(&params) {
        Ok(o) => o,
        Err(m) => return plain(StatusCode::BAD_REQUEST, m),
    };
    let id = match running_target(&api, &ns, &name, uid.as_deref(), &container).await {
        Ok(id) => id,
        Err(r) => return r,
    };
    let url = if attach {
        api.cri
            .attach(cri::AttachRequest {
                container_id: id,
                stdin: o.stdin,
                tty: o.tty,
                stdout: o.stdout,
                stderr: o.stderr,
            })
            .await
    } else {
        if o.command.is_empty() {
            return plain(StatusCode::BAD_REQUEST, "command: at least one is required");
        }
        api.cri
            .exec(cri::ExecRequest {
                container_id: id,
                cmd: o.command,
                tty: o.tty,
                stdin: o.stdin,
                stdout: o.stdout,
                stderr: o.stderr,
            })
            .await
    };
    match url {
        Ok(url) => streaming::proxy(req, &url).await,
        Err(e) => cri_error(e),
    }
}

/// The ID of the running instance of `container` of pod `ns/name` (of UID `uid` when given),
/// or the answer to give: 404 naming an unknown pod or container, 400 when it is not running,
/// the runtime's error.
async fn running_target(
    api: &NodeApi,
    ns: &str,
    name: &str,
    uid: Option<&str>,
    container: &str,
) -> Result<String, Response> {
    let pod = api.pod(ns, name, uid).map_err(|(code, m)| plain(code, m))?;
    container_of(&pod, container).map_err(|(code, m)| plain(code, m))?;
    // The running instance as the runtime lists it (kubelet's `findContainer` reads the runtime,
    // not the status, which follows it by up to a relist).
    match running_container(&api.cri, &pod, container).await {
        Ok(Some(id)) => Ok(id),
        Ok(None) => Err(plain(
            StatusCode::BAD_REQUEST,
            format!("container {container:?} in pod {name:?} is not running\n"),
        )),
        Err(e) => Err(cri_error(e)),
    }
}

/// `POST /run/{ns}/{pod}[/{uid}]/{container}?cmd=…` (kubelet's `handleRun`): runs `cmd`, split
/// on spaces, in the running container through CRI `ExecSync` (no time limit, as kubelet's
/// `RunInContainer`) and answers 200 with its stdout followed by its stderr. A command that
/// exits non-zero: 500 with kubelet's `command '…' exited with N: <output>`. No `cmd`: 400.
async fn run_in_container(
    State(api): State<NodeApi>,
    Path(p): Path<HashMap<String, String>>,
    req: Request,
) -> Response {
    let get = |k: &str| p.get(k).cloned().unwrap_or_default();
    let params = query_params(&req);
    let cmd: Vec<String> = params
        .iter()
        .find(|(k, _)| k == "cmd")
        .map(|(_, v)| {
            v.split(' ')
                .filter(|w| !w.is_empty())
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    if cmd.is_empty() {
        return plain(StatusCode::BAD_REQUEST, "cmd: a command is required\n");
    }
    let id = match running_target(
        &api,
        &get("ns"),
        &get("pod"),
        p.get("uid").map(String::as_str),
        &get("container"),
    )
    .await
    {
        Ok(id) => id,
        Err(r) => return r,
    };
    match api.cri.exec_sync(&id, cmd.clone(), Duration::ZERO).await {
        Ok(r) => {
            let mut out = r.stdout;
            out.extend_from_slice(&r.stderr);
            if r.exit_code == 0 {
                (StatusCode::OK, out).into_response()
            } else {
                plain(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!(
                        "command '{}' exited with {}: {}",
                        cmd.join(" "),
                        r.exit_code,
                        String::from_utf8_lossy(&out)
                    ),
                )
            }
        }
        Err(e) => cri_error(e),
    }
}

/// The ID of the running instance of `container` of `pod`, from the runtime's listing.
///
/// Errors: the listing failed.
async fn running_container(
    cri: &Cri,
    pod: &Pod,
    container: &str,
) -> Result<Option<String>, crate::cri::CriError> {
    use crate::kuberuntime::labels;
    let filter = [
        (
            labels::POD_UID.to_owned(),
            crate::pod::pod_uid(pod).to_owned(),
        ),
        (labels::CONTAINER_NAME.to_owned(), container.to_owned()),
    ]
    .into_iter()
    .collect();
    Ok(cri
        .list_containers(filter)
        .await?
        .into_iter()
        .filter(|c| c.state == cri::ContainerState::ContainerRunning as i32)
        .max_by_key(|c| c.created_at)
        .map(|c| c.id))
}

/// The request's query parameters, repeated ones in order (none when it cannot be decoded).
fn query_params(req: &Request) -> Vec<(String, String)> {
    req.uri()
        .query()
        .map(|q| serde_urlencoded::from_str(q).unwrap_or_default())
        .unwrap_or_default()
}

/// A Prometheus text answer, or the CRI error that kept it from being made.
fn prometheus_text(text: crate::cri::CriResult<String>) -> Response {
    match text {
        Ok(text) => {
            let mut r = Response::new(axum::body::Body::from(text));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                axum::http::HeaderValue::from_static("text/plain; version=0.0.4"),
            );
            r
        }
        Err(e) => cri_error(e),
    }
}

/// A CRI error as kubelet's `streaming.WriteError` maps it.
fn cri_error(e: crate::cri::CriError) -> Response {
    let code = match e.code {
        tonic::Code::NotFound => StatusCode::NOT_FOUND,
        tonic::Code::InvalidArgument => StatusCode::BAD_REQUEST,
        tonic::Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        tonic::Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    plain(code, e.to_string())
}

/// `/exec/…` and `/attach/…`, with or without the pod's UID in the path.
async fn exec_or_attach(
    State(api): State<NodeApi>,
    Path(p): Path<HashMap<String, String>>,
    req: Request,
) -> Response {
    let attach = req.uri().path().starts_with("/attach/");
    let get = |k: &str| p.get(k).cloned().unwrap_or_default();
    let target = (
        get("ns"),
        get("pod"),
        p.get("uid").cloned(),
        get("container"),
    );
    stream_into(api, target, attach, req).await
}

/// Port-forward into pod `ns/name`'s sandbox: the CRI call with the `port` parameters (empty
/// for SPDY: the client names a port per stream), then the relay.
async fn forward(
    api: NodeApi,
    ns: String,
    name: String,
    uid: Option<String>,
    req: Request,
) -> Response {
    let params = query_params(&req);
    let ports = match streaming::ports(&params) {
        Ok(p) => p,
        Err(m) => return plain(StatusCode::BAD_REQUEST, m),
    };
    // Over a WebSocket the ports come only from the query (SPDY names one per stream), as
    // kubelet's websocket port-forward requires them.
    if ports.is_empty() && streaming::is_websocket(req.headers()) {
        return plain(
            StatusCode::BAD_REQUEST,
            "query parameter \"port\" is required".to_owned(),
        );
    }
    let pod = match api.pod(&ns, &name, uid.as_deref()) {
        Ok(p) => p,
        Err((code, m)) => return plain(code, m),
    };
    let pod_uid = pod.metadata.uid.clone().unwrap_or_default();
    let sandboxes = api
        .cri
        .list_pod_sandbox(
            [(crate::kuberuntime::labels::POD_UID.to_owned(), pod_uid)]
                .into_iter()
                .collect(),
        )
        .await;
    let sandbox = match sandboxes {
        Ok(list) => list
            .into_iter()
            .filter(|s| s.state == cri::PodSandboxState::SandboxReady as i32)
            .max_by_key(|s| s.created_at),
        Err(e) => return cri_error(e),
    };
    let Some(sandbox) = sandbox else {
        return plain(
            StatusCode::BAD_REQUEST,
            format!("pod {ns}/{name} has no running sandbox\n"),
        );
    };
    match api
        .cri
        .port_forward(cri::PortForwardRequest {
            pod_sandbox_id: sandbox.id,
            port: ports,
        })
        .await
    {
        Ok(url) => streaming::proxy(req, &url).await,
        Err(e) => cri_error(e),
    }
}

/// `/portForward/…`, with or without the pod's UID in the path.
async fn port_forward(
    State(api): State<NodeApi>,
    Path(p): Path<HashMap<String, String>>,
    req: Request,
) -> Response {
    let get = |k: &str| p.get(k).cloned().unwrap_or_default();
    forward(api, get("ns"), get("pod"), p.get("uid").cloned(), req).await
}

/// `/runningpods/`: the runtime's pods of this node as a `PodList` (kubelet's: "used for
/// testing only").
async fn running_pods(State(api): State<NodeApi>) -> Response {
    let listed =
        crate::kuberuntime::status::list_runtime_pods(&api.cri, &api.settings.node_name).await;
    match listed {
        Ok(pods) => {
            let items: Vec<Pod> = pods.ours.iter().map(|p| p.to_pod()).collect();
            axum::Json(serde_json::json!({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items}))
                .into_response()
        }
        Err(e) => cri_error(e),
    }
}

/// `/stats/summary` ([`stats::Stats::summary`]).
async fn summary(State(slot): State<StatsSlot>, req: Request) -> Response {
    let stats = match stats_of(&slot) {
        Ok(s) => s,
        Err((code, m)) => return plain(code, m),
    };
    // kubelet's rule: exactly one `only_cpu_and_memory`, and it says "true".
    let params = query_params(&req);
    let only: Vec<&str> = params
        .iter()
        .filter(|(k, _)| k == "only_cpu_and_memory")
        .map(|(_, v)| v.as_str())
        .collect();
    match stats
        .summary(crate::clock::system().epoch_ns(), only == ["true"])
        .await
    {
        Ok(v) => axum::Json(v).into_response(),
        Err(e) => cri_error(e),
    }
}

/// `/metrics/resource` ([`stats::Stats::resource_metrics`]).
async fn resource_metrics(State(slot): State<StatsSlot>) -> Response {
    match stats_of(&slot) {
        Ok(s) => prometheus_text(s.resource_metrics(crate::clock::system().epoch_ns()).await),
        Err((code, m)) => plain(code, m),
    }
}

/// `/metrics/cadvisor` ([`stats::Stats::cadvisor_metrics`]).
async fn cadvisor_metrics(State(slot): State<StatsSlot>) -> Response {
    let now_ms = crate::clock::system().epoch_ns() / 1_000_000;
    match stats_of(&slot) {
        Ok(s) => prometheus_text(s.cadvisor_metrics(now_ms).await),
        Err((code, m)) => plain(code, m),
    }
}

/// `/configz`: the configuration as loaded, defaults filled in (kubelet's
/// `{"kubeletconfig": …}`).
async fn configz(State(api): State<NodeApi>) -> Response {
    axum::Json(serde_json::json!({ "kubeletconfig": *api.configz })).into_response()
}
