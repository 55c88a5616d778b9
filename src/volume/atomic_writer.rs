//! Atomic updates of a volume's files (kubelet's `pkg/volume/util/atomic_writer.go`), for
//! configMap, secret, downwardAPI and projected volumes: a reader inside the container sees the
//! old set of files or the new one, never a mix and never a partial file.
//!
//! Layout of a volume directory, as kubelet lays it out:
//!
//! ```text
//! ..2026_12_01_03_00_00.123456789/   the files of this version (mode 0755 directory)
//! ..data -> ..2026_12_01_03_00_00.123456789
//! <name> -> ..data/<name>            one link per top-level path of the payload
//! ```
//!
//! An update writes a new timestamped directory, points a new link at it and renames that link
//! over `..data` (rename(2) is atomic), then fixes the top-level links and removes the old
//! directory.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path};

/// One file of a payload: its bytes and mode (0–0777).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileProjection {
    /// Content.
    pub data: Vec<u8>,
    /// Permission bits.
    pub mode: u32,
}

/// Relative path → file.
pub type Payload = BTreeMap<String, FileProjection>;

const DATA_DIR: &str = "..data";
const DATA_DIR_TMP: &str = "..data_tmp";

/// Checks a payload path as kubelet's `validatePath` does: relative, at most 4096 bytes, no
/// segment over 255 bytes, no `..` segment, not starting with `..`.
///
/// Errors: the reason.
pub fn validate_path(p: &str) -> Result<(), String> {
    if p.is_empty() {
        return Err("path must not be empty".into());
    }
    if p.len() > 4096 {
        return Err(format!("path {p:?} is longer than 4096 bytes"));
    }
    let path = Path::new(p);
    if path.is_absolute() {
        return Err(format!("path {p:?} must be relative"));
    }
    if p.starts_with("..") {
        return Err(format!("path {p:?} must not start with '..'"));
    }
    let mut normal = 0;
    for c in path.components() {
        match c {
            Component::Normal(s) if s.len() <= 255 => normal += 1,
            Component::Normal(_) => {
                return Err(format!("path {p:?} has a segment longer than 255 bytes"))
            }
            Component::CurDir => {}
            _ => return Err(format!("path {p:?} must not contain '..'")),
        }
    }
    if normal == 0 {
        return Err(format!("path {p:?} names no file"));
    }
    Ok(())
}

/// A payload path without `.` segments (`./x/./y` → `x/y`), as it lands on disk.
pub fn normalize(p: &str) -> String {
    Path::new(p)
        .components()
        .filter_map(|c| match c {
            Component::Normal(s) => Some(s.to_string_lossy().into_owned()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("/")
}

/// True for a version directory's name: `..` then a timestamp, one path component.
fn is_version_name(t: &Path) -> bool {
    let s = t.to_string_lossy();
    s.starts_with("..")
        && s.len() > 2
        && !s.contains('/')
        && s != DATA_DIR
        && s != DATA_DIR_TMP
        && s[2..]
            .bytes()
            .all(|b| b.is_ascii_digit() || b == b'_' || b == b'.')
}

/// Removes a file, link or directory at `p` (not following a link).
fn remove_entry(p: &Path) {
    match std::fs::symlink_metadata(p) {
        Ok(m) if m.is_dir() => {
            let _ = std::fs::remove_dir_all(p);
        }
        Ok(_) => {
            let _ = std::fs::remove_file(p);
        }
        Err(_) => {}
    }
}

/// The mode a file is written with: its own, made group-readable for an `fsGroup`.
fn effective_mode(mode: u32, gid: Option<u32>) -> u32 {
    if gid.is_some() {
        mode | 0o440
    } else {
        mode
    }
}

/// True when the files under `dir` (a version directory) are exactly `payload`, as written
/// with `gid`.
fn matches(dir: &Path, payload: &Payload, gid: Option<u32>) -> bool {
    let mut found = 0usize;
    for (p, f) in payload {
        let path = dir.join(p);
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            return false;
        };
        if !meta.is_file() || meta.permissions().mode() & 0o7777 != effective_mode(f.mode, gid) {
            return false;
        }
        match std::fs::read(&path) {
            Ok(d) if d == f.data => found += 1,
            _ => return false,
        }
    }
    count_files(dir) == found
}

fn count_files(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => count_files(&e.path()),
            Ok(_) => 1,
            Err(_) => 0,
        })
        .sum()
}

/// The top-level names of a payload (`a/b/c` → `a`).
fn top_level(payload: &Payload) -> std::collections::BTreeSet<String> {
    payload
        .keys()
        .filter_map(|p| {
            Path::new(p).components().find_map(|c| match c {
                Component::Normal(s) => Some(s.to_string_lossy().into_owned()),
                _ => None,
            })
        })
        .collect()
}

/// Writes `payload` into `dir` atomically; a payload equal to what `dir` holds changes nothing.
/// With `gid`, files and directories are group-owned by it and group-readable (kubelet's
/// `SetVolumeOwnership` for `fsGroup`). Returns true when the files changed.
///
/// Errors: an invalid path, or the I/O error of a step, naming the path; the previous version
/// stays in place.
pub fn write(dir: &Path, payload: &Payload, gid: Option<u32>) -> Result<bool, String> {
    for p in payload.keys() {
        validate_path(p)?;
    }
    let io = |what: &str, p: &Path, e: std::io::Error| format!("{what} {}: {e}", p.display());
    std::fs::create_dir_all(dir).map_err(|e| io("mkdir", dir, e))?;
    let data_link = dir.join(DATA_DIR);
    // `..data` must name a version directory of this volume (`..<timestamp>`, one component):
    // anything else (a link out of the volume, left by whatever could write here) is never
    // followed, read or removed.
    let current = std::fs::read_link(&data_link)
        .ok()
        .filter(|t| is_version_name(t))
        .map(|t| dir.join(t))
        .filter(|c| std::fs::symlink_metadata(c).is_ok_and(|m| m.is_dir()));
    let unchanged = current.as_ref().is_some_and(|c| matches(c, payload, gid));
    if !unchanged {
        let stamp = chrono_stamp();
        let ts_name = format!("..{stamp}");
        let ts_dir = dir.join(&ts_name);
        std::fs::create_dir(&ts_dir).map_err(|e| io("mkdir", &ts_dir, e))?;
        let result = (|| {
            for (p, f) in payload {
                let path = ts_dir.join(p);
                if let Some(parent) = path.parent() {
                    std::fs::create_dir_all(parent).map_err(|e| io("mkdir", parent, e))?;
                }
                std::fs::write(&path, &f.data).map_err(|e| io("write", &path, e))?;
                let mode = effective_mode(f.mode, gid);
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
                    .map_err(|e| io("chmod", &path, e))?;
            }
            set_dirs(&ts_dir, gid).map_err(|e| io("chmod", &ts_dir, e))?;
            let tmp = dir.join(DATA_DIR_TMP);
            remove_entry(&tmp);
            std::os::unix::fs::symlink(&ts_name, &tmp).map_err(|e| io("symlink", &tmp, e))?;
            std::fs::rename(&tmp, &data_link).map_err(|e| io("rename", &data_link, e))
        })();
        if let Err(e) = result {
            let _ = std::fs::remove_dir_all(&ts_dir);
            return Err(e);
        }
    }
    // The top-level links: one per name of the payload, none beyond.
    let wanted = top_level(payload);
    for name in &wanted {
        let link = dir.join(name);
        let target = Path::new(DATA_DIR).join(name);
        if std::fs::read_link(&link).ok().as_deref() != Some(target.as_path()) {
            remove_entry(&link);
            std::os::unix::fs::symlink(&target, &link).map_err(|e| io("symlink", &link, e))?;
        }
    }
    for e in std::fs::read_dir(dir)
        .map_err(|e| io("read", dir, e))?
        .flatten()
    {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with("..") || wanted.contains(&name) {
            continue;
        }
        remove_entry(&e.path());
    }
    if !unchanged {
        if let Some(c) = current {
            let _ = std::fs::remove_dir_all(c);
        }
    }
    // Versions left behind by an interrupted write, and anything else under a `..` name.
    let now = std::fs::read_link(&data_link).ok();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = e.file_name();
        if !name.to_string_lossy().starts_with("..") || name == DATA_DIR {
            continue;
        }
        if now.as_deref() != Some(Path::new(&name)) {
            remove_entry(&e.path());
        }
    }
    if let Some(g) = gid {
        std::os::unix::fs::lchown(dir, None, Some(g)).map_err(|e| io("chown", dir, e))?;
    }
    Ok(!unchanged)
}

/// Directories 0755 (with `gid`: owned by it, setgid); files group-owned by `gid`.
fn set_dirs(dir: &Path, gid: Option<u32>) -> std::io::Result<()> {
    let mode = if gid.is_some() { 0o2755 } else { 0o755 };
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))?;
    if let Some(g) = gid {
        std::os::unix::fs::chown(dir, None, Some(g))?;
    }
    for e in std::fs::read_dir(dir)?.flatten() {
        if e.file_type()?.is_dir() {
            set_dirs(&e.path(), gid)?;
        } else if let Some(g) = gid {
            std::os::unix::fs::chown(e.path(), None, Some(g))?;
        }
    }
    Ok(())
}

/// kubelet's version directory name: `2006_01_02_15_04_05.` and nanoseconds, here in UTC.
fn chrono_stamp() -> String {
    let now = crate::clock::wall_now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let secs = now.as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since the epoch (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}_{m:02}_{d:02}_{:02}_{:02}_{:02}.{:09}",
        rem / 3600,
        rem / 60 % 60,
        rem % 60,
        now.subsec_nanos()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload(items: &[(&str, &str, u32)]) -> Payload {
        items
            .iter()
            .map(|(p, d, m)| {
                (
                    p.to_string(),
                    FileProjection {
                        data: d.as_bytes().to_vec(),
                        mode: *m,
                    },
                )
            })
            .collect()
    }

    #[test]
    fn writes_swap_the_data_link_and_keep_only_current_names() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("vol");
        let first = payload(&[("a", "1", 0o644), ("sub/b", "2", 0o600)]);
        assert!(write(&dir, &first, None).unwrap());
        assert_eq!(std::fs::read_to_string(dir.join("a")).unwrap(), "1");
        assert_eq!(std::fs::read_to_string(dir.join("sub/b")).unwrap(), "2");
        assert_eq!(
            std::fs::read_link(dir.join("a")).unwrap(),
            Path::new("..data/a")
        );
        let v1 = std::fs::read_link(dir.join(DATA_DIR)).unwrap();
        assert!(
            !write(&dir, &first, None).unwrap(),
            "same payload: no change"
        );
        assert_eq!(std::fs::read_link(dir.join(DATA_DIR)).unwrap(), v1);

        let second = payload(&[("a", "new", 0o400)]);
        assert!(write(&dir, &second, None).unwrap());
        let v2 = std::fs::read_link(dir.join(DATA_DIR)).unwrap();
        assert_ne!(v1, v2);
        assert_eq!(std::fs::read_to_string(dir.join("a")).unwrap(), "new");
        let mode = std::fs::metadata(dir.join("a"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o400);
        assert!(
            !dir.join("sub").exists(),
            "a name no longer in the payload is gone"
        );
        assert!(!dir.join(&v1).exists(), "the old version is removed");
        let entries: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(entries.len(), 3, "{entries:?}");
    }

    #[test]
    fn a_data_link_out_of_the_volume_is_never_followed_or_removed() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("vol");
        let victim = tmp.path().join("victim");
        std::fs::create_dir_all(victim.join("sub")).unwrap();
        write(&dir, &payload(&[("a", "1", 0o644)]), None).unwrap();
        // What a writer inside the volume could leave: `..data` pointing out, `..data_tmp` a
        // directory.
        std::fs::remove_file(dir.join(DATA_DIR)).unwrap();
        std::os::unix::fs::symlink(&victim, dir.join(DATA_DIR)).unwrap();
        std::fs::create_dir(dir.join(DATA_DIR_TMP)).unwrap();
        assert!(write(&dir, &payload(&[("a", "1", 0o644)]), None).unwrap());
        assert!(
            victim.join("sub").is_dir(),
            "the link's target is left alone"
        );
        assert_eq!(std::fs::read_to_string(dir.join("a")).unwrap(), "1");
        assert!(is_version_name(
            &std::fs::read_link(dir.join(DATA_DIR)).unwrap()
        ));
    }

    #[test]
    fn an_fs_group_does_not_make_every_sync_a_rewrite() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("vol");
        let p = payload(&[("a", "1", 0o400)]);
        let gid = Some(0);
        assert!(write(&dir, &p, gid).unwrap());
        assert!(!write(&dir, &p, gid).unwrap(), "unchanged");
    }

    #[test]
    fn bad_paths_are_refused_before_anything_is_written() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("vol");
        for bad in ["../x", "/etc/passwd", "a/../../x", "..data", "", ".", "./."] {
            let e = write(&dir, &payload(&[(bad, "x", 0o644)]), None).unwrap_err();
            assert!(e.contains("path"), "{bad}: {e}");
        }
        assert!(!dir.exists());
    }

    #[test]
    fn stamps_are_kubelets_format() {
        let s = chrono_stamp();
        assert_eq!(s.len(), "2006_01_02_15_04_05.000000000".len(), "{s}");
        assert!(s.starts_with("20"), "{s}");
    }
}
