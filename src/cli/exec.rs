//! `nodelet exec [-i] [-t] POD [-c CONTAINER] -- CMD…`: the node API's `/exec` over WebSocket
//! through the local socket (the agent relays it to the runtime's streaming server). The
//! channels are Kubernetes' remote command protocol (`v4.channel.k8s.io`: each binary message
//! starts with its channel, 0 stdin, 1 stdout, 2 stderr, 3 the exit status as a `Status`,
//! 4 terminal size `{"Width","Height"}`; `v5.channel.k8s.io` adds 255, the end of stdin, and is
//! offered first). With `-t` this terminal is put in raw mode (restored on exit) and its size
//! sent at start and on each `SIGWINCH`. The exit status is the command's.

use futures::{SinkExt, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

use super::resolve::{container, find_pod, ns_name};
use super::{CliError, Client, ExecArgs};

/// Channel numbers of the remote command protocol.
pub mod channel {
    /// The command's input.
    pub const STDIN: u8 = 0;
    /// Its output.
    pub const STDOUT: u8 = 1;
    /// Its errors.
    pub const STDERR: u8 = 2;
    /// Its exit status (a `Status` object).
    pub const ERROR: u8 = 3;
    /// Terminal size.
    pub const RESIZE: u8 = 4;
    /// `v5.channel.k8s.io`: a channel ends (the payload names it).
    pub const CLOSE: u8 = 255;
}

/// The exit status a remote command's `Status` gives: 0 for `Success`, the `ExitCode` cause of
/// a `NonZeroExitCode` failure; another failure is `Err` with its message.
pub fn exit_status(status: &[u8]) -> Result<i32, String> {
    let v: serde_json::Value = serde_json::from_slice(status)
        .map_err(|e| format!("the exit status cannot be read: {e}"))?;
    if v["status"] == "Success" {
        return Ok(0);
    }
    let code = v["details"]["causes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["reason"] == "ExitCode")
        .and_then(|c| c["message"].as_str()?.parse().ok());
    match code {
        Some(c) => Ok(c),
        None => Err(v["message"]
            .as_str()
            .unwrap_or("the command failed")
            .to_owned()),
    }
}

/// This terminal in raw mode until dropped.
struct RawMode(Option<nix::sys::termios::Termios>);

impl RawMode {
    fn enter() -> Self {
        use nix::sys::termios::{cfmakeraw, tcgetattr, tcsetattr, SetArg};
        let stdin = std::io::stdin();
        let Ok(saved) = tcgetattr(&stdin) else {
            return RawMode(None);
        };
        let mut raw = saved.clone();
        cfmakeraw(&mut raw);
        let _ = tcsetattr(&stdin, SetArg::TCSANOW, &raw);
        RawMode(Some(saved))
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        if let Some(saved) = &self.0 {
            let _ = nix::sys::termios::tcsetattr(
                std::io::stdin(),
                nix::sys::termios::SetArg::TCSANOW,
                saved,
            );
        }
    }
}

fn resize_message() -> Option<Message> {
    let (terminal_size::Width(w), terminal_size::Height(h)) =
        terminal_size::terminal_size_of(std::io::stdin())
            .or_else(|| terminal_size::terminal_size_of(std::io::stdout()))?;
    let mut m = vec![channel::RESIZE];
    m.extend_from_slice(format!("{{\"Width\":{w},\"Height\":{h}}}").as_bytes());
    Some(Message::binary(m))
}

/// The request for `args` in container `c` of pod `ns/name`.
fn request(
    ns: &str,
    name: &str,
    c: &str,
    args: &ExecArgs,
) -> Result<tokio_tungstenite::tungstenite::handshake::client::Request, CliError> {
    let mut q: Vec<(&str, &str)> = args
        .command
        .iter()
        .map(|a| ("command", a.as_str()))
        .collect();
    // The node API's names (kubelet's `input`, `output`, `error`, `tty`: what the API server
    // passes on for kubectl's stdin, stdout, stderr, tty).
    q.push(("output", "1"));
    if args.stdin {
        q.push(("input", "1"));
    }
    if args.tty {
        q.push(("tty", "1"));
    } else {
        q.push(("error", "1"));
    }
    let url = format!(
        "ws://localhost/exec/{ns}/{name}/{c}?{}",
        serde_urlencoded::to_string(&q).unwrap_or_default()
    );
    let mut req = url
        .into_client_request()
        .map_err(|e| CliError::Io(e.to_string()))?;
    req.headers_mut().insert(
        "Sec-WebSocket-Protocol",
        "v5.channel.k8s.io, v4.channel.k8s.io"
            .parse()
            .map_err(|_| CliError::Io("header".into()))?,
    );
    Ok(req)
}

/// Runs the command; returns its exit status.
///
/// Errors: the pod or container unknown, the container not running (the agent's message), the
/// connection lost before the command's status came.
pub async fn run(client: &Client, args: &ExecArgs) -> Result<i32, CliError> {
    let pods = super::pods(client).await?;
    let pod = find_pod(&pods, args.ns.scope(), &args.pod)?;
    let (c, notice) = container(pod, args.container.as_deref())?;
    if let Some(n) = notice {
        eprintln!("{n}");
    }
    let (ns, name) = ns_name(pod);
    let stream = client.connect().await?;
    let handshake = tokio_tungstenite::client_async(request(ns, name, &c, args)?, stream);
    let Ok(answered) = tokio::time::timeout(super::client::ANSWER_TIMEOUT, handshake).await else {
        return Err(CliError::Io(format!(
            "exec: the agent did not answer within {:?}",
            super::client::ANSWER_TIMEOUT
        )));
    };
    let (ws, resp) = match answered {
        Ok(ok) => ok,
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => {
            let body = r
                .body()
                .as_deref()
                .map(String::from_utf8_lossy)
                .unwrap_or_default();
            let body = body.trim();
            return Err(CliError::Refused(if body.is_empty() {
                format!("exec refused: {}", r.status())
            } else {
                body.to_owned()
            }));
        }
        Err(e) => return Err(CliError::Io(format!("exec: {e}"))),
    };
    let v5 = resp
        .headers()
        .get("Sec-WebSocket-Protocol")
        .is_some_and(|p| p.as_bytes() == b"v5.channel.k8s.io");
    let (mut sink, mut source) = ws.split();
    let _raw = (args.tty && args.stdin).then(RawMode::enter);
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Message>(16);
    if args.tty {
        if let Some(m) = resize_message() {
            let _ = tx.send(m).await;
        }
        if let Ok(mut winch) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change())
        {
            let tx = tx.clone();
            tokio::spawn(async move {
                while winch.recv().await.is_some() {
                    if let Some(m) = resize_message() {
                        if tx.send(m).await.is_err() {
                            break;
                        }
                    }
                }
            });
        }
    }
    if args.stdin {
        tokio::spawn(pump_stdin(tx.clone(), v5, args.tty));
    }
    drop(tx);
    tokio::spawn(async move {
        while let Some(m) = rx.recv().await {
            if sink.send(m).await.is_err() {
                break;
            }
        }
    });
    let mut status = Vec::new();
    let (mut out, mut err) = (tokio::io::stdout(), tokio::io::stderr());
    while let Some(msg) = source.next().await {
        let data = match msg {
            Ok(Message::Binary(d)) => d,
            Ok(Message::Close(_)) | Err(_) => break,
            Ok(_) => continue,
        };
        let Some((&ch, payload)) = data.split_first() else {
            continue;
        };
        match ch {
            // stdout closed (`| head`): the session ends, as kubectl's does.
            channel::STDOUT
                if out.write_all(payload).await.is_err() || out.flush().await.is_err() =>
            {
                return Ok(0);
            }
            channel::STDOUT => {}
            channel::STDERR => {
                let _ = err.write_all(payload).await;
                let _ = err.flush().await;
            }
            channel::ERROR => status.extend_from_slice(payload),
            _ => {}
        }
    }
    drop(_raw);
    if status.is_empty() {
        return Err(CliError::Io(
            "exec: the connection ended before the command's exit status came".into(),
        ));
    }
    exit_status(&status).map_err(CliError::Refused)
}

/// Copies this process's stdin to channel 0 until it ends; then, with `v5`, says so on
/// channel 255. Under `v4.channel.k8s.io` the end of stdin cannot be passed on: without a
/// terminal, when the command is still running 2 s later, one line on stderr says so (it goes
/// on until it exits by itself).
async fn pump_stdin(tx: tokio::sync::mpsc::Sender<Message>, v5: bool, tty: bool) {
    let mut stdin = tokio::io::stdin();
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match stdin.read(&mut buf[1..]).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                buf[0] = channel::STDIN;
                if tx.send(Message::binary(buf[..=n].to_vec())).await.is_err() {
                    return;
                }
            }
        }
    }
    if v5 {
        let _ = tx
            .send(Message::binary(vec![channel::CLOSE, channel::STDIN]))
            .await;
    } else if !tty {
        // Said only when the command is still running a while after (this process ends as soon
        // as the command's status comes).
        crate::clock::sleep(std::time::Duration::from_secs(2)).await;
        eprintln!("nodelet exec: stdin ended, but the runtime's streaming protocol (v4.channel.k8s.io) cannot tell the command so; it runs until it exits (Ctrl-C stops waiting)");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exit_status_of_a_remote_command() {
        assert_eq!(exit_status(br#"{"metadata":{},"status":"Success"}"#), Ok(0));
        let failed = br#"{"metadata":{},"status":"Failure","message":"command terminated with non-zero exit code: error executing command [sh -c exit 7], exit code 7","reason":"NonZeroExitCode","details":{"causes":[{"reason":"ExitCode","message":"7"}]}}"#;
        assert_eq!(exit_status(failed), Ok(7));
        let other = br#"{"status":"Failure","message":"container not found"}"#;
        assert_eq!(exit_status(other), Err("container not found".into()));
    }
}
