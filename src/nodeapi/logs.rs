//! `GET /containerLogs/{namespace}/{pod}/{container}` (kubelet's `getContainerLogs` and
//! `ReadLogs`): a container's output from its CRI log file
//! (`<podLogsDir>/<ns>_<pod>_<uid>/<container>/<restart>.log`, lines
//! `<RFC3339Nano time> <stdout|stderr> <F|P> <text>`), with kubelet's parameters: `follow`,
//! `previous`, `timestamps`, `sinceSeconds` or `sinceTime`, `tailLines` (or the legacy `tail`),
//! `limitBytes`.
//!
//! `follow` keeps reading as the container writes, across log rotation (the rotated file is read
//! to its end, then the new one from its start: kubelet's own follow stops at a rotation), and
//! ends when the container is no longer running and nothing new came, or when the client leaves
//! (its body is dropped: the reader notices at its next write or poll and closes the file).

use std::path::{Path, PathBuf};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::StatusCode;
use k8s_openapi::api::core::v1::Pod;
use tokio::io::{AsyncBufReadExt, AsyncSeekExt, BufReader};
use tokio::sync::mpsc;

/// How often a follower looks for new output, a rotation, the container's end and its client.
pub const FOLLOW_POLL: Duration = Duration::from_millis(200);

/// Most bytes of log text sent to the client in one write.
const CHUNK: usize = 64 << 10;

/// Bytes read from a log file at a time.
const READ_BUFFER: usize = 256 << 10;

/// kubelet's `PodLogOptions`, as the node API takes them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogOptions {
    /// Keep streaming.
    pub follow: bool,
    /// The previous instance of the container.
    pub previous: bool,
    /// Prefix each line with its time (RFC3339Nano, from the log file).
    pub timestamps: bool,
    /// Only lines at or after this time, nanoseconds since the epoch.
    pub since_ns: Option<i64>,
    /// Only the last this many lines.
    pub tail_lines: Option<usize>,
    /// At most this many bytes.
    pub limit_bytes: Option<u64>,
}

/// Parses the query parameters; `now_ns` turns `sinceSeconds` into a time.
///
/// Errors: the 400 message, naming the parameter.
pub fn parse_options(params: &[(String, String)], now_ns: i64) -> Result<LogOptions, String> {
    let mut o = LogOptions::default();
    let boolean = |k: &str, v: &str| match v {
        "true" | "1" | "" => Ok(true),
        "false" | "0" => Ok(false),
        _ => Err(format!("{k}: {v:?} is not a boolean")),
    };
    let number = |k: &str, v: &str| {
        v.parse::<i64>()
            .ok()
            .filter(|n| *n >= 0)
            .ok_or_else(|| format!("{k}: {v:?} is not a non-negative integer"))
    };
    let (mut since_seconds, mut since_time) = (None, None);
    for (k, v) in params {
        match k.as_str() {
            "follow" => o.follow = boolean(k, v)?,
            "previous" => o.previous = boolean(k, v)?,
            "timestamps" => o.timestamps = boolean(k, v)?,
            "sinceSeconds" => {
                let n = number(k, v)?;
                if n == 0 {
                    return Err("sinceSeconds: must be greater than 0".into());
                }
                since_seconds = Some(n);
            }
            "sinceTime" => {
                let t: k8s_openapi::jiff::Timestamp = v
                    .parse()
                    .map_err(|e| format!("sinceTime: {v:?} is not an RFC 3339 time: {e}"))?;
                // Nanoseconds since the epoch, clamped to i64: a time before 1677 is before
                // every line (not after all of them), one after 2262 after every line.
                let ns = t.as_nanosecond();
                since_time = Some(i64::try_from(ns).unwrap_or(if ns < 0 { i64::MIN } else { i64::MAX }));
            }
            "tailLines" => o.tail_lines = Some(usize::try_from(number(k, v)?).unwrap_or(usize::MAX)),
            "tail" if v == "all" => o.tail_lines = None,
            "tail" => o.tail_lines = Some(usize::try_from(number(k, v)?).unwrap_or(usize::MAX)),
            "limitBytes" => {
                let n = number(k, v)?;
                if n == 0 {
                    return Err("limitBytes: must be greater than 0".into());
                }
                o.limit_bytes = Some(n.unsigned_abs());
            }
            "stream" if v == "All" => {}
            "stream" => {
                return Err(format!(
                    "stream: {v:?} needs the PodLogsQuerySplitStreams feature gate, which nodelet does not implement (only All)"
                ))
            }
            // The apiserver's own; kubelet ignores it.
            "insecureSkipTLSVerifyBackend" => {}
            _ => {}
        }
    }
    o.since_ns = match (since_seconds, since_time) {
        (Some(_), Some(_)) => {
            return Err("sinceSeconds and sinceTime: at most one may be set".into())
        }
        (Some(s), None) => Some(now_ns.saturating_sub(s.saturating_mul(1_000_000_000))),
        (None, t) => t,
    };
    Ok(o)
}

/// One line of a CRI log file: its time (nanoseconds), its time as written, whether it ends a
/// line (`F`) or is part of one (`P`), and its text.
#[derive(Debug, PartialEq, Eq)]
pub struct Entry<'a> {
    /// Time, nanoseconds since the epoch.
    pub time_ns: i64,
    /// Time as written (RFC3339Nano).
    pub time: &'a str,
    /// `F`: the text ends a line.
    pub full: bool,
    /// The text, without its newline.
    pub text: &'a [u8],
}

/// Parses one CRI log line (without its newline); `None` for a malformed one.
pub fn parse_line(line: &[u8]) -> Option<Entry<'_>> {
    let mut parts = line.splitn(4, |b| *b == b' ');
    let time = std::str::from_utf8(parts.next()?).ok()?;
    let _stream = parts.next()?;
    let tag = parts.next()?;
    let text = parts.next().unwrap_or_default();
    let t: k8s_openapi::jiff::Timestamp = time.parse().ok()?;
    Some(Entry {
        time_ns: i64::try_from(t.as_nanosecond()).unwrap_or(i64::MAX),
        time,
        full: tag != b"P",
        text,
    })
}

/// What a log request reads: the file and what to do with it.
pub struct LogRequest {
    /// The log file.
    pub path: PathBuf,
    /// The options.
    pub options: LogOptions,
    /// While following: whether the container still runs (its output may still grow).
    pub running: Box<dyn Fn() -> bool + Send + Sync>,
}

/// What a container's status says of its instances, for [`log_file`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Instances {
    /// Its restart count: the newest instance's (its log is `<restart>.log`).
    pub restart: i32,
    /// Its state is waiting: the newest instance has ended (a restart's back-off) or none ran.
    pub waiting: bool,
    /// It has a `lastState.terminated`.
    pub last_terminated: bool,
}

/// The log file of `container` of `pod`, or of its last terminated instance when `previous`
/// (kubelet's `validateContainerLogStatus`: `--previous` reads `lastState.terminated`, which is
/// the newest instance itself while the container waits to restart, else the one before it).
///
/// Errors: 400 with kubelet's message when there is no previous instance, or the container has
/// not started (no file yet).
pub fn log_file(
    logs_dir: &Path,
    pod: &Pod,
    container: &str,
    instances: Instances,
    previous: bool,
) -> Result<PathBuf, (StatusCode, String)> {
    let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
    let restart = instances.restart;
    let n = if previous {
        if !instances.last_terminated || (restart == 0 && !instances.waiting) {
            return Err((
                StatusCode::BAD_REQUEST,
                format!(
                    "previous terminated container {container:?} in pod {pod_name:?} not found"
                ),
            ));
        }
        if instances.waiting {
            restart
        } else {
            restart - 1
        }
    } else {
        restart
    };
    let path = logs_dir.join(container).join(format!("{n}.log"));
    if !path.exists() {
        return Err((
            StatusCode::BAD_REQUEST,
            format!("container {container:?} in pod {pod_name:?} is waiting to start"),
        ));
    }
    Ok(path)
}

/// The response body streaming `req` (chunked), produced by a task that ends with the stream,
/// or when the body is dropped.
pub fn stream(req: LogRequest) -> Body {
    let (tx, rx) = mpsc::channel::<Bytes>(16);
    tokio::spawn(async move {
        if let Err(e) = read_logs(req, &tx).await {
            tracing::debug!(error = %e, "container log stream ended");
        }
    });
    Body::from_stream(futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<Bytes, std::convert::Infallible>(b), rx))
    }))
}

/// Where a read starts: the offset of the last `n` lines of `path`, read backwards from the end
/// in 64 KiB blocks (kubelet's `tail.FindTailLineStartIndex`): a log grown far past
/// `containerLogMaxSize` between two rotation checks costs one block of memory per request, not
/// the file.
async fn tail_offset(path: &Path, n: usize) -> std::io::Result<u64> {
    use tokio::io::AsyncReadExt;
    let mut f = tokio::fs::File::open(path).await?;
    // The file ends with a newline; the last line's is not a separator.
    let mut end = f.metadata().await?.len().saturating_sub(1);
    let mut newlines = 0;
    let mut buf = vec![0u8; 64 << 10];
    while end > 0 {
        let start = end.saturating_sub(buf.len() as u64);
        let block = &mut buf[..usize::try_from(end - start).unwrap_or(0)];
        f.seek(std::io::SeekFrom::Start(start)).await?;
        f.read_exact(block).await?;
        for (i, b) in block.iter().enumerate().rev() {
            if *b == b'\n' {
                newlines += 1;
                if newlines == n {
                    return Ok(start + i as u64 + 1);
                }
            }
        }
        end = start;
    }
    Ok(0)
}

/// The rotated files of `path` written after the one with inode `ino` (the file a follower was
/// reading), oldest first; none when that file is gone (pruned: `containerLogMaxFiles`).
fn rotated_after(path: &Path, ino: Option<u64>) -> Vec<PathBuf> {
    let rotated = crate::kuberuntime::logs::rotated_files(path);
    match rotated.iter().position(|p| inode(p) == ino) {
        Some(i) => rotated[i + 1..].to_vec(),
        None => Vec::new(),
    }
}

/// The inode of `path`, if it exists.
fn inode(path: &Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| m.ino())
}

/// A log file being read: what is left of the byte limit, and a line still being written.
struct Reading<'a> {
    reader: BufReader<tokio::fs::File>,
    line: Vec<u8>,
    left: u64,
    options: &'a LogOptions,
}

impl Reading<'_> {
    /// Sends every complete line there is now, in chunks of up to [`CHUNK`] bytes (one write
    /// per line would cost a channel message, a chunk header and a TLS record per line);
    /// `Ok(true)` once the byte limit is reached.
    async fn drain(&mut self, tx: &mpsc::Sender<Bytes>) -> std::io::Result<bool> {
        let mut out = Vec::new();
        loop {
            let n = self.reader.read_until(b'\n', &mut self.line).await?;
            if n == 0 || self.line.last() != Some(&b'\n') {
                // At the end; a line being written stays in `line` until its newline comes.
                send(tx, out).await?;
                return Ok(false);
            }
            self.line.pop();
            if let Some(e) = parse_line(&self.line) {
                if self.options.since_ns.is_none_or(|s| e.time_ns >= s) {
                    let start = out.len();
                    if self.options.timestamps {
                        out.extend_from_slice(e.time.as_bytes());
                        out.push(b' ');
                    }
                    out.extend_from_slice(e.text);
                    if e.full {
                        out.push(b'\n');
                    }
                    let take =
                        (out.len() - start).min(usize::try_from(self.left).unwrap_or(usize::MAX));
                    out.truncate(start + take);
                    self.left -= take as u64;
                    if self.left == 0 {
                        send(tx, out).await?;
                        return Ok(true);
                    }
                    if out.len() >= CHUNK {
                        send(tx, std::mem::take(&mut out)).await?;
                    }
                }
            }
            self.line.clear();
        }
    }
}

/// Writes what the client asked for; returns when done, or with the error that stopped it (the
/// client left: a send failed).
async fn read_logs(req: LogRequest, tx: &mpsc::Sender<Bytes>) -> std::io::Result<()> {
    let o = &req.options;
    let mut file = tokio::fs::File::open(&req.path).await?;
    let mut ino = inode(&req.path);
    if let Some(n) = o.tail_lines {
        let at = if n == 0 {
            file.metadata().await?.len()
        } else {
            tail_offset(&req.path, n).await?
        };
        file.seek(std::io::SeekFrom::Start(at)).await?;
    }
    let mut r = Reading {
        reader: BufReader::with_capacity(READ_BUFFER, file),
        line: Vec::new(),
        left: o.limit_bytes.unwrap_or(u64::MAX),
        options: o,
    };
    let mut quiet_since = crate::clock::monotonic_now();
    loop {
        let before = r.left;
        if r.drain(tx).await? || !o.follow {
            return Ok(());
        }
        if r.left != before {
            quiet_since = crate::clock::monotonic_now();
        }
        crate::clock::sleep(FOLLOW_POLL).await;
        if tx.is_closed() {
            return Err(gone());
        }
        let now_ino = inode(&req.path);
        if now_ino.is_some() && now_ino != ino {
            // Rotated: the rest of the old file first, then any file rotated after it (more than
            // one rotation between two polls), then the new one from its start.
            if r.drain(tx).await? {
                return Ok(());
            }
            for p in rotated_after(&req.path, ino) {
                r.reader = BufReader::with_capacity(READ_BUFFER, tokio::fs::File::open(&p).await?);
                r.line.clear();
                if r.drain(tx).await? {
                    return Ok(());
                }
            }
            r.reader =
                BufReader::with_capacity(READ_BUFFER, tokio::fs::File::open(&req.path).await?);
            r.line.clear();
            ino = now_ino;
            continue;
        }
        if quiet_since.elapsed() >= Duration::from_secs(1) && !(req.running)() {
            // What came between the last read and the check, then the end.
            r.drain(tx).await?;
            return Ok(());
        }
    }
}

fn gone() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the client left")
}

async fn send(tx: &mpsc::Sender<Bytes>, out: Vec<u8>) -> std::io::Result<()> {
    if out.is_empty() {
        return Ok(());
    }
    tx.send(Bytes::from(out)).await.map_err(|_| gone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn previous_is_the_last_terminated_instance_as_kubelet_reads_it() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join("c")).unwrap();
        for n in [1, 2] {
            std::fs::write(tmp.path().join(format!("c/{n}.log")), "x").unwrap();
        }
        let pod = Pod::default();
        let file = |restart, waiting, last_terminated, previous| {
            let i = Instances {
                restart,
                waiting,
                last_terminated,
            };
            log_file(tmp.path(), &pod, "c", i, previous)
                .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        };
        // Instance 2 runs: the previous is 1.
        assert_eq!(file(2, false, true, true).unwrap(), "1.log");
        assert_eq!(file(2, false, true, false).unwrap(), "2.log");
        // Instance 2 ended and waits for its restart: it is the previous (lastState).
        assert_eq!(file(2, true, true, true).unwrap(), "2.log");
        // Never terminated: no previous.
        assert_eq!(
            file(0, false, false, true).unwrap_err().0,
            StatusCode::BAD_REQUEST
        );
        // The instance before the newest was removed (one dead instance is kept).
        assert!(file(1, false, true, true).is_err());
    }

    fn params(q: &[(&str, &str)]) -> Vec<(String, String)> {
        q.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn options_follow_kubelets_parameters_and_name_the_bad_one() {
        let o = parse_options(
            &params(&[
                ("follow", "true"),
                ("tailLines", "5"),
                ("limitBytes", "100"),
            ]),
            0,
        )
        .unwrap();
        assert!(o.follow && o.tail_lines == Some(5) && o.limit_bytes == Some(100));
        let o = parse_options(&params(&[("sinceSeconds", "10")]), 20_000_000_000).unwrap();
        assert_eq!(o.since_ns, Some(10_000_000_000));
        assert_eq!(
            parse_options(&params(&[("tail", "all")]), 0)
                .unwrap()
                .tail_lines,
            None
        );
        for (k, v) in [
            ("tailLines", "-1"),
            ("limitBytes", "x"),
            ("follow", "maybe"),
            ("sinceTime", "yesterday"),
            ("stream", "Stdout"),
        ] {
            let e = parse_options(&params(&[(k, v)]), 0).unwrap_err();
            assert!(e.starts_with(k), "{k}: {e}");
        }
        let e = parse_options(
            &params(&[("sinceSeconds", "1"), ("sinceTime", "2026-01-01T00:00:00Z")]),
            0,
        )
        .unwrap_err();
        assert!(e.contains("sinceSeconds and sinceTime"), "{e}");
        // Before 1677 (out of i64 nanoseconds): before every line, not after all of them.
        let o = parse_options(&params(&[("sinceTime", "1600-01-01T00:00:00Z")]), 0).unwrap();
        assert_eq!(o.since_ns, Some(i64::MIN));
        let o = parse_options(&params(&[("sinceTime", "2300-01-01T00:00:00Z")]), 0).unwrap();
        assert_eq!(o.since_ns, Some(i64::MAX));
    }

    #[test]
    fn cri_log_lines_are_parsed_with_their_tags() {
        let e = parse_line(b"2026-12-04T05:00:00.123456789Z stdout F hello world").unwrap();
        assert_eq!(e.text, b"hello world");
        assert!(e.full);
        assert_eq!(e.time, "2026-12-04T05:00:00.123456789Z");
        let p = parse_line(b"2026-12-04T05:00:00Z stderr P part").unwrap();
        assert!(!p.full);
        assert_eq!(
            parse_line(b"2026-12-04T05:00:00Z stdout F ").unwrap().text,
            b""
        );
        assert!(parse_line(b"garbage").is_none());
    }

    async fn collect(req: LogRequest) -> String {
        let (tx, mut rx) = mpsc::channel(16);
        let task = tokio::spawn(async move { read_logs(req, &tx).await });
        let mut out = Vec::new();
        while let Some(b) = rx.recv().await {
            out.extend_from_slice(&b);
        }
        task.await.unwrap().unwrap();
        String::from_utf8(out).unwrap()
    }

    #[tokio::test]
    async fn the_tail_is_found_across_blocks_from_the_end() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("0.log");
        // 3,000 lines of 100 bytes: 300 KB, several of the 64 KiB blocks read from the end.
        let line = |i: usize| format!("2026-12-04T05:00:00Z stdout F {i:069}\n");
        let text: String = (0..3000).map(line).collect();
        std::fs::write(&path, &text).unwrap();
        assert_eq!(line(0).len(), 100);
        for n in [1usize, 2, 655, 656, 1000, 2999] {
            let at = tail_offset(&path, n).await.unwrap();
            assert_eq!(at, ((3000 - n) * 100) as u64, "last {n} lines");
        }
        assert_eq!(tail_offset(&path, 3000).await.unwrap(), 0, "all of them");
        assert_eq!(
            tail_offset(&path, 5000).await.unwrap(),
            0,
            "more than there are"
        );
    }

    #[tokio::test]
    async fn tail_since_timestamps_and_limit_apply_to_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("0.log");
        std::fs::write(
            &path,
            "2026-12-04T05:00:01Z stdout F one\n2026-12-04T05:00:02Z stdout P tw\n2026-12-04T05:00:02Z stdout F o\n2026-12-04T05:00:03Z stderr F three\n",
        )
        .unwrap();
        let req = |options| LogRequest {
            path: path.clone(),
            options,
            running: Box::new(|| false),
        };
        assert_eq!(
            collect(req(LogOptions::default())).await,
            "one\ntwo\nthree\n"
        );
        let tail = LogOptions {
            tail_lines: Some(1),
            timestamps: true,
            ..Default::default()
        };
        assert_eq!(collect(req(tail)).await, "2026-12-04T05:00:03Z three\n");
        let since = LogOptions {
            since_ns: Some(1_796_360_402_000_000_000),
            ..Default::default()
        };
        assert_eq!(collect(req(since)).await, "two\nthree\n");
        let limit = LogOptions {
            limit_bytes: Some(6),
            ..Default::default()
        };
        assert_eq!(collect(req(limit)).await, "one\ntw");
    }

    #[tokio::test]
    async fn a_follower_reads_across_a_rotation_and_ends_with_the_container() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("0.log");
        std::fs::write(&path, "2026-12-04T05:00:01Z stdout F before\n").unwrap();
        let running = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let r = running.clone();
        let req = LogRequest {
            path: path.clone(),
            options: LogOptions {
                follow: true,
                ..Default::default()
            },
            running: Box::new(move || r.load(std::sync::atomic::Ordering::SeqCst)),
        };
        let (tx, mut rx) = mpsc::channel(16);
        let task = tokio::spawn(async move { read_logs(req, &tx).await });
        assert_eq!(&rx.recv().await.unwrap()[..], b"before\n");
        // Rotated as kuberuntime's rotation does: renamed aside, then a new file.
        use std::io::Write;
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(b"2026-12-04T05:00:02Z stdout F last of the old\n")
            .unwrap();
        std::fs::rename(&path, dir.path().join("0.log.20261204-050002")).unwrap();
        std::fs::write(&path, "2026-12-04T05:00:03Z stdout F after\n").unwrap();
        assert_eq!(&rx.recv().await.unwrap()[..], b"last of the old\n");
        assert_eq!(&rx.recv().await.unwrap()[..], b"after\n");
        // Two rotations between two polls: the file in between is read too, in order.
        std::fs::rename(&path, dir.path().join("0.log.20261204-050004")).unwrap();
        std::fs::write(&path, "2026-12-04T05:00:05Z stdout F middle\n").unwrap();
        std::fs::rename(&path, dir.path().join("0.log.20261204-050005")).unwrap();
        std::fs::write(&path, "2026-12-04T05:00:06Z stdout F newest\n").unwrap();
        assert_eq!(&rx.recv().await.unwrap()[..], b"middle\n");
        assert_eq!(&rx.recv().await.unwrap()[..], b"newest\n");
        running.store(false, std::sync::atomic::Ordering::SeqCst);
        assert!(rx.recv().await.is_none(), "ends with the container");
        task.await.unwrap().unwrap();
    }
}
