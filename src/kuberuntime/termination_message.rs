//! Termination messages (kubelet's `terminationMessagePath` handling in
//! `kuberuntime_container.go`): before a container starts, an empty file
//! `<pod dir>/containers/<name>/<id>` (mode 0666, so any user of the container can write it) is
//! mounted at its `terminationMessagePath`; once it has exited, the file's last 4096 bytes
//! become the `message` of its terminated state. With `terminationMessagePolicy:
//! FallbackToLogsOnError`, an empty file and a non-zero exit code take the tail of the container's
//! log instead: its last 80 lines, at most 2048 bytes.

use std::io::Read;
use std::path::{Path, PathBuf};

use super::labels;
use crate::cri::api;

/// kubelet's `MaxContainerTerminationMessageLength`, bytes.
pub const MAX_MESSAGE_BYTES: u64 = 4096;
/// kubelet's `MaxContainerTerminationMessageLogLines`.
pub const MAX_LOG_LINES: usize = 80;
/// kubelet's `MaxContainerTerminationMessageLogLength`, bytes.
pub const MAX_LOG_BYTES: usize = 2048;

/// Creates the empty message file of a new instance of container `name` under `pod_dir` and
/// returns its path.
///
/// Errors: the I/O error of creating the directory or the file.
pub fn prepare(pod_dir: &Path, name: &str, attempt: u32) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let dir = pod_dir.join("containers").join(name);
    std::fs::create_dir_all(&dir)?;
    let now = crate::clock::wall_now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let hash = crate::hash::fnv1a64(format!("{name}/{attempt}/{now}").as_bytes());
    let id = u32::try_from(hash & 0xffff_ffff).expect("masked to 32 bits");
    let path = dir.join(format!("{id:08x}"));
    std::fs::write(&path, b"")?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666))?;
    Ok(path)
}

/// The mount of the message file at `container_path`.
pub fn mount(host: &Path, container_path: &str) -> api::Mount {
    api::Mount {
        container_path: container_path.to_owned(),
        host_path: host.display().to_string(),
        ..Default::default()
    }
}

/// The termination message of an exited container from its CRI status (kubelet's
/// `getTerminationMessage`): the file mounted at the path its annotations name, else, under
/// FallbackToLogsOnError with a non-zero exit code, the tail of its log. `None` when there is
/// none.
pub fn read(st: &api::ContainerStatus) -> Option<String> {
    let path = st
        .annotations
        .get(labels::CONTAINER_TERMINATION_MESSAGE_PATH)?;
    let policy = st
        .annotations
        .get(labels::CONTAINER_TERMINATION_MESSAGE_POLICY)
        .map(String::as_str)
        .unwrap_or("File");
    // The last mount at the path is the one the container saw (later mounts cover earlier
    // ones): the agent's own file, mounted after the pod's volumes. A volume mounted at the
    // same path is the pod's to change (a FIFO there would block the read), so it is not read.
    let from_file = st
        .mounts
        .iter()
        .rev()
        .find(|m| !path.is_empty() && m.container_path == *path)
        .and_then(|m| {
            let (buf, cut) = read_tail(Path::new(&m.host_path)).ok()?;
            // The file's last 4096 bytes (kubelet's `tail.ReadAtMost`): a character split at
            // the cut is dropped, not replaced.
            let skip = if cut {
                buf.iter()
                    .take(3)
                    .take_while(|b| (0x80..0xc0).contains(*b))
                    .count()
            } else {
                0
            };
            Some(String::from_utf8_lossy(&buf[skip..]).into_owned())
        })
        .filter(|m| !m.is_empty());
    if from_file.is_some() {
        return from_file;
    }
    if policy == "FallbackToLogsOnError" && st.exit_code != 0 && !st.log_path.is_empty() {
        return log_tail(Path::new(&st.log_path)).filter(|m| !m.is_empty());
    }
    None
}

/// The last [`MAX_MESSAGE_BYTES`] bytes of the regular file at `path` ([`open_regular`]), and
/// whether the file was longer (the bytes read start inside it).
///
/// Errors: the open's, the seek's or the read's.
fn read_tail(path: &Path) -> std::io::Result<(Vec<u8>, bool)> {
    use std::io::{Seek, SeekFrom};
    let mut f = open_regular(path)?;
    let start = f.metadata()?.len().saturating_sub(MAX_MESSAGE_BYTES);
    f.seek(SeekFrom::Start(start))?;
    let mut buf = Vec::new();
    f.take(MAX_MESSAGE_BYTES).read_to_end(&mut buf)?;
    Ok((buf, start > 0))
}

/// Opens `path` for reading only if it is a regular file and not a symbolic link, without
/// waiting: non-blocking, so a FIFO or a device put where the file was returns at once (and is
/// refused), and a read that would block fails instead of holding the thread.
///
/// Errors: the open's error; `InvalidInput` for anything but a regular file.
fn open_regular(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
        .open(path)?;
    if !f.metadata()?.file_type().is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    Ok(f)
}

/// The last [`MAX_LOG_LINES`] lines of a CRI log file (`<time> <stream> <tag> <text>`), their
/// text only, at most [`MAX_LOG_BYTES`] (the end kept).
fn log_tail(path: &Path) -> Option<String> {
    use std::io::{Seek, SeekFrom};
    let mut f = open_regular(path).ok()?;
    let len = f.metadata().ok()?.len();
    // Enough of the end of the file for 80 lines of any practical length.
    let start = len.saturating_sub(64 * 1024);
    f.seek(SeekFrom::Start(start)).ok()?;
    let mut buf = Vec::new();
    f.read_to_end(&mut buf).ok()?;
    let text = String::from_utf8_lossy(&buf);
    let mut lines: Vec<&str> = text.lines().collect();
    if start > 0 && !lines.is_empty() {
        lines.remove(0); // a partial first line
    }
    let mut out = String::new();
    for l in lines.iter().rev().take(MAX_LOG_LINES).rev() {
        let mut parts = l.splitn(4, ' ');
        let (_, _, tag, msg) = (parts.next(), parts.next(), parts.next(), parts.next());
        out.push_str(msg.unwrap_or(""));
        // A full line ends with a newline; a partial one ("P") continues on the next.
        if tag != Some("P") {
            out.push('\n');
        }
    }
    if out.len() > MAX_LOG_BYTES {
        let mut cut = out.len() - MAX_LOG_BYTES;
        while !out.is_char_boundary(cut) {
            cut += 1;
        }
        out = out[cut..].to_owned();
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(
        path: &str,
        policy: &str,
        host: &Path,
        log: &Path,
        exit_code: i32,
    ) -> api::ContainerStatus {
        api::ContainerStatus {
            exit_code,
            log_path: log.display().to_string(),
            annotations: [
                (
                    labels::CONTAINER_TERMINATION_MESSAGE_PATH.to_string(),
                    path.to_string(),
                ),
                (
                    labels::CONTAINER_TERMINATION_MESSAGE_POLICY.to_string(),
                    policy.to_string(),
                ),
            ]
            .into(),
            mounts: vec![mount(host, path)],
            ..Default::default()
        }
    }

    #[test]
    fn the_file_wins_then_the_log_tail_on_error_only() {
        let tmp = tempfile::tempdir().unwrap();
        let host = prepare(tmp.path(), "c", 0).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&host).unwrap().permissions().mode() & 0o777,
            0o666
        );
        let log = tmp.path().join("0.log");
        let mut lines = String::new();
        for i in 0..100 {
            lines.push_str(&format!(
                "2026-12-01T00:00:00.000000000Z stderr F line {i}\n"
            ));
        }
        lines.push_str("2026-12-01T00:00:00.000000000Z stderr P part\n2026-12-01T00:00:00.000000000Z stderr F ial\n");
        std::fs::write(&log, lines).unwrap();
        let p = "/dev/termination-log";
        assert_eq!(
            read(&status(p, "File", &host, &log, 1)),
            None,
            "empty file, File policy"
        );
        let tail = read(&status(p, "FallbackToLogsOnError", &host, &log, 1)).unwrap();
        assert!(tail.ends_with("line 99\npartial\n"), "{tail}");
        assert_eq!(
            tail.lines().count(),
            79,
            "80 log lines, two of them one line of text"
        );
        assert_eq!(
            read(&status(p, "FallbackToLogsOnError", &host, &log, 0)),
            None
        );
        std::fs::write(&host, format!("{}{}", "x".repeat(5000), "y".repeat(4096))).unwrap();
        let msg = read(&status(p, "FallbackToLogsOnError", &host, &log, 1)).unwrap();
        assert_eq!(msg, "y".repeat(4096), "the file first, its last 4096 bytes");
        // A character split at the cut is dropped; one whole at the start of a short file stays.
        std::fs::write(&host, format!("{}{}", "é".repeat(2000), "z".repeat(97))).unwrap();
        let msg = read(&status(p, "File", &host, &log, 1)).unwrap();
        assert_eq!(msg, format!("{}{}", "é".repeat(1999), "z".repeat(97)));
        std::fs::write(&host, "é!").unwrap();
        assert_eq!(
            read(&status(p, "File", &host, &log, 1)).as_deref(),
            Some("é!")
        );
    }

    #[test]
    fn the_file_the_container_saw_is_read_and_never_a_fifo() {
        let tmp = tempfile::tempdir().unwrap();
        let own = prepare(tmp.path(), "c", 0).unwrap();
        std::fs::write(&own, "bye").unwrap();
        let fifo = tmp.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o666)).unwrap();
        let log = tmp.path().join("0.log");
        let p = "/tm";
        // A volume of the pod mounted at the same path first (the pod turned its file into a
        // FIFO), the agent's own file after it: the container saw the agent's.
        let mut st = status(p, "File", &own, &log, 1);
        st.mounts.insert(0, mount(&fifo, p));
        assert_eq!(read(&st).as_deref(), Some("bye"));
        // A FIFO in the agent's own place: refused at once, not waited on for a writer.
        let st = status(p, "FallbackToLogsOnError", &fifo, &fifo, 1);
        assert_eq!(read(&st), None);
    }
}
