//! The packaged build's text order: which functions of nodelet a node's life runs, written as a
//! linker symbol-ordering file, so that `scripts/dist.sh` links them together at the start of the
//! text segment.
//!
//! Why: the agent's RSS is mostly its own text, and the kernel maps whole page-cache folios at
//! each fault in a file mapping (as large as the read-ahead that brought the file in, up to 2 MiB
//! here), so code run once in a folio maps the whole folio. With the functions a node runs spread
//! over most of the binary, the packaged agent mapped about 10 MiB of its 12.3 MiB of text at
//! 110 pods; packed together, 5.9 (benches/README.md, "text_order").
//!
//! What it does: the binary (`NODELET_BIN`, default `target/dist/nodelet`) is copied onto a
//! small ext4 file system on a loop device whose read-ahead is off (`read_ahead_kb` 0) and its
//! pages dropped, so that every page of code is read alone at its first fault and a page is
//! mapped only when the program ran in it. The agent is started from there and lives the scale
//! benchmark's burst ([`burst::warm_up`] of 10 pods, then [`burst::agent_rep`] of `PODS`
//! (default 110): start, 20 s idle with its metrics read, teardown to no sandbox left). Then the
//! pages of its text it has mapped are read from `/proc/<pid>/pagemap` (the present bit), and
//! every function (`nm`: its address and size) with a byte in one of them is written, in address
//! order, one mangled name a line, to `TEXT_ORDER` (default `target/dist/text-order.txt`). The
//! file fits only the binary it was made from (the names carry the build's hashes): the linker
//! skips the names it does not find.
//!
//! Run (root, scripts/env/up.sh first): `scripts/dist.sh` runs it between its two links, and
//! after the second with `TEXT_ORDER_CHECK=1` ([`check`]); alone,
//! `NODELET_BIN=target/dist/nodelet cargo bench --bench text_order`. Needs `mkfs.ext4`, `mount`
//! with loop devices, `losetup` and `nm` (binutils).
// Test code reads the machine's clocks and casts measurements freely.
#![allow(clippy::disallowed_methods, clippy::cast_possible_truncation)]

#[path = "agent/mod.rs"]
mod agent;
// The scale benchmark's burst, of which this uses the nodelet side.
#[allow(dead_code)]
#[path = "scale/burst.rs"]
mod burst;

use std::collections::BTreeSet;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// Page size of the pagemap, bytes.
const PAGE: u64 = 4096;

/// Runs `cmd`, panicking with its name and stderr when it fails.
fn run(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e} (is it installed?)"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// An ext4 file system in `image`, mounted on `dir` through a loop device with read-ahead off;
/// unmounted (the loop device released with it) and the image removed on drop.
struct NoReadAhead {
    image: PathBuf,
    dir: tempfile::TempDir,
}

impl NoReadAhead {
    /// Makes and mounts a file system of `bytes`.
    fn new(image: PathBuf, bytes: u64) -> Self {
        std::fs::File::create(&image)
            .and_then(|f| f.set_len(bytes))
            .unwrap_or_else(|e| panic!("{}: {e}", image.display()));
        run(Command::new("mkfs.ext4").arg("-qF").arg(&image));
        let dir = tempfile::tempdir().unwrap();
        run(Command::new("mount")
            .args(["-o", "loop"])
            .arg(&image)
            .arg(dir.path()));
        let dev = run(Command::new("losetup").arg("-j").arg(&image));
        let dev = dev
            .lines()
            .next()
            .and_then(|l| l.split(':').next())
            .and_then(|d| d.rsplit('/').next())
            .unwrap_or_else(|| panic!("no loop device holds {}", image.display()))
            .to_owned();
        std::fs::write(format!("/sys/block/{dev}/queue/read_ahead_kb"), "0")
            .unwrap_or_else(|e| panic!("/sys/block/{dev}/queue/read_ahead_kb: {e}"));
        NoReadAhead { image, dir }
    }

    /// Copies `bin` in, written out and dropped from the page cache; returns the copy's path.
    fn copy(&self, bin: &Path) -> PathBuf {
        let to = self.dir.path().join("nodelet");
        std::fs::copy(bin, &to).unwrap_or_else(|e| panic!("{}: {e}", bin.display()));
        let f = std::fs::File::open(&to).unwrap();
        f.sync_all().unwrap();
        nix::fcntl::posix_fadvise(
            &f,
            0,
            0,
            nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED,
        )
        .unwrap();
        to
    }
}

impl Drop for NoReadAhead {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).status();
        let _ = std::fs::remove_file(&self.image);
    }
}

/// The executable `PT_LOAD` segments of the ELF file `bin`: (file offset, address, size).
fn text_segments(bin: &Path) -> Vec<(u64, u64, u64)> {
    let f = std::fs::File::open(bin).unwrap();
    let mut h = [0u8; 64];
    f.read_exact_at(&mut h, 0).unwrap();
    assert_eq!(
        &h[..5],
        b"\x7fELF\x02",
        "{}: not a 64-bit ELF file",
        bin.display()
    );
    let u64_at = |b: &[u8], o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
    let u16_at = |b: &[u8], o: usize| u64::from(u16::from_le_bytes([b[o], b[o + 1]]));
    let (phoff, phentsize, phnum) = (u64_at(&h, 0x20), u16_at(&h, 0x36), u16_at(&h, 0x38));
    (0..phnum)
        .filter_map(|i| {
            let mut p = [0u8; 56];
            f.read_exact_at(&mut p, phoff + i * phentsize).unwrap();
            let (kind, flags) = (&p[0..4], p[4]);
            // PT_LOAD with PF_X.
            (kind == 1u32.to_le_bytes() && flags & 1 != 0)
                .then(|| (u64_at(&p, 8), u64_at(&p, 16), u64_at(&p, 32)))
        })
        .collect()
}

/// File offsets (page-aligned) of the pages of `bin`'s executable mappings in process `pid`
/// that are present.
fn present_pages(pid: u32, bin: &Path) -> BTreeSet<u64> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let mut pagemap = std::fs::File::open(format!("/proc/{pid}/pagemap")).unwrap();
    let mut pages = BTreeSet::new();
    for l in maps.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() < 6 || !f[1].contains('x') || Path::new(f[5]) != bin {
            continue;
        }
        let (s, e) = f[0].split_once('-').unwrap();
        let (s, e) = (
            u64::from_str_radix(s, 16).unwrap(),
            u64::from_str_radix(e, 16).unwrap(),
        );
        let off = u64::from_str_radix(f[2], 16).unwrap();
        let n = (e - s) / PAGE;
        let mut buf = vec![0u8; (n * 8) as usize];
        pagemap.seek(SeekFrom::Start(s / PAGE * 8)).unwrap();
        pagemap.read_exact(&mut buf).unwrap();
        for i in 0..n {
            let entry = u64::from_le_bytes(buf[(i * 8) as usize..][..8].try_into().unwrap());
            if entry >> 63 == 1 {
                pages.insert(off + i * PAGE);
            }
        }
    }
    pages
}

/// Functions of `bin` (`nm`: text symbols with a size) as (address, size, mangled name).
fn functions(bin: &Path) -> Vec<(u64, u64, String)> {
    run(Command::new("nm")
        .args(["--no-demangle", "-S", "--defined-only"])
        .arg(bin))
    .lines()
    .filter_map(|l| {
        let f: Vec<&str> = l.splitn(4, ' ').collect();
        if f.len() != 4 || !matches!(f[2], "t" | "T" | "W") {
            return None;
        }
        Some((
            u64::from_str_radix(f[0], 16).ok()?,
            u64::from_str_radix(f[1], 16).ok()?,
            f[3].to_owned(),
        ))
    })
    .filter(|(_, size, _)| *size > 0)
    .collect()
}

/// `TEXT_ORDER_CHECK=1`: whether the functions named in `order` lie together in `bin` (after
/// the link that used the file): prints how many were found and the span they take against their
/// size, and fails when they are spread (span above 1.1 times their size).
fn check(bin: &Path, order: &Path) {
    let names: BTreeSet<String> = std::fs::read_to_string(order)
        .unwrap_or_else(|e| {
            panic!(
                "TEXT_ORDER={}: {e} (scripts/dist.sh writes it; or set TEXT_ORDER)",
                order.display()
            )
        })
        .lines()
        .map(str::to_owned)
        .collect();
    let found: Vec<(u64, u64, String)> = functions(bin)
        .into_iter()
        .filter(|(_, _, n)| names.contains(n))
        .collect();
    let named = found
        .iter()
        .map(|(_, _, n)| n)
        .collect::<BTreeSet<_>>()
        .len();
    let bytes: u64 = found.iter().map(|(_, s, _)| s).sum();
    let span = found.iter().map(|(a, s, _)| a + s).max().unwrap_or(0)
        - found.iter().map(|(a, _, _)| *a).min().unwrap_or(0);
    let mib = |b: u64| b as f64 / f64::from(1 << 20);
    println!(
        "text_order: {}: {} of the {} names of {} found, {:.2} MiB of code within {:.2} MiB",
        bin.display(),
        named,
        names.len(),
        order.display(),
        mib(bytes),
        mib(span)
    );
    assert!(
        !found.is_empty() && span * 10 <= bytes * 11,
        "the functions of {} are not together in {}: was it linked with the file?",
        order.display(),
        bin.display()
    );
}

fn main() {
    let bin = std::env::var_os("NODELET_BIN")
        .map_or_else(|| PathBuf::from("target/dist/nodelet"), PathBuf::from);
    let out = std::env::var_os("TEXT_ORDER").map_or_else(
        || PathBuf::from("target/dist/text-order.txt"),
        PathBuf::from,
    );
    let len = std::fs::metadata(&bin)
        .unwrap_or_else(|e| {
            panic!(
                "NODELET_BIN={}: {e} (build it: scripts/dist.sh; or set NODELET_BIN)",
                bin.display()
            )
        })
        .len();
    if std::env::var("TEXT_ORDER_CHECK").is_ok_and(|v| v == "1") {
        check(&bin, &out);
        return;
    }
    assert!(
        nix::unistd::geteuid().is_root(),
        "text_order mounts a loop device: run it as root"
    );
    let pods = agent::env_usize("PODS", 110);
    let fs = NoReadAhead::new(out.with_extension("img"), len + len / 4 + (64 << 20));
    let copy = fs.copy(&bin);

    let rt = tokio::runtime::Runtime::new().unwrap();
    let cri = agent::cri_with_busybox(&rt);
    let a = agent::start_binary(&copy, "textorder", "", Stdio::null());
    let port = a.port;
    let t = burst::Target {
        name: "nodelet",
        pid: a.child.id(),
        manifests: a.manifests.clone(),
        stage: a.dir.path().join("stage"),
        node: a.node.clone(),
        metrics: Box::new(move || agent::metric_samples(port, "/metrics")),
        wait_cleared: true,
    };
    std::thread::sleep(burst::SETTLE_BEFORE);
    burst::warm_up(&rt, &cri, &t, agent::env_usize("WARMUP", 10));
    let r = burst::agent_rep(
        &rt,
        &cri,
        &t,
        pods,
        Duration::from_secs(20),
        0,
        burst::manifest,
        &mut || {},
    );

    let pages = present_pages(t.pid, &copy);
    let segments = text_segments(&bin);
    let offset = |addr: u64| {
        segments
            .iter()
            .find(|(_, va, size)| (*va..va + size).contains(&addr))
            .map(|(off, va, _)| addr - va + off)
    };
    let (mut hot, mut hot_bytes, mut all_bytes) = (Vec::new(), 0, 0);
    for (addr, size, name) in functions(&bin) {
        let Some(off) = offset(addr) else { continue };
        all_bytes += size;
        let first = off / PAGE * PAGE;
        if (first..off + size)
            .step_by(PAGE as usize)
            .any(|p| pages.contains(&p))
        {
            hot.push((addr, name));
            hot_bytes += size;
        }
    }
    hot.sort();
    let text: String = hot.iter().map(|(_, n)| format!("{n}\n")).collect();
    std::fs::write(&out, text).unwrap_or_else(|e| panic!("{}: {e}", out.display()));
    let mib = |b: u64| b as f64 / f64::from(1 << 20);
    println!(
        "text_order: {} ({pods} pods: start {:.1} s, teardown {:.1} s; RSS {:.1} MiB without read-ahead)",
        bin.display(),
        r.start,
        r.teardown,
        r.rss_mib
    );
    println!(
        "  text pages run: {} ({:.2} MiB); the functions in them: {} ({:.2} MiB of the {:.2} MiB of functions)",
        pages.len(),
        mib(pages.len() as u64 * PAGE),
        hot.len(),
        mib(hot_bytes),
        mib(all_bytes)
    );
    println!("  written to {}", out.display());
}
