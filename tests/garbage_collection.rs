//! Garbage collection on a real containerd (issue 35): what a gone pod leaves is removed after
//! an agent restart, a crash-looping container leaves one dead instance, image garbage
//! collection removes unused images and keeps the used and the sandbox image, and disk pressure
//! reclaims images before it evicts. Needs `scripts/env/up.sh` (it builds and pushes the filler
//! image these tests pull).
//!
//! These tests remove images from the containerd every test shares, so they run one at a time
//! (the lock below), and give back every image they found (pulled again from the local
//! registry) when they end.
// Test code reads the machine's clocks and casts measurements freely.
#![allow(clippy::disallowed_methods, clippy::cast_possible_truncation)]

mod common;

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::{pod_cgroup_dirs, wait_until, Nodelet, Runtime};
use nodelet::cri::{api, ImageService};

/// One test at a time in this binary: they remove shared images and measure the disk.
static SERIAL: Mutex<()> = Mutex::new(());

/// The image only these tests use: 32 MiB that do not compress (scripts/env/up.sh).
const FILLER: &str = "docker.io/nodelet-test/filler:gc";

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn images(rt: &Runtime) -> Vec<api::Image> {
    rt.rt.block_on(rt.cri.list_images()).unwrap()
}

fn has_image(rt: &Runtime, reference: &str) -> bool {
    images(rt)
        .iter()
        .any(|i| i.repo_tags.iter().any(|t| t == reference))
}

fn pull(rt: &Runtime, reference: &str) {
    rt.rt
        .block_on(rt.cri.pull_image(reference, None, None))
        .unwrap_or_else(|e| panic!("pull {reference}: {e}"));
}

/// Pulls `reference` and checks that the runtime lists it.
fn pull_listed(rt: &Runtime, reference: &str) {
    pull(rt, reference);
    assert!(
        has_image(rt, reference),
        "{reference} pulled but not listed"
    );
}

/// Gives back, when dropped, every tagged image the runtime held when it was made: the tests
/// of the other binaries find the store as the environment left it.
struct RestoreImages(Vec<String>);

impl RestoreImages {
    fn new(rt: &Runtime) -> Self {
        Self(
            images(rt)
                .into_iter()
                .flat_map(|i| i.repo_tags)
                .filter(|t| t != FILLER)
                .collect(),
        )
    }
}

impl Drop for RestoreImages {
    fn drop(&mut self) {
        let rt = Runtime::new();
        for tag in &self.0 {
            if !has_image(&rt, tag) {
                pull(&rt, tag);
            }
        }
        let filler = images(&rt)
            .into_iter()
            .find(|i| i.repo_tags.iter().any(|t| t == FILLER));
        if let Some(f) = filler {
            let _ = rt.rt.block_on(rt.cri.remove_image(&f.id));
        }
    }
}

fn sleeper(name: &str, extra: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: busybox:1.36\n    command: [sh, -c, 'echo hello; sleep 3600']\n{extra}"
    )
}

/// Lines of the agent's log that name `needle`.
fn log_lines(n: &Nodelet, needle: &str) -> usize {
    n.log().lines().filter(|l| l.contains(needle)).count()
}

#[test]
fn a_pod_removed_while_the_agent_was_down_leaves_nothing() {
    let _serial = serial();
    let mut n = Nodelet::new("gc-restart");
    n.start();
    let volumes = "    volumeMounts: [{name: scratch, mountPath: /scratch}, {name: mem, mountPath: /mem}]\n  volumes:\n  - {name: scratch, emptyDir: {}}\n  - {name: mem, emptyDir: {medium: Memory}}\n";
    n.write_manifest("gone.yaml", &sleeper("gone", volumes));
    n.write_manifest("kept.yaml", &sleeper("kept", ""));
    let uid = n.uid("gone");
    let kept = n.uid("kept");
    n.wait_running(&uid, &["c"], Duration::from_secs(30));
    n.wait_running(&kept, &["c"], Duration::from_secs(30));
    let pod_dir = n.root().join("pods").join(&uid);
    let log_dir = n.logs().join(format!("default_gone-{}_{uid}", n.node));
    wait_until(Duration::from_secs(10), "the pod's log written", || {
        std::fs::read_to_string(log_dir.join("c/0.log")).is_ok_and(|l| l.contains("hello"))
    });
    assert!(pod_dir.join("volumes").exists() && !pod_cgroup_dirs(&n.cgroup_root, &uid).is_empty());

    // Leftovers of a crash in the middle of a clean-up: a pod directory and a log directory with
    // no sandbox left, and a pod directory holding a bind mount another process made (busy: the
    // mount's source keeps its files). Hostile entries: a pod directory that is a symlink, and a
    // volume plugin directory that is one; what they point to stays.
    let ghost = "0c4d1f2e-7a7b-4c55-9d1e-5b0d7c6a1111";
    let busy = "0c4d1f2e-7a7b-4c55-9d1e-5b0d7c6a2222";
    let outside = tempfile::tempdir().unwrap();
    let keep = outside
        .path()
        .join("volumes/kubernetes.io~empty-dir/precious");
    std::fs::create_dir_all(&keep).unwrap();
    std::fs::write(keep.join("file"), "keep").unwrap();
    let linked = n.root().join("pods/0c4d1f2e-7a7b-4c55-9d1e-5b0d7c6a3333");
    std::fs::create_dir_all(n.root().join("pods")).unwrap();
    std::os::unix::fs::symlink(outside.path(), &linked).unwrap();
    let plugin_linked = n
        .root()
        .join("pods/0c4d1f2e-7a7b-4c55-9d1e-5b0d7c6a4444/volumes");
    std::fs::create_dir_all(&plugin_linked).unwrap();
    std::os::unix::fs::symlink(
        outside.path().join("volumes/kubernetes.io~empty-dir"),
        plugin_linked.join("kubernetes.io~empty-dir"),
    )
    .unwrap();
    std::fs::create_dir_all(n.root().join("pods").join(ghost).join("volumes")).unwrap();
    let ghost_logs = n.logs().join(format!("default_ghost_{ghost}"));
    std::fs::create_dir_all(ghost_logs.join("c")).unwrap();
    std::fs::write(ghost_logs.join("c/0.log"), "x").unwrap();
    let busy_mount = n.root().join("pods").join(busy).join("plugins/held");
    std::fs::create_dir_all(&busy_mount).unwrap();
    bind_mount(outside.path(), &busy_mount);
    let _unmount = Unmount(busy_mount.clone());

    n.kill9();
    std::fs::remove_file(n.manifests().join("gone.yaml")).unwrap();
    n.start();
    let started = Instant::now();
    wait_until(
        Duration::from_secs(5),
        "everything of the removed pod gone",
        || {
            n.runtime.containers(&uid).is_empty()
                && n.runtime.sandboxes(&uid).is_empty()
                && pod_cgroup_dirs(&n.cgroup_root, &uid).is_empty()
                && !pod_dir.exists()
                && !log_dir.exists()
                && !n.root().join("pods").join(ghost).exists()
                && !ghost_logs.exists()
                && std::fs::symlink_metadata(&linked).is_err()
                && !plugin_linked.exists()
        },
    );
    eprintln!(
        "removed pod cleaned up {:?} after the restart",
        started.elapsed()
    );
    // The other pod was adopted, untouched.
    assert_eq!(n.runtime.containers(&kept).len(), 1);
    assert!(n.root().join("pods").join(&kept).exists());
    // Nothing more about the gone pod once its worker said it was removed; the busy directory
    // is reported once.
    wait_until(Duration::from_secs(5), "the gone pod's worker done", || {
        n.log().contains("pod terminated; worker exits")
    });
    // The next relist (every second) reports the removal; then nothing more.
    n.wait_for_housekeeping(2);
    let about_uid = log_lines(&n, &uid);
    n.wait_for_housekeeping(5);
    assert_eq!(
        log_lines(&n, &uid),
        about_uid,
        "log lines about the gone pod after it went"
    );
    assert_eq!(
        log_lines(&n, "cannot remove orphaned pod directory"),
        1,
        "the busy directory is reported once: {}",
        n.log()
    );
    assert!(busy_mount.exists());
    assert_eq!(
        std::fs::read_to_string(keep.join("file")).unwrap(),
        "keep",
        "nothing behind a symlink or inside a mount is removed"
    );
    // Once the mount is gone, a retry (back-off 2 s, 4 s, 8 s...) removes it.
    unmount(&busy_mount);
    wait_until(
        Duration::from_secs(40),
        "the busy directory removed at last",
        || !n.root().join("pods").join(busy).exists(),
    );
    assert!(n.log().contains("removed orphaned pod directory at last"));
}

fn bind_mount(from: &Path, at: &Path) {
    let ok = std::process::Command::new("mount")
        .arg("--bind")
        .arg(from)
        .arg(at)
        .status()
        .unwrap()
        .success();
    assert!(ok, "mount --bind {} {}", from.display(), at.display());
}

fn unmount(at: &Path) {
    let _ = std::process::Command::new("umount")
        .arg(at)
        .stderr(std::process::Stdio::null())
        .status();
}

/// Unmounts when dropped (a failed test leaves no mount behind).
struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        unmount(&self.0);
    }
}

#[test]
fn a_crash_looping_container_leaves_one_dead_instance() {
    let _serial = serial();
    let mut n = Nodelet::with_config(
        "gc-crashloop",
        "crashLoopBackOff: {initialContainerRestartPeriod: 500ms, maxContainerRestartPeriod: 1s}\n",
    );
    n.start();
    n.write_manifest(
        "crash.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: crash}\nspec:\n  containers:\n  - name: c\n    image: busybox:1.36\n    command: [sh, -c, 'echo run; exit 1']\n",
    );
    let uid = n.uid("crash");
    let log_dir = n.logs().join(format!("default_crash-{}_{uid}/c", n.node));
    // Samples of the dead instances and of the container's log files; a second dead instance
    // (and its log) may be seen for the moment between a death and the clean-up it triggers.
    let mut samples: Vec<(Instant, usize, usize)> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    let restarts = |n: &Nodelet| {
        n.pod("crash")
            .and_then(|p| p["status"]["containerStatuses"][0]["restartCount"].as_i64())
            .unwrap_or(0)
    };
    while restarts(&n) < 8 && Instant::now() < deadline {
        let dead = n
            .runtime
            .containers(&uid)
            .iter()
            .filter(|c| c.state == api::ContainerState::ContainerExited as i32)
            .count();
        let logs = std::fs::read_dir(&log_dir).map(|d| d.count()).unwrap_or(0);
        samples.push((Instant::now(), dead, logs));
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(restarts(&n) >= 8, "it crash-looped: {}", restarts(&n));
    let most = samples.iter().map(|s| s.1).max().unwrap_or(0);
    // The longest stretch with a second dead instance: from a death to the pass it triggers.
    let (mut longest, mut since) = (Duration::ZERO, None::<Instant>);
    for (at, dead, _) in &samples {
        match (dead > &1, since) {
            (true, None) => since = Some(*at),
            (true, Some(s)) => longest = longest.max(at.duration_since(s)),
            (false, _) => since = None,
        }
    }
    eprintln!(
        "{} samples: at most {most} dead instances; a second one lasted at most {longest:?}",
        samples.len()
    );
    assert!(
        most <= 2,
        "never more than a moment's second dead instance: {samples:?}"
    );
    assert!(
        longest < Duration::from_secs(2),
        "a second dead instance is a moment ({longest:?}), not a state: {samples:?}"
    );
    assert!(
        samples.iter().all(|s| s.2 <= 3),
        "logs of removed instances go with them: {samples:?}"
    );
    // At rest: one dead instance, whose exit the status shows, and its log for logs -p.
    wait_until(Duration::from_secs(10), "one dead instance", || {
        n.runtime
            .containers(&uid)
            .iter()
            .filter(|c| c.state == api::ContainerState::ContainerExited as i32)
            .count()
            <= 1
    });
    assert!(n.metric("nodelet_containers_garbage_collected_total{reason=\"policy\"}") >= 5.0);
}

#[test]
fn image_gc_removes_an_unused_image_and_keeps_the_used_and_the_sandbox_image() {
    let _serial = serial();
    let rt = Runtime::new();
    let _restore = RestoreImages::new(&rt);
    pull_listed(&rt, FILLER);
    pull_listed(&rt, "docker.io/library/busybox:1.35");
    // Any disk is "full" at 1%: each pass frees what it may; images first seen more than 1 s ago.
    let mut n = Nodelet::with_config(
        "gc-images",
        "imageGCHighThresholdPercent: 1\nimageGCLowThresholdPercent: 0\nimageMinimumGCAge: 1s\nimageGCPeriod: 2s\n",
    );
    n.start();
    n.write_manifest("web.yaml", &sleeper("web", ""));
    // A pod that names its image in another spelling and needs it only after an init container
    // has run for a while (pull policy Never: a removed image would leave it waiting).
    n.write_manifest(
        "later.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: later}\nspec:\n  terminationGracePeriodSeconds: 1\n  initContainers:\n  - {name: wait, image: busybox:1.36, command: [sleep, '6']}\n  containers:\n  - {name: main, image: 'docker.io/busybox:1.35', imagePullPolicy: Never, command: [sleep, '3600']}\n",
    );
    let uid = n.uid("web");
    n.wait_running(&uid, &["c"], Duration::from_secs(30));
    wait_until(Duration::from_secs(20), "the filler image removed", || {
        !has_image(&rt, FILLER)
    });
    assert!(has_image(&rt, "docker.io/library/busybox:1.36"), "in use");
    assert!(
        has_image(&rt, "registry.k8s.io/pause:3.9"),
        "the sandbox image"
    );
    // Counted just after the runtime removed it.
    wait_until(Duration::from_secs(5), "the removal counted", || {
        n.metric("kubelet_image_garbage_collected_total{reason=\"space\"}") >= 1.0
    });
    wait_until(Duration::from_secs(5), "a FreedDiskSpace event", || {
        n.get("/events").unwrap().contains("FreedDiskSpace")
    });
    // The pod still runs: nothing it needs went; the other one starts after its init container.
    assert_eq!(
        common::running_by_name(&n.runtime.containers(&uid)).len(),
        1
    );
    let later = n.uid("later");
    n.wait_running(&later, &["main"], Duration::from_secs(30));
    assert!(has_image(&rt, "docker.io/library/busybox:1.35"));
}

#[test]
fn disk_pressure_that_image_gc_resolves_evicts_no_pod() {
    let _serial = serial();
    let rt = Runtime::new();
    let _restore = RestoreImages::new(&rt);
    // imagefs here is the root filesystem (the environment's containerd keeps its images under
    // /var/lib). The filler (about 64 MiB on disk) is there first; the threshold sits 16 MiB
    // below what is free then. A 48 MiB file written later crosses it; removing the filler comes
    // back 16 MiB above it.
    pull_listed(&rt, FILLER);
    let (_, free) = nodelet::gc::fs_bytes(Path::new("/var/lib/nodelet-env")).unwrap();
    let threshold = free - (16 << 20);
    let mut n = Nodelet::with_config(
        "gc-pressure",
        &format!(
            "evictionHard: {{imagefs.available: '{threshold}'}}\nevictionMonitoringPeriod: 1s\nevictionPressureTransitionPeriod: 1s\nimageGCHighThresholdPercent: 100\nimageMinimumGCAge: 0s\n"
        ),
    );
    n.start();
    n.write_manifest("web.yaml", &sleeper("web", ""));
    let uid = n.uid("web");
    n.wait_running(&uid, &["c"], Duration::from_secs(30));
    let node = || -> serde_json::Value { serde_json::from_str(&n.get("/node").unwrap()).unwrap() };
    assert_eq!(node()["reclaims"].as_array().map(Vec::len), Some(0));
    assert!(has_image(&rt, FILLER), "no pressure yet: the filler stays");
    let ballast = Ballast::write(Path::new("/var/lib/nodelet-env/gc-test-ballast"), 48 << 20);
    wait_until(
        Duration::from_secs(20),
        "a reclaim under disk pressure",
        || {
            node()["reclaims"]
                .as_array()
                .is_some_and(|r| r.iter().any(|r| r["resolved"] == true))
        },
    );
    let reclaim = node()["reclaims"][0].clone();
    eprintln!("reclaim: {reclaim}");
    assert_eq!(reclaim["signal"], "imagefs.available");
    assert!(!has_image(&rt, FILLER));
    assert!(n.get("/events").unwrap().contains("FreedDiskSpace"));
    // Several more passes: the pod runs on, nothing evicted.
    let passes = n.metric("kubelet_housekeeping_duration_seconds_count");
    n.wait_for_housekeeping(3);
    assert!(n.metric("kubelet_housekeeping_duration_seconds_count") > passes);
    assert_eq!(n.metric("kubelet_evictions"), 0.0);
    assert_eq!(
        common::running_by_name(&n.runtime.containers(&uid)).len(),
        1
    );
    let events = n.get("/events").unwrap();
    assert!(!events.contains("Evicted"), "{events}");
    drop(ballast);
}

/// A file of `len` bytes written to disk, removed when dropped.
struct Ballast(PathBuf);

impl Ballast {
    fn write(path: &Path, len: usize) -> Self {
        use std::io::Write;
        let mut f = std::fs::File::create(path).unwrap();
        let chunk = vec![0x5a_u8; 1 << 20];
        for _ in 0..len >> 20 {
            f.write_all(&chunk).unwrap();
        }
        f.sync_all().unwrap();
        Self(path.to_owned())
    }
}

impl Drop for Ballast {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
