//! A staticPodPath of 1,000 malformed and hostile entries (issue 14), shared by
//! `tests/hostile_manifests.rs` and `cargo bench --bench scale`: truncated YAML, wrong types,
//! names with `/` and `..`, another kind, empty files, 100,000-deep nesting, YAML anchors that
//! expand a billion times, 10 MB strings, duplicate names, symlinks to `/dev/zero` and to a
//! directory, and FIFOs.
#![allow(dead_code)]

use std::path::Path;

/// A manifest nested 100,000 levels deep (over serde_yaml's recursion limit).
pub fn nested() -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: deep, labels: {}{}}}\n",
        "[".repeat(100_000),
        "]".repeat(100_000)
    )
}

/// Writes exactly 1,000 entries into `dir`: regular files that fail to decode or validate, and
/// 300 entries that are not regular files (symlinks to `/dev/zero` and to `other`, a directory,
/// and FIFOs). `good(name)` is the manifest of a good pod named `name`: 50 files repeat
/// `good("good0")`, duplicates of a good pod the caller adds. Returns the number of entries
/// each of which must be counted once in `nodelet_static_pod_manifest_errors_total`: the
/// regular files, the symlinks to `/dev/zero` and the FIFOs (`NotARegularFile`).
pub fn write_thousand(dir: &Path, other: &Path, good: &dyn Fn(&str) -> String) -> usize {
    let mut regular_bad = 0usize;
    let mut write = |name: String, text: String| {
        std::fs::write(dir.join(name), text).unwrap();
        regular_bad += 1;
    };
    for i in 0..100 {
        // Truncated YAML.
        write(
            format!("trunc{i}.yaml"),
            "apiVersion: v1\nkind: Pod\nmetadata: {name: t".into(),
        );
        // Wrong types.
        write(
            format!("types{i}.yaml"),
            "apiVersion: v1\nkind: Pod\nmetadata: {name: w}\nspec: {containers: 7}\n".into(),
        );
        // Names that could escape a path.
        write(
            format!("name{i}.yaml"),
            good(&format!("x/../../etc{i}")).replace("name: x", "name: '../x"),
        );
        // Another kind, and an empty file.
        write(
            format!("kind{i}.yaml"),
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\n".into(),
        );
        write(format!("empty{i}.yaml"), String::new());
    }
    for i in 0..20 {
        // 100,000-deep nesting.
        write(format!("deep{i}.yaml"), nested());
        // A billion laughs.
        let mut laughs = String::from(
            "a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n",
        );
        for (k, prev) in ["b", "c", "d", "e", "f", "g", "h", "i"]
            .iter()
            .zip(["a", "b", "c", "d", "e", "f", "g", "h"])
        {
            laughs.push_str(&format!("{k}: &{k} [*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev}]\n"));
        }
        write(
            format!("laughs{i}.yaml"),
            format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: l}}\n{laughs}"),
        );
    }
    for i in 0..5 {
        // 10 MB strings (over the 4 MiB a manifest may be).
        write(
            format!("big{i}.yaml"),
            format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: big, labels: {{a: '{}'}}}}\n",
                "x".repeat(10_000_000)
            ),
        );
    }
    for i in 0..50 {
        // Duplicates of a good pod's name (reported as duplicates once it runs).
        write(format!("zdup{i}.yaml"), good("good0"));
    }
    // Entries that are not regular files: never opened; the device links and FIFOs reported
    // (200, added at the end).
    for i in 0..100 {
        std::os::unix::fs::symlink("/dev/zero", dir.join(format!("zero{i}.yaml"))).unwrap();
        std::os::unix::fs::symlink(other, dir.join(format!("dir{i}.yaml"))).unwrap();
        let fifo = dir.join(format!("fifo{i}.yaml"));
        assert!(std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success());
    }
    // The remaining entries up to 1,000: more truncated files.
    // 595 regular files so far, 300 special entries (200 of them counted above).
    for i in 0..(1000 - 595 - 300) {
        write(
            format!("more{i}.yaml"),
            "kind: Pod\napiVersion: v1\nspec: [".into(),
        );
    }
    let entries = std::fs::read_dir(dir).unwrap().count();
    assert_eq!(entries, 1000);
    regular_bad + 200
}
