//! Running a probe's or a hook's handler against a container (kubelet's `prober.runProbe` and
//! its `exec`, `http`, `tcp` and `grpc` probers; the hook runner's exec, httpGet and sleep).
//!
//! Probe traffic goes only to the pod's own addresses: the pod's IPs, or, for a pod on the host
//! network, the node's address and loopback. A `host` naming anything else fails the probe
//! without connecting.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Container;

use super::spec::{Handler, HttpGet};
use crate::cri::{api, CriResult};

/// Runs a command in a container through CRI ExecSync: (container ID, command, timeout).
pub type ExecFn = Arc<
    dyn Fn(String, Vec<String>, Duration) -> BoxFuture<'static, CriResult<api::ExecSyncResponse>>
        + Send
        + Sync,
>;

/// An [`ExecFn`] over a CRI runtime.
pub fn exec_fn<R: crate::cri::RuntimeService + Clone>(cri: R) -> ExecFn {
    Arc::new(move |id, cmd, timeout| {
        let cri = cri.clone();
        Box::pin(async move { cri.exec_sync(&id, cmd, timeout).await })
    })
}

/// kubelet's User-Agent on probe requests.
pub const USER_AGENT: &str = "kube-probe/1.33";

/// Largest part of an HTTP body or exec output kept for events, bytes (kubelet keeps 10 KiB).
const MAX_OUTPUT: usize = 10 * 1024;

/// What probes and hooks share: CRI exec and one HTTP client (certificates unchecked, as
/// kubelet's probes; no connection reuse; redirects followed on the same host only).
#[derive(Clone)]
pub struct HandlerContext {
    /// ExecSync.
    pub exec: ExecFn,
    http: reqwest::Client,
}

impl HandlerContext {
    /// A context over `exec`.
    ///
    /// Errors: the HTTP client cannot be built (no TLS backend).
    pub fn new(exec: ExecFn) -> Result<Self, String> {
        let redirects = reqwest::redirect::Policy::custom(|attempt| {
            // kubelet's redirect checker: follow up to 10 on the same host; a redirect elsewhere
            // ends with the redirect response itself (3xx: success).
            let same_host =
                attempt.previous().first().map(|u| u.host_str()) == Some(attempt.url().host_str());
            if attempt.previous().len() >= 10 {
                attempt.error("stopped after 10 redirects")
            } else if same_host {
                attempt.follow()
            } else {
                attempt.stop()
            }
        });
        let http = reqwest::Client::builder()
            .danger_accept_invalid_certs(true)
            .redirect(redirects)
            .pool_max_idle_per_host(0)
            .no_proxy()
            .user_agent(USER_AGENT)
            .build()
            .map_err(|e| e.to_string())?;
        Ok(Self { exec, http })
    }
}

/// The container a handler runs against.
#[derive(Debug, Clone, Copy)]
pub struct Target<'a> {
    /// Its spec (for named ports).
    pub container: &'a Container,
    /// Its CRI ID (for exec).
    pub container_id: &'a str,
    /// The pod's IPs (the node's for a host-network pod), primary first.
    pub pod_ips: &'a [String],
    /// The pod is on the host network (loopback is then its own too).
    pub host_network: bool,
}

/// How a handler ended: success, and the output for events (body, command output or error).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Success.
    pub success: bool,
    /// The handler could not be run at all, as opposed to one that ran and failed (kubelet's
    /// probe *error*, `probe.Unknown` with an error): a named port that no port of the
    /// container declares, a host that is not the pod's own, or an ExecSync that the runtime
    /// refused (a missing binary among them) other than its timeout. `success` is false and
    /// `output` holds the error. The prober throws such a result away
    /// ([`crate::prober::worker::Worker::after`] is not called); a hook counts it as a failure.
    pub errored: bool,
    /// A success with a warning: an HTTP probe whose last answer was a 3xx (kubelet's
    /// `probe.Warning`: a redirect it did not follow, to another host, or a 3xx with nothing to
    /// follow), for which the prober records a `ProbeWarning` event with the output; or an HTTPS
    /// hook that succeeded over HTTP ([`run_hook`]).
    pub warning: bool,
    /// What it said.
    pub output: String,
}

impl Outcome {
    fn ok(output: impl Into<String>) -> Self {
        Self {
            success: true,
            errored: false,
            warning: false,
            output: output.into(),
        }
    }

    fn fail(output: impl Into<String>) -> Self {
        Self {
            success: false,
            errored: false,
            warning: false,
            output: output.into(),
        }
    }

    /// A handler that could not be run: see [`Outcome::errored`].
    fn error(output: impl Into<String>) -> Self {
        Self {
            success: false,
            errored: true,
            warning: false,
            output: output.into(),
        }
    }
}

fn truncate(mut s: String) -> String {
    if s.len() > MAX_OUTPUT {
        let mut cut = MAX_OUTPUT;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    s
}

/// Why a handler's address could not be worked out.
#[derive(Debug, Clone, PartialEq, Eq)]
enum TargetError {
    /// The pod has no IP yet: the probe runs and fails, as kubelet's dial of an empty host
    /// does.
    NoAddress,
    /// The handler cannot be run against this container: a `host` that is not the pod's own,
    /// a named port that the container does not declare, a port number out of range (kubelet's
    /// probe error, from `ResolveContainerPort` among others).
    Unrunnable(String),
}

impl TargetError {
    fn message(&self) -> String {
        match self {
            Self::NoAddress => "the pod has no IP address yet".to_owned(),
            Self::Unrunnable(m) => m.clone(),
        }
    }
}

impl Outcome {
    /// A handler whose target could not be worked out: a failure without an address, an
    /// error otherwise.
    fn from_target(e: TargetError) -> Self {
        match e {
            TargetError::NoAddress => Self::fail(e.message()),
            TargetError::Unrunnable(m) => Self::error(m),
        }
    }
}

/// The address to connect to: `host` if it is one of the target's own, else the pod's IP.
///
/// Errors: [`TargetError::Unrunnable`] when `host` is not the pod's own,
/// [`TargetError::NoAddress`] when the pod has no IP yet.
fn address(t: &Target<'_>, host: Option<&str>) -> Result<IpAddr, TargetError> {
    let own: Vec<IpAddr> = t.pod_ips.iter().filter_map(|s| s.parse().ok()).collect();
    match host {
        None => own.first().copied().ok_or(TargetError::NoAddress),
        Some(h) => {
            let ip: Option<IpAddr> = if h == "localhost" {
                Some(IpAddr::from([127, 0, 0, 1]))
            } else {
                h.parse().ok()
            };
            match ip {
                Some(ip) if own.contains(&ip) || (t.host_network && ip.is_loopback()) => Ok(ip),
                _ => Err(TargetError::Unrunnable(format!(
                    "probe host {h:?} is not an address of this pod; nodelet probes only the pod's own addresses"
                ))),
            }
        }
    }
}

/// `host:port` of a handler (`[v6]:port` for IPv6): its address ([`address`]) and its port by
/// number or name.
///
/// Errors: those of [`address`]; a port that does not resolve is [`TargetError::Unrunnable`].
fn socket_address(
    t: &Target<'_>,
    host: Option<&str>,
    port: &super::spec::PortRef,
) -> Result<std::net::SocketAddr, TargetError> {
    let port = port.resolve(t.container).map_err(TargetError::Unrunnable)?;
    let ip = address(t, host)?;
    Ok(std::net::SocketAddr::new(ip, port))
}

/// Runs `handler` against `t` with `timeout` (exec: the ExecSync timeout; network: the whole
/// request). Never panics: a handler that ran and failed is a failed [`Outcome`], one that
/// could not be run an errored one ([`Outcome::errored`], kubelet's `prober.runProbe` returning
/// an error), each with the reason as output.
pub async fn run(
    ctx: &HandlerContext,
    handler: &Handler,
    t: &Target<'_>,
    timeout: Duration,
) -> Outcome {
    match handler {
        Handler::Exec(cmd) => exec(ctx, t, cmd, timeout).await,
        Handler::Http(h) => http(ctx, t, h, timeout).await,
        Handler::Tcp { host, port } => {
            let addr = match socket_address(t, host.as_deref(), port) {
                Ok(a) => a,
                Err(e) => return Outcome::from_target(e),
            };
            match tokio::time::timeout(timeout, tokio::net::TcpStream::connect(addr)).await {
                Ok(Ok(_)) => Outcome::ok(""),
                Ok(Err(e)) => Outcome::fail(format!("dial tcp {addr}: {e}")),
                Err(_) => Outcome::fail(format!("dial tcp {addr}: i/o timeout")),
            }
        }
        Handler::Grpc { port, service } => grpc(t, *port, service, timeout).await,
        Handler::Sleep(d) => {
            crate::clock::sleep(*d).await;
            Outcome::ok("")
        }
    }
}

async fn exec(ctx: &HandlerContext, t: &Target<'_>, cmd: &[String], timeout: Duration) -> Outcome {
    let r = (ctx.exec)(t.container_id.to_owned(), cmd.to_vec(), timeout).await;
    match r {
        Ok(r) => {
            let mut out = String::from_utf8_lossy(&r.stdout).into_owned();
            out.push_str(&String::from_utf8_lossy(&r.stderr));
            if r.exit_code != 0 && out.trim().is_empty() {
                out = format!("command {:?} exited with {}", cmd.join(" "), r.exit_code);
            }
            Outcome {
                success: r.exit_code == 0,
                errored: false,
                warning: false,
                output: truncate(out),
            }
        }
        // kubelet's exec prober: a timeout is a failure (`ExecProbeTimeout`).
        Err(e) if e.code == tonic::Code::DeadlineExceeded => {
            Outcome::fail(format!("command {:?} timed out", cmd.join(" ")))
        }
        // Any other error of the runtime (a missing binary: containerd answers ExecSync with an
        // error, not an exit code; a container that is stopping): the probe could not be run,
        // kubelet's `probe.Unknown` with the error.
        Err(e) => Outcome::error(truncate(e.message)),
    }
}

/// A failed hook's error and message as kubelet puts them in its event (`error: <error>,
/// message: <message quoted>`), each cut to [`MAX_OUTPUT`].
fn hook_failure(error: &str, message: &str) -> String {
    let message = truncate(message.to_owned());
    format!("{}, message: {message:?}", truncate(error.to_owned()))
}

/// Runs a lifecycle hook's handler (kubelet's `handlerRunner.Run`): exec without a timeout of
/// its own (a non-zero exit fails), httpGet (only a failed request fails: kubelet does not look
/// at the status code of a hook's response), sleep. A failure's output is the error and
/// message kubelet puts in its event: `<error>, message: "<output>"`, the error of an exec that
/// exited non-zero as CRI's ExecSync gives it (`command '<cmd>' exited with <code>: <stderr>`),
/// its message the combined output; an httpGet's or a runtime's error with an empty message.
///
/// An HTTPS hook whose server answered in plain HTTP is sent again over HTTP without its
/// `Authorization` header (kubelet's fallback in `runHTTPHandler`); when that succeeds the
/// outcome is a success with `warning` set and the output kubelet gives its
/// `LifecycleHTTPFallback` event. When it fails, the first error stands.
pub async fn run_hook(ctx: &HandlerContext, handler: &Handler, t: &Target<'_>) -> Outcome {
    match handler {
        Handler::Http(h) => match http_get(ctx, t, h, None, false).await {
            Ok(_) => Outcome::ok(""),
            Err(e) if h.scheme == "https" && e.plain_http_answer => {
                let mut plain = h.clone();
                plain.scheme = "http".into();
                plain
                    .headers
                    .retain(|(k, _)| !k.eq_ignore_ascii_case("authorization"));
                match http_get(ctx, t, &plain, None, false).await {
                    Ok(_) => {
                        let at = socket_address(t, h.host.as_deref(), &h.port)
                            .map(|a| a.to_string())
                            .unwrap_or_default();
                        Outcome {
                            success: true,
                            errored: false,
                            warning: true,
                            output: format!("request to HTTPS lifecycle hook {at} got HTTP response, retry with HTTP succeeded"),
                        }
                    }
                    Err(_) => Outcome::fail(hook_failure(&e.message, "")),
                }
            }
            Err(e) => Outcome::fail(hook_failure(&e.message, "")),
        },
        // CRI's ExecSync error for an exit code (`command '<cmd>' exited with <code>:
        // <stderr>`), or the runtime's; the message the combined output.
        Handler::Exec(cmd) => {
            match (ctx.exec)(t.container_id.to_owned(), cmd.to_vec(), Duration::ZERO).await {
                Ok(r) if r.exit_code == 0 => Outcome::ok(""),
                Ok(r) => {
                    let stderr = String::from_utf8_lossy(&r.stderr);
                    let mut output = String::from_utf8_lossy(&r.stdout).into_owned();
                    output.push_str(&stderr);
                    let error = format!(
                        "command '{}' exited with {}: {stderr}",
                        cmd.join(" "),
                        r.exit_code
                    );
                    Outcome::fail(hook_failure(&error, &output))
                }
                Err(e) => Outcome::fail(hook_failure(&e.message, "")),
            }
        }
        other => run(ctx, other, t, Duration::from_secs(1)).await,
    }
}

async fn http(ctx: &HandlerContext, t: &Target<'_>, h: &HttpGet, timeout: Duration) -> Outcome {
    match http_get(ctx, t, h, Some(timeout), true).await {
        // A body cut short by an error (the timeout among them) fails the probe.
        Ok((_, Err(e))) => Outcome::fail(e),
        Ok((code, Ok(body))) if (200..300).contains(&code) => Outcome::ok(truncate(body)),
        // A 3xx that was not followed (a redirect to another host, a 304): a success with a
        // warning.
        Ok((code, Ok(body))) if (300..400).contains(&code) => Outcome {
            success: true,
            errored: false,
            warning: true,
            output: format!(
                "Probe terminated redirects, Response body: {}",
                truncate(body)
            ),
        },
        Ok((code, _)) => Outcome::fail(format!("HTTP probe failed with statuscode: {code}")),
        Err(e) if e.unrunnable => Outcome::error(e.message),
        Err(e) => Outcome::fail(e.message),
    }
}

/// Why a GET got no answer.
struct GetError {
    /// `Get "<url>": <cause>`.
    message: String,
    /// The request could not be made at all ([`TargetError::Unrunnable`]).
    unrunnable: bool,
    /// The server answered an HTTPS request in plain HTTP (Go's "server gave HTTP response to
    /// HTTPS client"): rustls read the answer's first bytes, `HTTP/`, as a TLS record of an
    /// invalid content type.
    plain_http_answer: bool,
}

/// One GET: the status code and, with `read_body`, the first [`MAX_OUTPUT`] bytes of the body
/// (or the error that cut the body short); or the request's error (`Get "<url>": <cause>`).
/// Without `read_body` (hooks, which look at no body) the answer ends with its headers: a body
/// that never comes cannot hold the caller.
async fn http_get(
    ctx: &HandlerContext,
    t: &Target<'_>,
    h: &HttpGet,
    timeout: Option<Duration>,
    read_body: bool,
) -> Result<(u16, Result<String, String>), GetError> {
    let authority = socket_address(t, h.host.as_deref(), &h.port).map_err(|e| GetError {
        message: e.message(),
        unrunnable: matches!(e, TargetError::Unrunnable(_)),
        plain_http_answer: false,
    })?;
    let url = format!("{}://{authority}{}", h.scheme, h.path);
    let mut req = ctx.http.get(&url).header("Accept", "*/*");
    if let Some(t) = timeout {
        req = req.timeout(t);
    }
    for (k, v) in &h.headers {
        req = req.header(k.as_str(), v.as_str());
    }
    match req.send().await {
        Ok(mut resp) => {
            let code = resp.status().as_u16();
            if !read_body {
                return Ok((code, Ok(String::new())));
            }
            // A body that ends when the connection closes: over TLS, a close without
            // close_notify ends it as Go's TLS takes it, not as an error.
            let close_delimited = resp.content_length().is_none()
                && !resp
                    .headers()
                    .get(reqwest::header::TRANSFER_ENCODING)
                    .and_then(|v| v.to_str().ok())
                    .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
            // At most MAX_OUTPUT bytes of the body are kept (kubelet's `ReadAtMost`), and reading
            // stops there: an endless or huge body costs a bounded read (what the last socket
            // read brought); the rest is dropped with the connection.
            let mut body = Vec::new();
            while body.len() < MAX_OUTPUT {
                match resp.chunk().await {
                    Ok(Some(chunk)) => {
                        let room = MAX_OUTPUT - body.len();
                        body.extend_from_slice(&chunk[..chunk.len().min(room)]);
                    }
                    Ok(None) => break,
                    Err(e) if close_delimited && is_unexpected_eof(&e) => break,
                    Err(e) => return Ok((code, Err(format!("Get {url:?}: {}", chain(&e))))),
                }
            }
            Ok((code, Ok(String::from_utf8_lossy(&body).into_owned())))
        }
        Err(e) => {
            let cause = chain(&e);
            Err(GetError {
                unrunnable: false,
                plain_http_answer: cause.contains("InvalidContentType"),
                message: format!("Get {url:?}: {cause}"),
            })
        }
    }
}

/// True when an I/O error of kind `UnexpectedEof` is in `e`'s chain (rustls: the peer closed
/// without close_notify).
fn is_unexpected_eof(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut src = Some(e);
    while let Some(s) = src {
        if s.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::UnexpectedEof)
        {
            return true;
        }
        src = s.source();
    }
    false
}

/// An error and its sources, `: `-separated (Go's wrapped error text).
fn chain(e: &dyn std::error::Error) -> String {
    let mut msg = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        src = s.source();
    }
    msg
}

async fn grpc(t: &Target<'_>, port: i32, service: &str, timeout: Duration) -> Outcome {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{health_client::HealthClient, HealthCheckRequest};
    let ip = match address(t, None) {
        Ok(ip) => ip,
        Err(e) => return Outcome::from_target(e),
    };
    let Ok(port) = u16::try_from(port) else {
        return Outcome::fail(format!("invalid port number {port}"));
    };
    let addr = std::net::SocketAddr::new(ip, port);
    let endpoint = match tonic::transport::Endpoint::from_shared(format!("http://{addr}")) {
        Ok(e) => e.connect_timeout(timeout).timeout(timeout),
        Err(e) => return Outcome::fail(e.to_string()),
    };
    let channel = match endpoint.connect().await {
        Ok(c) => c,
        Err(_) => {
            return Outcome::fail(format!(
                "timeout: failed to connect service {addr:?} within {}s",
                timeout.as_secs()
            ))
        }
    };
    let req = HealthCheckRequest {
        service: service.to_owned(),
    };
    match HealthClient::new(channel).check(req).await {
        Ok(r) => {
            let status = r.into_inner().status;
            if status == ServingStatus::Serving as i32 {
                Outcome::ok("")
            } else {
                let name = ServingStatus::try_from(status).map_or("UNKNOWN", |s| s.as_str_name());
                Outcome::fail(format!("service unhealthy (responded with {name:?})"))
            }
        }
        Err(s) => Outcome::fail(format!(
            "rpc error: code = {:?} desc = {}",
            s.code(),
            s.message()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::super::spec::PortRef;
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn ctx() -> HandlerContext {
        let rt = crate::testing::runtime::FakeRuntime::new(crate::clock::FakeClock::new(1));
        HandlerContext::new(exec_fn(rt)).unwrap()
    }

    fn container() -> Container {
        serde_yaml::from_str("{name: c, ports: [{name: web, containerPort: 1}]}").unwrap()
    }

    fn target<'a>(c: &'a Container, ips: &'a [String]) -> Target<'a> {
        Target {
            container: c,
            container_id: "id",
            pod_ips: ips,
            host_network: false,
        }
    }

    /// A one-shot-per-connection HTTP server on 127.0.0.1: answers each request by path
    /// (`/redirect-here` → 302 to `/ok`, `/redirect-away` → 302 to another host, `/ok` → 200
    /// echoing the `x-probe` header, `/endless` → 200 with a body that never ends, `/stall` → 200
    /// with a body that never comes, `/close` → 200 with a body ended by the close, `/short` →
    /// 200 with a body shorter than its Content-Length, anything else → 500).
    async fn http_server() -> u16 {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = l.accept().await.unwrap();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 4096];
                    let n = s.read(&mut buf).await.unwrap_or(0);
                    let req = String::from_utf8_lossy(&buf[..n]).to_string();
                    let path = req.split(' ').nth(1).unwrap_or("").to_owned();
                    let header = req
                        .lines()
                        .find(|l| l.to_ascii_lowercase().starts_with("x-probe:"))
                        .map(|l| l[8..].trim().to_owned())
                        .unwrap_or_default();
                    let agent = req
                        .lines()
                        .find(|l| l.to_ascii_lowercase().starts_with("user-agent:"))
                        .map(|l| l[11..].trim().to_owned())
                        .unwrap_or_default();
                    if path == "/endless" || path == "/stall" {
                        // A body that never ends (a chunk of 64 KiB after another), or headers
                        // and then nothing.
                        let head = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
                        if s.write_all(head.as_bytes()).await.is_err() || path == "/stall" {
                            tokio::time::sleep(Duration::from_secs(30)).await;
                            return;
                        }
                        let chunk = format!("10000\r\n{}\r\n", "x".repeat(0x10000));
                        while s.write_all(chunk.as_bytes()).await.is_ok() {}
                        return;
                    }
                    let resp = match path.as_str() {
                        "/close" => "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nclosed".to_owned(),
                        "/short" => "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort".to_owned(),
                        "/redirect-here" => "HTTP/1.1 302 Found\r\nLocation: /ok\r\nContent-Length: 0\r\n\r\n".to_owned(),
                        "/redirect-away" => "HTTP/1.1 302 Found\r\nLocation: http://192.0.2.1/x\r\nContent-Length: 0\r\n\r\n".to_owned(),
                        "/ok" => {
                            let body = format!("{header} {agent}");
                            format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}", body.len())
                        }
                        _ => "HTTP/1.1 500 Oops\r\nContent-Length: 0\r\n\r\n".to_owned(),
                    };
                    let _ = s.write_all(resp.as_bytes()).await;
                });
            }
        });
        port
    }

    fn http(port: u16, path: &str) -> Handler {
        Handler::Http(HttpGet {
            scheme: "http".into(),
            host: None,
            port: PortRef::Number(i32::from(port)),
            path: path.into(),
            headers: vec![("X-Probe".into(), "hello".into())],
        })
    }

    #[tokio::test]
    async fn http_probes_follow_same_host_redirects_send_headers_and_judge_the_status() {
        let port = http_server().await;
        let c = container();
        let ips = ["127.0.0.1".to_owned()];
        let t = target(&c, &ips);
        let d = Duration::from_secs(2);
        let ok = run(&ctx(), &http(port, "/ok"), &t, d).await;
        assert_eq!(ok, Outcome::ok(format!("hello {USER_AGENT}")));
        assert!(
            run(&ctx(), &http(port, "/redirect-here"), &t, d)
                .await
                .success
        );
        // A redirect to another host is not followed: the 302 itself counts (a success with a
        // warning, kubelet's `probe.Warning`), and nothing is sent to the other host.
        let away = run(&ctx(), &http(port, "/redirect-away"), &t, d).await;
        assert!(away.success && away.warning, "{away:?}");
        assert_eq!(away.output, "Probe terminated redirects, Response body: ");
        assert!(!ok.warning);
        let bad = run(&ctx(), &http(port, "/boom"), &t, d).await;
        assert_eq!(bad, Outcome::fail("HTTP probe failed with statuscode: 500"));
        // A hook does not look at the status code.
        assert!(run_hook(&ctx(), &http(port, "/boom"), &t).await.success);
    }

    #[tokio::test]
    async fn an_https_hook_answered_in_plain_http_is_sent_again_over_http() {
        let port = http_server().await;
        let c = container();
        let ips = ["127.0.0.1".to_owned()];
        let t = target(&c, &ips);
        let https = |path: &str| match http(port, path) {
            Handler::Http(mut h) => {
                h.scheme = "https".into();
                Handler::Http(h)
            }
            _ => unreachable!(),
        };
        let out = run_hook(&ctx(), &https("/ok"), &t).await;
        assert_eq!(
            out,
            Outcome {
                success: true,
                errored: false,
                warning: true,
                output: format!("request to HTTPS lifecycle hook 127.0.0.1:{port} got HTTP response, retry with HTTP succeeded"),
            }
        );
        // A probe gets no fallback: kubelet's probes fail on it.
        let probe = run(&ctx(), &https("/ok"), &t, Duration::from_secs(2)).await;
        assert!(
            !probe.success && probe.output.contains("InvalidContentType"),
            "{probe:?}"
        );
        // Nothing listening: the first error stands, no retry is reported.
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let dead = closed.local_addr().unwrap().port();
        drop(closed);
        let refused = run_hook(
            &ctx(),
            &{
                let Handler::Http(mut h) = https("/ok") else {
                    unreachable!()
                };
                h.port = PortRef::Number(i32::from(dead));
                Handler::Http(h)
            },
            &t,
        )
        .await;
        assert!(!refused.success && !refused.warning, "{refused:?}");
        assert!(refused.output.starts_with("Get \"https://"), "{refused:?}");
    }

    #[tokio::test]
    async fn an_endless_body_is_read_to_10_kib_and_a_stalled_one_fails_at_the_timeout() {
        let port = http_server().await;
        let c = container();
        let ips = ["127.0.0.1".to_owned()];
        let t = target(&c, &ips);
        // Without the cap the read would go on to the 30 s timeout, holding all it read.
        let endless = run(&ctx(), &http(port, "/endless"), &t, Duration::from_secs(30)).await;
        assert!(endless.success, "{endless:?}");
        assert_eq!(endless.output.len(), MAX_OUTPUT);
        assert!(endless.output.bytes().all(|b| b == b'x'));
        // A hook reads no body at all: neither an endless nor a stalled one holds it.
        for path in ["/endless", "/stall"] {
            let (ctx, handler) = (ctx(), http(port, path));
            let hook = tokio::time::timeout(Duration::from_secs(10), run_hook(&ctx, &handler, &t));
            assert!(hook.await.expect(path).success, "{path}");
        }
        let stalled = run(
            &ctx(),
            &http(port, "/stall"),
            &t,
            Duration::from_millis(300),
        )
        .await;
        assert!(!stalled.success, "{stalled:?}");
        // A body ended by the close is whole; one shorter than its length is cut short.
        let d = Duration::from_secs(2);
        assert_eq!(
            run(&ctx(), &http(port, "/close"), &t, d).await,
            Outcome::ok("closed")
        );
        let short = run(&ctx(), &http(port, "/short"), &t, d).await;
        assert!(!short.success, "{short:?}");
        assert!(
            stalled
                .output
                .starts_with(&format!("Get \"http://127.0.0.1:{port}/stall\"")),
            "{stalled:?}"
        );
    }

    #[tokio::test]
    async fn probes_reach_only_the_pods_own_addresses_and_named_ports_must_exist() {
        let c = container();
        let ips = ["10.88.0.7".to_owned()];
        let t = target(&c, &ips);
        let d = Duration::from_secs(1);
        let elsewhere = Handler::Tcp {
            host: Some("192.0.2.1".into()),
            port: PortRef::Number(80),
        };
        let out = run(&ctx(), &elsewhere, &t, d).await;
        assert!(!out.success && out.errored, "{out:?}");
        assert!(
            out.output.contains("not an address of this pod"),
            "{}",
            out.output
        );
        let loopback = Handler::Tcp {
            host: Some("127.0.0.1".into()),
            port: PortRef::Number(80),
        };
        assert!(run(&ctx(), &loopback, &t, d)
            .await
            .output
            .contains("not an address of this pod"));
        let named = Handler::Tcp {
            host: None,
            port: PortRef::Name("metrics".into()),
        };
        // A port the container does not declare: the probe cannot be run (kubelet's probe
        // error), for tcpSocket and httpGet alike.
        assert_eq!(
            run(&ctx(), &named, &t, d).await,
            Outcome::error("couldn't find port \"metrics\" in container \"c\"")
        );
        let named_http = Handler::Http(HttpGet {
            scheme: "http".into(),
            host: None,
            port: PortRef::Name("metrics".into()),
            path: "/".into(),
            headers: Vec::new(),
        });
        assert_eq!(
            run(&ctx(), &named_http, &t, d).await,
            Outcome::error("couldn't find port \"metrics\" in container \"c\"")
        );
        // An undeclared port is an error even before the pod has an address; no address yet
        // is a failure.
        let early = run(&ctx(), &named_http, &target(&c, &[]), d).await;
        assert!(early.errored, "{early:?}");
        let no_ip_tcp = Handler::Tcp {
            host: None,
            port: PortRef::Number(80),
        };
        let no_ip_tcp = run(&ctx(), &no_ip_tcp, &target(&c, &[]), d).await;
        assert!(!no_ip_tcp.success && !no_ip_tcp.errored, "{no_ip_tcp:?}");
    }

    #[tokio::test]
    async fn tcp_probes_connect_or_fail_with_the_dial_error() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let open = l.local_addr().unwrap().port();
        let closed = {
            let l2 = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l2.local_addr().unwrap().port()
        };
        let c = container();
        let ips = ["127.0.0.1".to_owned()];
        let t = target(&c, &ips);
        let tcp = |p: u16| Handler::Tcp {
            host: None,
            port: PortRef::Number(i32::from(p)),
        };
        assert!(
            run(&ctx(), &tcp(open), &t, Duration::from_secs(1))
                .await
                .success
        );
        let out = run(&ctx(), &tcp(closed), &t, Duration::from_secs(1)).await;
        assert!(
            out.output
                .starts_with(&format!("dial tcp 127.0.0.1:{closed}: ")),
            "{}",
            out.output
        );
    }

    #[tokio::test]
    async fn grpc_probes_ask_the_health_service() {
        use tonic_health::ServingStatus;
        let (reporter, service) = tonic_health::server::health_reporter();
        reporter
            .set_service_status("", ServingStatus::Serving)
            .await;
        reporter
            .set_service_status("db", ServingStatus::NotServing)
            .await;
        let incoming =
            tonic::transport::server::TcpIncoming::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let port = incoming.local_addr().unwrap().port();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(incoming),
        );
        let c = container();
        let ips = ["127.0.0.1".to_owned()];
        let t = target(&c, &ips);
        let grpc = |service: &str| Handler::Grpc {
            port: i32::from(port),
            service: service.into(),
        };
        let d = Duration::from_secs(2);
        assert!(run(&ctx(), &grpc(""), &t, d).await.success);
        assert_eq!(
            run(&ctx(), &grpc("db"), &t, d).await,
            Outcome::fail("service unhealthy (responded with \"NOT_SERVING\")")
        );
        let none = Handler::Grpc {
            port: 1,
            service: String::new(),
        };
        assert!(run(&ctx(), &none, &t, d)
            .await
            .output
            .starts_with("timeout: failed to connect service"));
    }

    #[tokio::test]
    async fn an_exec_the_runtime_refuses_is_an_error_with_the_runtimes_message() {
        let rt = crate::testing::runtime::FakeRuntime::new(crate::clock::FakeClock::new(1));
        let ctx = HandlerContext::new(exec_fn(rt.clone())).unwrap();
        let c = container();
        let t = target(&c, &[]);
        let exec = Handler::Exec(vec!["/no/such/binary".into()]);
        assert!(run(&ctx, &exec, &t, Duration::from_secs(1)).await.success);
        rt.fail_next(
            "exec_sync",
            "OCI runtime exec failed: no such file or directory",
        );
        // containerd answers an exec of a missing binary with an error, not an exit code:
        // kubelet's exec prober returns it as an error (`probe.Unknown`).
        assert_eq!(
            run(&ctx, &exec, &t, Duration::from_secs(1)).await,
            Outcome::error("OCI runtime exec failed: no such file or directory")
        );
    }
}
