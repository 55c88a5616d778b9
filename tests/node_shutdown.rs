//! nodelet as a systemd service on a systemd node, and graceful node shutdown, in the guest of
//! `scripts/env/vm.sh`. Driven from the host: the guest is powered off at the end, so
//! `scripts/test.sh` runs this binary last, with `--ignored`, while the guest is up; on the host
//! alone it is listed as ignored.
//!
//! The unit `systemd/nodelet.service` is installed as it ships, with a drop-in for the test
//! (the binary in the mounted checkout, a 10 s watchdog, the log on the checkout's disk so that
//! it outlives the guest), on the guest's containerd with the systemd cgroup driver.
// Test code reads the machine's clocks and casts measurements freely.
#![allow(clippy::disallowed_methods, clippy::cast_possible_truncation)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const GUEST: &str = "runs in the guest of scripts/env/vm.sh (scripts/test.sh)";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Runs `script` in the guest (bash); returns its stdout, panicking with its stderr on failure.
fn guest(script: &str) -> String {
    let out = Command::new("bash")
        .arg(repo().join("scripts/env/vm.sh"))
        .args(["exec", "-"])
        .env("VM_EXEC_TIMEOUT", "600")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().unwrap().write_all(script.as_bytes())?;
            c.wait_with_output()
        })
        .unwrap();
    assert!(
        out.status.success(),
        "guest script failed ({}): {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Polls the guest with `script` (exit 0: done) until `timeout`.
fn guest_until(timeout: Duration, what: &str, script: &str) {
    let deadline = Instant::now() + timeout;
    loop {
        let ok = Command::new("bash")
            .arg(repo().join("scripts/env/vm.sh"))
            .args(["exec", script])
            .env("VM_EXEC_TIMEOUT", "60")
            .output()
            .is_ok_and(|o| o.status.success());
        if ok {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The IDs of the running containers, by container name (`ctr` on the guest's containerd).
fn containers() -> Vec<String> {
    let mut v: Vec<String> = guest("ctr -n k8s.io task ls -q | sort")
        .lines()
        .map(str::to_owned)
        .collect();
    v.sort();
    v
}

fn pod(name: &str, priority: i64, out: &Path) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  priority: {priority}\n  terminationGracePeriodSeconds: 60\n  volumes: [{{name: out, hostPath: {{path: {out}}}}}]\n  containers:\n  - name: c\n    image: busybox:1.36\n    volumeMounts: [{{name: out, mountPath: /out}}]\n    command: [sh, -c, \"trap 'cat /proc/uptime > /out/{name}.term; sleep 1; exit 0' TERM; while true; do sleep 1 & wait; done\"]\n",
        out = out.display()
    )
}

/// The unit starts with Type=notify (READY=1 once the pods are there), its watchdog restarts a
/// stalled agent, `systemctl restart` and `stop`/`start` adopt the running pods, and
/// `systemctl poweroff` waits for the pods: the low-priority one is stopped first, each within
/// its share of `shutdownGracePeriod`, before the guest goes down.
#[test]
#[ignore = "runs in the guest of scripts/env/vm.sh (scripts/test.sh); powers it off"]
fn the_unit_runs_under_systemd_and_a_poweroff_stops_pods_by_priority() {
    let out = repo().join("target/vm-shutdown");
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).unwrap();
    let log = out.join("nodelet.log");
    let nodelet = repo().join("target/debug/nodelet");
    assert!(nodelet.exists(), "{GUEST}: build nodelet first");
    let setup = format!(
        r#"set -e
install -m 0644 {unit} /etc/systemd/system/nodelet.service
mkdir -p /etc/systemd/system/nodelet.service.d /etc/nodelet/manifests /var/log/pods
cat > /etc/systemd/system/nodelet.service.d/test.conf <<'EOF'
[Unit]
RequiresMountsFor={repo}
[Service]
ExecStart=
ExecStart={nodelet} --config /etc/nodelet/nodelet.yaml --hostname-override vmguest -v 2
WatchdogSec=10s
TimeoutStopSec=10s
TimeoutAbortSec=5s
Environment=NO_COLOR=1
StandardError=append:{log}
EOF
cat > /etc/nodelet/nodelet.yaml <<'EOF'
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
staticPodPath: /etc/nodelet/manifests
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
cgroupDriver: systemd
evictionHard: {{memory.available: 50Mi}}
shutdownGracePeriod: 20s
shutdownGracePeriodCriticalPods: 8s
EOF
cat > /etc/nodelet/manifests/low.yaml <<'EOF'
{low}EOF
cat > /etc/nodelet/manifests/critical.yaml <<'EOF'
{critical}EOF
systemctl daemon-reload
systemctl start nodelet
systemctl show -p ActiveState -p SubState -p Type nodelet
"#,
        unit = repo().join("systemd/nodelet.service").display(),
        repo = repo().display(),
        nodelet = nodelet.display(),
        log = log.display(),
        low = pod("low", 0, &out),
        critical = pod("critical", 2_000_001_000, &out),
    );
    // `systemctl start` of a Type=notify unit returns once READY=1 came.
    let started = guest(&setup);
    assert!(
        started.contains("ActiveState=active") && started.contains("Type=notify"),
        "{started}"
    );
    guest_until(
        Duration::from_secs(180),
        "both pods running",
        "test $(busybox wget -qO- http://127.0.0.1:10248/pods | grep -o '\"running\":{' | wc -l) -ge 2",
    );
    let running = containers();
    // The watchdog: a stopped agent sends no WATCHDOG=1, systemd kills and restarts it, and the
    // new one adopts the pods.
    guest("kill -STOP $(systemctl show -p MainPID --value nodelet)");
    guest_until(
        Duration::from_secs(90),
        "the watchdog's restart",
        "test $(systemctl show -p NRestarts --value nodelet) -ge 1 && systemctl is-active --quiet nodelet",
    );
    assert_eq!(
        containers(),
        running,
        "no container restarted after the watchdog"
    );
    guest("systemctl restart nodelet && systemctl stop nodelet && systemctl start nodelet");
    guest_until(
        Duration::from_secs(60),
        "the agent back",
        "busybox wget -qO- http://127.0.0.1:10248/healthz | grep -q ok",
    );
    assert_eq!(
        containers(),
        running,
        "no container restarted across restart and stop/start"
    );
    // The shutdown: logind's delay lock holds it while nodelet stops the pods.
    let _ = Command::new("bash")
        .arg(repo().join("scripts/env/vm.sh"))
        .args(["exec", "systemctl poweroff"])
        .env("VM_EXEC_TIMEOUT", "30")
        .output();
    let t0 = Instant::now();
    while Command::new("bash")
        .arg(repo().join("scripts/env/vm.sh"))
        .arg("status")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        assert!(
            t0.elapsed() < Duration::from_secs(300),
            "the guest did not go down"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let text = std::fs::read_to_string(&log).unwrap();
    let uptime = |name: &str| -> f64 {
        std::fs::read_to_string(out.join(format!("{name}.term")))
            .unwrap_or_else(|e| panic!("{name}.term: {e}\n{text}"))
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    let (low, critical) = (uptime("low"), uptime("critical"));
    assert!(
        low < critical,
        "the low-priority pod first: {low} then {critical}\n{text}"
    );
    for needle in [
        "logind announced the node's shutdown",
        "shutdown: stopping a group of pods priority=0 grace=12",
        "shutdown: stopping a group of pods priority=2000000000 grace=8",
        "releasing the inhibitor lock",
    ] {
        assert!(text.contains(needle), "{needle:?} not in the log:\n{text}");
    }
    let at = |needle: &str| text.find(needle).unwrap();
    assert!(
        at("priority=0 grace=12") < at("priority=2000000000 grace=8")
            && at("priority=2000000000 grace=8") < at("releasing the inhibitor lock"),
        "{text}"
    );
}
