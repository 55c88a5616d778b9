//! The node API on a local socket, `<root-dir>/nodelet.sock`: what `nodelet get`, `describe`,
//! `logs`, `exec`, `top` and `events` ([`crate::cli`]) ask, on a node with no control plane and
//! no client certificate. No network exposure: a Unix socket of mode 0600, and every connection
//! whose peer (`SO_PEERCRED`) is neither root nor the agent's own user is closed before a byte
//! is read. kubelet has no such socket (its pod-resources socket under its root directory is
//! the nearest thing); the paths are the node API's ([`super::routes`], without kubelet's
//! authentication, which the owner check replaces) and one of its own:
//!
//! - `GET /local/node`: `{"name", "allocatable": {"cpuMillis", "memoryBytes"}, "cgroupDriver",
//!   "podCgroups": {uid: cgroup parent}}`, what `top node` and `describe` add to the API.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use hyper_util::rt::{TokioIo, TokioTimer};
use tower::ServiceExt;
use tracing::{debug, info, warn};

use super::NodeApi;

/// The socket's file name under `--root-dir`.
pub const SOCKET: &str = "nodelet.sock";

/// `<root_dir>/nodelet.sock`.
pub fn socket_path(root_dir: &Path) -> PathBuf {
    root_dir.join(SOCKET)
}

/// The local router: [`super::routes`] and `/local/node`.
pub fn router(
    api: NodeApi,
    healthz: crate::server::ServerState,
    stats: super::StatsSlot,
) -> Router {
    let local = Router::new()
        .route("/local/node", get(node))
        .with_state(api.clone());
    super::routes(api, healthz, stats).merge(local)
}

async fn node(State(api): State<NodeApi>) -> Json<serde_json::Value> {
    let cgroups: BTreeMap<String, String> = api
        .status
        .pods()
        .iter()
        .filter_map(|p| {
            let uid = p.metadata.uid.clone()?;
            let qos = crate::qos::pod_qos_class(p);
            Some((uid.clone(), api.layout.pod_cgroup_parent(&uid, qos)))
        })
        .collect();
    Json(serde_json::json!({
        "name": api.settings.node_name,
        "allocatable": {
            "cpuMillis": api.settings.allocatable.cpu_milli,
            "memoryBytes": api.settings.allocatable.memory,
        },
        "cgroupDriver": if api.layout.systemd { "systemd" } else { "cgroupfs" },
        "podCgroups": cgroups,
    }))
}

/// Claims `path` for this agent: binds it (mode 0600; a socket file left by an agent that is
/// gone is replaced). Called first at start-up, before the agent touches anything a running
/// agent owns (the cgroup tree), so that a second agent on the same `--root-dir` stops at once.
///
/// Errors: another agent answers on `path`, something other than a socket is there, or the
/// socket cannot be made; each naming the path.
pub fn claim(path: &Path) -> Result<std::os::unix::net::UnixListener, String> {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    if std::os::unix::net::UnixStream::connect(path).is_ok() {
        return Err(format!(
            "local socket {}: another nodelet answers on it; give this one another --root-dir",
            path.display()
        ));
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => std::fs::remove_file(path)
            .map_err(|e| format!("local socket {}: {e}", path.display()))?,
        Ok(_) => {
            return Err(format!(
                "local socket {}: something that is not a socket is there; move it away",
                path.display()
            ))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("local socket {}: {e}", path.display())),
    }
    let listener = std::os::unix::net::UnixListener::bind(path)
        .map_err(|e| format!("local socket {}: cannot listen: {e}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .and_then(|()| listener.set_nonblocking(true))
        .map_err(|e| format!("local socket {}: {e}", path.display()))?;
    Ok(listener)
}

/// The claimed socket's file, removed when this is dropped (the agent's last step on every way
/// out after [`claim`]), so that a stopped agent leaves no socket file behind (kubelet removes
/// its sockets as it stops; a later agent would replace the file anyway). Only a socket is
/// removed: whatever replaced it is left alone.
#[derive(Debug)]
pub struct SocketFile(pub PathBuf);

impl Drop for SocketFile {
    fn drop(&mut self) {
        use std::os::unix::fs::FileTypeExt;
        let is_socket = std::fs::symlink_metadata(&self.0).is_ok_and(|m| m.file_type().is_socket());
        if is_socket {
            if let Err(e) = std::fs::remove_file(&self.0) {
                warn!(socket = %self.0.display(), error = %e, "local socket: cannot remove it");
            }
        }
    }
}

/// Serves `app` on `listener` (from [`claim`]) on `rt`.
///
/// Errors: the listener cannot join the runtime.
pub fn start(
    rt: &tokio::runtime::Runtime,
    listener: std::os::unix::net::UnixListener,
    app: Router,
) -> Result<(), String> {
    let path = listener
        .local_addr()
        .ok()
        .and_then(|a| a.as_pathname().map(Path::to_owned))
        .unwrap_or_default();
    let listener = {
        let _guard = rt.enter();
        tokio::net::UnixListener::from_std(listener)
            .map_err(|e| format!("local socket {}: {e}", path.display()))?
    };
    rt.spawn(serve(listener, app));
    info!(socket = %path.display(), "local socket: serving the node API to root");
    Ok(())
}

/// Accepts connections from root or the agent's own user, each on its own task, at most
/// [`crate::server::MAX_CONNECTIONS`] at once.
async fn serve(listener: tokio::net::UnixListener, app: Router) {
    let slots = crate::server::ConnectionSlots::default();
    let own = nix::unistd::geteuid().as_raw();
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                warn!(error = %e, "local socket: accept failed");
                crate::clock::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let uid = stream.peer_cred().map(|c| c.uid()).ok();
        if !uid.is_some_and(|u| u == 0 || u == own) {
            debug!(
                ?uid,
                "local socket: a peer that is neither root nor the agent's user; closed"
            );
            continue;
        }
        let from = format!("local uid {}", uid.unwrap_or_default());
        let Some(slot) = slots.take(&from) else {
            continue;
        };
        let app = app.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: hyper::Request<_>| {
                app.clone().oneshot(req.map(axum::body::Body::new))
            });
            let served = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(super::HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service)
                .with_upgrades()
                .await;
            if let Err(e) = served {
                debug!(error = %e, "local socket: connection ended");
            }
            drop(slot);
        });
    }
}
