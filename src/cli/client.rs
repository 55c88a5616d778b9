//! The command line's client of the agent: HTTP/1.1 over the local socket
//! ([`crate::nodeapi::local`]), one connection per request.

use std::path::{Path, PathBuf};

use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;

/// Why a command could not be answered.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// No agent answers on the socket.
    #[error("nodelet is not running: nothing answers on {} ({reason}); {start} (or give the --root-dir it runs with)", socket.display())]
    NotRunning {
        /// The socket tried.
        socket: PathBuf,
        /// What connecting said.
        reason: String,
        /// How to start it on this host ([`start_hint`]).
        start: &'static str,
    },
    /// The socket is there but this user may not use it.
    #[error("{}: {reason}; the local socket serves root only (try sudo)", socket.display())]
    Denied {
        /// The socket tried.
        socket: PathBuf,
        /// What connecting said.
        reason: String,
    },
    /// The agent answered with an error status (its message, which names what is wrong).
    #[error("{0}")]
    Refused(String),
    /// What the user asked for does not exist or is ambiguous (the message says what to give).
    #[error("{0}")]
    Usage(String),
    /// The connection failed midway, or an answer could not be read.
    #[error("{0}")]
    Io(String),
}

/// How to start the agent on this host: `systemctl start nodelet` where systemd runs the host
/// (`systemd_dir`, `/run/systemd/system`, exists: systemd's own `sd_booted` test), else a
/// sentence saying that systemctl will not do it here.
pub fn start_hint(systemd_dir: &Path) -> &'static str {
    if systemd_dir.is_dir() {
        "start it with `systemctl start nodelet`"
    } else {
        "start it the way this host runs it (the host was not booted with systemd, so not with systemctl; from nodelet's source tree, `scripts/up.sh`)"
    }
}

/// A client of the agent whose `--root-dir` is `root_dir`.
#[derive(Debug, Clone)]
pub struct Client {
    socket: PathBuf,
    timeout: std::time::Duration,
}

/// How long a request waits for the head of the agent's answer.
pub const ANSWER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

impl Client {
    /// The client of the agent serving `<root_dir>/nodelet.sock`.
    pub fn new(root_dir: &Path) -> Self {
        Client {
            socket: crate::nodeapi::local::socket_path(root_dir),
            timeout: ANSWER_TIMEOUT,
        }
    }

    /// The socket's path.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// A connected stream to the agent.
    ///
    /// Errors: [`CliError::NotRunning`] (no socket, nobody listening), [`CliError::Denied`].
    pub async fn connect(&self) -> Result<tokio::net::UnixStream, CliError> {
        tokio::net::UnixStream::connect(&self.socket)
            .await
            .map_err(|e| {
                let reason = e.to_string();
                let socket = self.socket.clone();
                match e.kind() {
                    std::io::ErrorKind::PermissionDenied => CliError::Denied { socket, reason },
                    _ => CliError::NotRunning {
                        socket,
                        reason,
                        start: start_hint(std::path::Path::new("/run/systemd/system")),
                    },
                }
            })
    }

    /// `GET path_and_query`: the response when its status is 2xx.
    ///
    /// Errors: as [`Client::connect`]; [`CliError::Refused`] with the agent's message for
    /// another status.
    pub async fn get(&self, path_and_query: &str) -> Result<hyper::Response<Incoming>, CliError> {
        self.request(hyper::Method::GET, path_and_query).await
    }

    /// `method path_and_query` with an empty body; as [`Client::get`]. The response's head
    /// must come within [`ANSWER_TIMEOUT`] (a stream's body may take as long as it takes).
    ///
    /// Errors: also [`CliError::Io`] when the agent does not answer in time.
    pub async fn request(
        &self,
        method: hyper::Method,
        path_and_query: &str,
    ) -> Result<hyper::Response<Incoming>, CliError> {
        match tokio::time::timeout(self.timeout, self.request_now(method, path_and_query)).await {
            Ok(r) => r,
            Err(_) => Err(CliError::Io(format!(
                "{}: the agent did not answer within {:?} (is it stuck or stopped?)",
                self.socket.display(),
                self.timeout
            ))),
        }
    }

    /// This client, waiting at most `timeout` for an answer's head.
    pub fn with_timeout(mut self, timeout: std::time::Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// What a connection's failure means to this user: to anyone but root, that the agent
    /// refused it (it closes a connection from another user unanswered).
    fn failed(&self, e: &dyn std::fmt::Display, closed: bool) -> CliError {
        if !nix::unistd::geteuid().is_root() {
            CliError::Denied {
                socket: self.socket.clone(),
                reason: format!("the agent closed the connection unanswered ({e})"),
            }
        } else if closed {
            CliError::Io(format!(
                "{}: the agent closed the connection before answering (stopping, or at its limit of {} connections?)",
                self.socket.display(),
                crate::server::MAX_CONNECTIONS
            ))
        } else {
            CliError::Io(format!("{}: {e}", self.socket.display()))
        }
    }

    async fn request_now(
        &self,
        method: hyper::Method,
        path_and_query: &str,
    ) -> Result<hyper::Response<Incoming>, CliError> {
        let io = TokioIo::new(self.connect().await?);
        let (mut send, conn) = hyper::client::conn::http1::handshake(io)
            .await
            .map_err(|e| self.failed(&e, true))?;
        tokio::spawn(conn);
        let req = hyper::Request::builder()
            .method(method)
            .uri(path_and_query)
            .header(hyper::header::HOST, "localhost")
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .map_err(|e| CliError::Io(e.to_string()))?;
        let resp = send.send_request(req).await.map_err(|e| {
            let closed = e.is_incomplete_message() || e.is_canceled() || e.is_closed();
            self.failed(&e, closed)
        })?;
        if resp.status().is_success() {
            return Ok(resp);
        }
        let status = resp.status();
        let body = resp
            .into_body()
            .collect()
            .await
            .map(|b| String::from_utf8_lossy(&b.to_bytes()).trim().to_owned())
            .unwrap_or_default();
        Err(CliError::Refused(if body.is_empty() {
            format!("the agent answered {status}")
        } else {
            body
        }))
    }

    /// `GET path` decoded as JSON.
    ///
    /// Errors: as [`Client::get`]; [`CliError::Io`] when the body is not `T`.
    pub async fn get_json<T: DeserializeOwned>(&self, path: &str) -> Result<T, CliError> {
        let body = self
            .get(path)
            .await?
            .into_body()
            .collect()
            .await
            .map_err(|e| CliError::Io(e.to_string()))?
            .to_bytes();
        serde_json::from_slice(&body).map_err(|e| CliError::Io(format!("{path}: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn how_to_start_follows_whether_systemd_runs_the_host() {
        let tmp = tempfile::tempdir().unwrap();
        assert_eq!(
            start_hint(tmp.path()),
            "start it with `systemctl start nodelet`"
        );
        let hint = start_hint(&tmp.path().join("absent"));
        assert!(
            hint.contains("not booted with systemd") && hint.contains("scripts/up.sh"),
            "{hint}"
        );
    }
}
