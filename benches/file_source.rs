//! The file source's listing of a large staticPodPath, against reading the same files.
//!
//! `FILES` manifests (default 1,000: one-container pods, as the scale harness's hostile
//! directory holds a thousand entries) in a temporary directory. Timed over `ROUNDS` rounds
//! (default 50), interleaved round by round:
//!
//! - **baseline**: listing the directory and reading every file, doing nothing with the bytes
//!   (the I/O any listing has to do);
//! - **unchanged**: [`FileSource::list_if_changed`] with no file changed (the periodic listing
//!   every `fileCheckFrequency`; it reads and hashes each file and decodes none);
//! - **one changed**: the same after one manifest was rewritten with a new image (one file
//!   decoded, the full set of pods merged again).
//!
//! Prints median and p90 per listing and their ratio to the baseline's median. No containerd
//! is needed. Run: `cargo bench --bench file_source`.
// Test code reads the machine's clocks and casts measurements freely.
#![allow(clippy::disallowed_methods, clippy::cast_possible_truncation)]

use std::path::Path;
use std::time::{Duration, Instant};

use nodelet::clock::Clock;
use nodelet::events::Recorder;
use nodelet::metrics::Metrics;
use nodelet::source::file::FileSource;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn manifest(i: usize, image: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: p{i}, namespace: default}}\nspec:\n  containers:\n  - name: c\n    image: {image}\n    command: [sleep, '3600']\n    resources: {{requests: {{cpu: 10m, memory: 16Mi}}, limits: {{cpu: 500m, memory: 64Mi}}}}\n"
    )
}

/// Lists `dir` and reads every file, as any listing must.
fn raw_read(dir: &Path) -> usize {
    let mut bytes = 0;
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        bytes += std::fs::read(e.path()).map(|b| b.len()).unwrap_or(0);
    }
    bytes
}

fn quantile(v: &mut [Duration], q: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 - 1.0) * q).round() as usize]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn main() {
    let files = env_usize("FILES", 1000);
    let rounds = env_usize("ROUNDS", 50);
    let dir = tempfile::tempdir().unwrap();
    for i in 0..files {
        std::fs::write(
            dir.path().join(format!("p{i}.yaml")),
            manifest(i, "busybox:1.36"),
        )
        .unwrap();
    }
    // A clock an hour ahead of the files' times: every file counts as settled.
    let clock = nodelet::clock::FakeClock::new(nodelet::clock::SystemClock.epoch_ns());
    clock.advance(Duration::from_secs(3600));
    let mut source = FileSource::new(
        dir.path().to_owned(),
        "bench".into(),
        Recorder::default(),
        Metrics::new(),
        None,
    )
    .with_clock(clock.shared());
    assert_eq!(source.list().len(), files, "every manifest is a pod");

    let (mut raw, mut unchanged, mut changed) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        let t = Instant::now();
        std::hint::black_box(raw_read(dir.path()));
        raw.push(t.elapsed());

        let t = Instant::now();
        let none = source.list_if_changed();
        unchanged.push(t.elapsed());
        assert!(none.is_none(), "nothing changed");

        let image = format!("busybox:1.{round}");
        std::fs::write(dir.path().join("p0.yaml"), manifest(0, &image)).unwrap();
        let t = Instant::now();
        let pods = source.list_if_changed().expect("one manifest changed");
        changed.push(t.elapsed());
        assert_eq!(pods.len(), files);
    }
    let base = quantile(&mut raw, 0.5);
    println!("file source: {files} manifests, {rounds} rounds");
    for (name, v) in [
        ("baseline: list + read every file", &mut raw),
        ("listing, nothing changed", &mut unchanged),
        ("listing, one manifest changed", &mut changed),
    ] {
        let (p50, p90) = (quantile(v, 0.5), quantile(v, 0.9));
        println!(
            "  {name}: median {:.2} ms, p90 {:.2} ms, ratio {:.2}",
            ms(p50),
            ms(p90),
            p50.as_secs_f64() / base.as_secs_f64()
        );
    }
}
