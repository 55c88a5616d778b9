//! The rules `clippy.toml` keeps hold: a crate with the project's `clippy.toml` and a call to
//! `Instant::now()` outside a clock module fails `cargo clippy -- -D warnings`, naming the call;
//! the same call inside a module that allows it (as `src/clock.rs` does) passes. Runs clippy on a
//! dependency-free crate in a temporary directory (about a second; no network).
// Test code reads the machine's clocks and casts measurements freely.
#![allow(clippy::disallowed_methods, clippy::cast_possible_truncation)]

use std::path::Path;
use std::process::Command;

fn clippy_on(main_rs: &str) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::write(
        root.join("Cargo.toml"),
        "[package]\nname = \"lint-probe\"\nversion = \"0.0.0\"\nedition = \"2021\"\n",
    )
    .unwrap();
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("clippy.toml"),
        root.join("clippy.toml"),
    )
    .unwrap();
    std::fs::create_dir(root.join("src")).unwrap();
    std::fs::write(root.join("src/main.rs"), main_rs).unwrap();
    let out = Command::new(env!("CARGO"))
        .args(["clippy", "--quiet", "--offline", "--", "-D", "warnings"])
        .current_dir(root)
        .env("CARGO_TARGET_DIR", root.join("target"))
        .output()
        .expect("cargo clippy runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn clippy_refuses_the_machines_clocks_outside_the_clock_module() {
    let (ok, stderr) = clippy_on(
        "fn main() {\n    let t = std::time::Instant::now();\n    println!(\"{:?}\", t.elapsed());\n}\n",
    );
    assert!(!ok, "clippy passed a bare Instant::now():\n{stderr}");
    assert!(
        stderr.contains("disallowed method `std::time::Instant::now`")
            && stderr.contains("src/clock.rs"),
        "{stderr}"
    );
    let (ok, stderr) = clippy_on(
        "mod clock {\n    #![allow(clippy::disallowed_methods)]\n    pub fn now() -> std::time::Instant {\n        std::time::Instant::now()\n    }\n}\nfn main() {\n    println!(\"{:?}\", clock::now().elapsed());\n}\n",
    );
    assert!(ok, "the clock module's own call was refused:\n{stderr}");
}
