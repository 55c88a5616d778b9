//! `exec`, `attach` and `portForward` (kubelet's `getExec`, `getAttach`, `getPortForward` with
//! apimachinery's upgrade-aware proxy): the CRI call for the request gives a one-time URL on the
//! runtime's streaming server, and the client's upgrade request is relayed there byte for byte,
//! its upgrade headers unchanged (`Connection`, `Upgrade`, `X-Stream-Protocol-Version`,
//! `Sec-WebSocket-*`), so that SPDY/3.1 and WebSocket (v1–v4) clients both work without nodelet
//! speaking either protocol. On the runtime's `101 Switching Protocols` the two connections are
//! joined until either side closes; any other answer is passed back as it is.

use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Longest a runtime streaming server may take to answer the relayed upgrade request.
pub const BACKEND_ANSWER: Duration = Duration::from_secs(30);

/// Largest response head read from the runtime's streaming server, bytes.
const MAX_HEAD: usize = 64 * 1024;

/// kubelet's stream options of an exec or attach request (`input`, `output`, `error`, `tty`,
/// each `1` or `true`), and the command of an exec (`command`, repeated).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StreamOptions {
    /// The command (exec).
    pub command: Vec<String>,
    /// Attach stdin.
    pub stdin: bool,
    /// Attach stdout.
    pub stdout: bool,
    /// Attach stderr (dropped with a TTY, as kubelet drops it).
    pub stderr: bool,
    /// Allocate a TTY.
    pub tty: bool,
}

/// Parses exec and attach parameters.
///
/// Errors: the 400 message kubelet gives when no stream is asked for.
pub fn stream_options(params: &[(String, String)]) -> Result<StreamOptions, String> {
    let on = |k: &str| {
        params
            .iter()
            .any(|(pk, v)| pk == k && (v == "1" || v == "true"))
    };
    let mut o = StreamOptions {
        command: params
            .iter()
            .filter(|(k, _)| k == "command")
            .map(|(_, v)| v.clone())
            .collect(),
        stdin: on("input"),
        stdout: on("output"),
        stderr: on("error"),
        tty: on("tty"),
    };
    if o.tty && o.stderr {
        o.stderr = false;
    }
    if !(o.stdin || o.stdout || o.stderr) {
        return Err("you must specify at least 1 of stdin, stdout, stderr".into());
    }
    Ok(o)
}

/// The ports of a port-forward request (`port`, repeated or comma-separated).
///
/// Errors: a port that is not a number in 1–65535, naming it.
pub fn ports(params: &[(String, String)]) -> Result<Vec<i32>, String> {
    let mut out = Vec::new();
    for (_, v) in params.iter().filter(|(k, _)| k == "port") {
        for p in v.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match p.parse::<u16>() {
                Ok(n) if n > 0 => out.push(i32::from(n)),
                _ => return Err(format!("port: {p:?} is not a port number (1-65535)")),
            }
        }
    }
    Ok(out)
}

/// Whether the request asks to be upgraded to a WebSocket (`Upgrade: websocket`).
pub fn is_websocket(headers: &HeaderMap) -> bool {
    headers
        .get(axum::http::header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("websocket"))
}

/// Whether the request asks for a connection upgrade.
pub fn is_upgrade(headers: &HeaderMap) -> bool {
    headers
        .get(axum::http::header::CONNECTION)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.split(',')
                .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
        })
        && headers.contains_key(axum::http::header::UPGRADE)
}

/// A response with `status` and a plain-text `message`.
pub fn plain(status: StatusCode, message: impl Into<String>) -> Response {
    let mut r = Response::new(Body::from(message.into()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        axum::http::header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// Relays upgrade request `req` to the runtime's streaming `url` (kubelet's upgrade-aware
/// proxy): 400 `Upgrade request required` for a request without one; the runtime's answer
/// otherwise, its connection joined to the client's after a `101`.
pub async fn proxy(mut req: Request, url: &str) -> Response {
    if !is_upgrade(req.headers()) {
        return plain(StatusCode::BAD_REQUEST, "Upgrade request required");
    }
    let Ok(target) = url.parse::<axum::http::Uri>() else {
        return plain(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the runtime's streaming URL {url:?} cannot be parsed"),
        );
    };
    let (Some(host), Some(port)) = (target.host(), target.port_u16().or(Some(80))) else {
        return plain(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the runtime's streaming URL {url:?} has no host"),
        );
    };
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let mut backend = match TcpStream::connect((host.as_str(), port)).await {
        Ok(s) => {
            // Small frames each way (a keystroke, an exit status): sent at once, not held for
            // Nagle's algorithm against the peer's delayed ACK (about 40 ms a round; Go, which
            // kubelet and the runtime are written in, sets the same on every connection).
            let _ = s.set_nodelay(true);
            s
        }
        Err(e) => {
            return plain(
                StatusCode::BAD_GATEWAY,
                format!("cannot reach the runtime's streaming server at {host}:{port}: {e}"),
            )
        }
    };
    let path = target
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    let mut head = format!(
        "{} {path} HTTP/1.1\r\nHost: {host}:{port}\r\n",
        req.method()
    );
    for (name, value) in req.headers() {
        if name == axum::http::header::HOST {
            continue;
        }
        if let Ok(v) = value.to_str() {
            head.push_str(&format!("{name}: {v}\r\n"));
        }
    }
    head.push_str("\r\n");
    if let Err(e) = backend.write_all(head.as_bytes()).await {
        return plain(StatusCode::BAD_GATEWAY, format!("streaming server: {e}"));
    }
    let (status, headers, rest) =
        match tokio::time::timeout(BACKEND_ANSWER, read_head(&mut backend)).await {
            Ok(Ok(h)) => h,
            Ok(Err(e)) => return plain(StatusCode::BAD_GATEWAY, format!("streaming server: {e}")),
            Err(_) => {
                return plain(
                    StatusCode::GATEWAY_TIMEOUT,
                    "the runtime's streaming server did not answer",
                )
            }
        };
    let mut response = Response::new(Body::empty());
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    if status != StatusCode::SWITCHING_PROTOCOLS {
        // An error from the runtime (an expired token: 404): its body, as it is, read to its
        // Content-Length (else until the runtime closes, at most 5 s).
        let mut body = rest;
        let length = headers_length(response.headers()).unwrap_or(MAX_HEAD);
        let _ = tokio::time::timeout(Duration::from_secs(5), async {
            let mut buf = vec![0u8; 8192];
            while body.len() < length.min(MAX_HEAD) {
                match backend.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => body.extend_from_slice(&buf[..n]),
                }
            }
        })
        .await;
        response
            .headers_mut()
            .remove(axum::http::header::CONTENT_LENGTH);
        response
            .headers_mut()
            .remove(axum::http::header::TRANSFER_ENCODING);
        *response.body_mut() = Body::from(body);
        return response;
    }
    let upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        let client = match upgrade.await {
            Ok(u) => u,
            Err(e) => {
                tracing::debug!(error = %e, "node API: the client's upgrade failed");
                return;
            }
        };
        let (mut client, ahead, hangup) = client_stream(client);
        if !rest.is_empty() && client.write_all(&rest).await.is_err() {
            return;
        }
        let mut backend = backend;
        if !ahead.is_empty() && backend.write_all(&ahead).await.is_err() {
            return;
        }
        // Either direction ending ends both (apimachinery's upgrade-aware proxy closes both
        // connections): a client that leaves does not hold the runtime's session, nor its
        // descriptors, until the runtime's own timeout; nor when it leaves while the runtime
        // has stopped reading its input (`relay_input` watches for its hang-up then).
        let (mut client_rx, mut client_tx) = tokio::io::split(client);
        let (mut backend_rx, mut backend_tx) = backend.into_split();
        tokio::select! {
            _ = relay_input(&mut client_rx, &mut backend_tx, hangup) => {}
            _ = tokio::io::copy(&mut backend_rx, &mut client_tx) => {}
        }
    });
    response
}

/// How often a blocked write to the runtime checks whether the client is still there.
const HANGUP_CHECK: Duration = Duration::from_secs(1);

/// A second handle on the client's socket (a duplicated descriptor, registered with the
/// reactor on its own), to see it hang up without reading from it: its readiness carries the
/// peer's close (`EPOLLRDHUP`, `EPOLLHUP`).
enum ClientHangup {
    /// The local socket.
    Unix(tokio::net::UnixStream),
    /// TCP (the node API, under TLS).
    Tcp(tokio::net::TcpStream),
    /// Another transport: not watched.
    Unknown,
}

impl ClientHangup {
    fn unix(s: &tokio::net::UnixStream) -> Self {
        use std::os::fd::AsFd;
        s.as_fd()
            .try_clone_to_owned()
            .ok()
            .and_then(|fd| tokio::net::UnixStream::from_std(fd.into()).ok())
            .map_or(ClientHangup::Unknown, ClientHangup::Unix)
    }

    fn tcp(s: &TcpStream) -> Self {
        use std::os::fd::AsFd;
        s.as_fd()
            .try_clone_to_owned()
            .ok()
            .and_then(|fd| TcpStream::from_std(fd.into()).ok())
            .map_or(ClientHangup::Unknown, ClientHangup::Tcp)
    }

    /// Whether the client closed its connection, asked without waiting.
    fn hung_up(&self) -> bool {
        use futures::FutureExt;
        let ready = match self {
            ClientHangup::Unix(s) => s.ready(tokio::io::Interest::READABLE).now_or_never(),
            ClientHangup::Tcp(s) => s.ready(tokio::io::Interest::READABLE).now_or_never(),
            ClientHangup::Unknown => None,
        };
        matches!(ready, Some(Ok(r)) if r.is_read_closed())
    }
}

/// A client connection's stream.
trait ClientIo: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin> ClientIo for T {}

/// The upgraded client connection as a tokio stream, the bytes hyper read past the request (to
/// be sent on), and its socket to watch for a hang-up: known for the node API's TLS over TCP
/// and the local socket (the transports the servers hand hyper); for another, none is watched.
fn client_stream(u: hyper::upgrade::Upgraded) -> (Box<dyn ClientIo>, bytes::Bytes, ClientHangup) {
    let u = match u.downcast::<TokioIo<tokio::net::UnixStream>>() {
        Ok(p) => {
            let s = p.io.into_inner();
            let hangup = ClientHangup::unix(&s);
            return (Box::new(s), p.read_buf, hangup);
        }
        Err(u) => u,
    };
    match u.downcast::<TokioIo<tokio_rustls::server::TlsStream<TcpStream>>>() {
        Ok(p) => {
            let s = p.io.into_inner();
            let hangup = ClientHangup::tcp(s.get_ref().0);
            (Box::new(s), p.read_buf, hangup)
        }
        Err(u) => (
            Box::new(TokioIo::new(u)),
            bytes::Bytes::new(),
            ClientHangup::Unknown,
        ),
    }
}

/// Copies the client's bytes to the runtime until either ends; while a write to the runtime is
/// blocked (it stopped reading: a command that does not read its input), checks every
/// [`HANGUP_CHECK`] whether the client hung up, and ends then.
async fn relay_input(
    from: &mut (impl tokio::io::AsyncRead + Unpin),
    to: &mut (impl tokio::io::AsyncWrite + Unpin),
    hangup: ClientHangup,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let write = to.write_all(&buf[..n]);
        tokio::pin!(write);
        loop {
            tokio::select! {
                r = &mut write => {
                    if r.is_err() {
                        return;
                    }
                    break;
                }
                () = crate::clock::sleep(HANGUP_CHECK) => {
                    if hangup.hung_up() {
                        tracing::debug!("node API: the client left while the runtime was not reading its input; relay closed");
                        return;
                    }
                }
            }
        }
    }
}

/// Reads an HTTP/1.1 response head from `s`: its status, its headers, and the bytes read past
/// it.
async fn read_head(s: &mut TcpStream) -> std::io::Result<(StatusCode, HeaderMap, Vec<u8>)> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    loop {
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "closed before answering",
            ));
        }
        buf.extend_from_slice(&chunk[..n]);
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut resp = httparse::Response::new(&mut headers);
        match resp.parse(&buf) {
            Ok(httparse::Status::Complete(len)) => {
                let status = StatusCode::from_u16(resp.code.unwrap_or(502))
                    .unwrap_or(StatusCode::BAD_GATEWAY);
                let mut map = HeaderMap::new();
                for h in resp.headers.iter() {
                    if let (Ok(name), Ok(value)) = (
                        axum::http::HeaderName::from_bytes(h.name.as_bytes()),
                        HeaderValue::from_bytes(h.value),
                    ) {
                        map.append(name, value);
                    }
                }
                return Ok((status, map, buf[len..].to_vec()));
            }
            Ok(httparse::Status::Partial) if buf.len() < MAX_HEAD => continue,
            Ok(httparse::Status::Partial) => {
                return Err(std::io::Error::other("response head too large"))
            }
            Err(e) => return Err(std::io::Error::other(e.to_string())),
        }
    }
}

/// The `Content-Length` of an answer's headers.
fn headers_length(h: &axum::http::HeaderMap) -> Option<usize> {
    h.get(axum::http::header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(q: &[(&str, &str)]) -> Vec<(String, String)> {
        q.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn exec_options_are_kubelets_and_a_stream_is_required() {
        let o = stream_options(&params(&[
            ("command", "sh"),
            ("command", "-c"),
            ("command", "echo hi"),
            ("output", "1"),
            ("error", "1"),
            ("tty", "1"),
        ]))
        .unwrap();
        assert_eq!(o.command, ["sh", "-c", "echo hi"]);
        assert!(o.stdout && o.tty && !o.stderr, "stderr dropped with a TTY");
        assert_eq!(
            stream_options(&params(&[("command", "ls")])).unwrap_err(),
            "you must specify at least 1 of stdin, stdout, stderr"
        );
    }

    #[test]
    fn ports_come_repeated_or_comma_separated() {
        assert_eq!(
            ports(&params(&[("port", "80,443"), ("port", "8080")])).unwrap(),
            [80, 443, 8080]
        );
        assert!(ports(&params(&[("port", "0")]))
            .unwrap_err()
            .contains("port"));
        assert!(ports(&params(&[("port", "http")])).is_err());
    }
}
