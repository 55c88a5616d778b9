//! Stopping and starting the containerd of `scripts/env/up.sh` under a running agent (issue 14's
//! runtime-down case), shared by `tests/runtime_down.rs` and `cargo bench --bench scale`.
#![allow(dead_code)]

/// The pid of the containerd that `scripts/env/up.sh` started, from its pid file.
pub fn containerd_pid() -> Option<i32> {
    std::fs::read_to_string("/run/nodelet-env/containerd.pid")
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Runs `scripts/env/up.sh`, which starts containerd when it is not running; panics with the
/// script's stderr when it fails.
pub fn env_up() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/env/up.sh");
    let out = std::process::Command::new("bash")
        .arg(script)
        .output()
        .expect("scripts/env/up.sh");
    assert!(
        out.status.success(),
        "up.sh: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Starts containerd again ([`env_up`]) when dropped, whatever happened.
pub struct Restart;

impl Drop for Restart {
    fn drop(&mut self) {
        env_up();
    }
}
