//! Property tests (proptest) for what nodelet decodes from untrusted text: manifests, resource
//! quantities, durations and the configuration file. Each property holds three things:
//!
//! - no input makes the decoder panic;
//! - no input makes it allocate more than a bound linear in the input's size (counted by this
//!   binary's allocator, per thread: [`PEAK`]), so a file of a few kilobytes cannot take the
//!   agent's memory;
//! - what nodelet writes back reads the same: a decoded pod re-encoded decodes to the same pod,
//!   a configuration printed by `check-config` loads to the same configuration, a quantity and a
//!   duration in their canonical spelling parse to the value they spell.
//!
//! Pure decoding: no runtime needed. `PROPTEST_CASES` sets the number of cases (default 256).
// Test code reads the machine's clocks and casts measurements freely.
#![allow(clippy::disallowed_methods, clippy::cast_possible_truncation)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::path::Path;
use std::time::Duration;

use nodelet::config::KubeletConfiguration;
use nodelet::duration::{format_go_duration, parse_go_duration};
use nodelet::quantity::{parse_amount, parse_milli, parse_value, Scale};
use nodelet::source::manifest::decode_manifest;
use proptest::prelude::*;

/// Counts the bytes this thread holds allocated and the most it held since [`reset_peak`].
struct Counting;

thread_local! {
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn track(delta: isize) {
    // `try_with`: the allocator also serves thread teardown, after the locals are gone.
    let _ = LIVE.try_with(|live| {
        let now = live.get() + delta;
        live.set(now);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
    });
}

// SAFETY: every method hands the caller's arguments unchanged to the system allocator, which
// upholds GlobalAlloc's contract; the counting beside it allocates nothing.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        track(layout.size() as isize);
        // SAFETY: the caller's layout, as GlobalAlloc::alloc requires of it.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        track(-(layout.size() as isize));
        // SAFETY: `ptr` came from this allocator (that is, from System) with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        track(new_size as isize - layout.size() as isize);
        // SAFETY: `ptr` came from System with `layout`; `new_size` as the caller guarantees.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Runs `f` and returns its value and the most bytes it held allocated at once beyond what was
/// live before it (on this thread).
fn peak_of<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let base = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(base));
    let out = f();
    let peak = PEAK.with(Cell::get);
    (out, (peak - base).max(0) as usize)
}

/// The allocation bound for decoding `len` bytes of text: a fixed 4 MiB (parser buffers, the
/// Pod type, serde_yaml's alias expansion up to its repetition limit: the billion-laughs file
/// peaks at about 1.8 MB before it is refused) plus 256 bytes per input byte. Expanding the
/// aliases would take gigabytes; the decoder must refuse them inside this bound.
fn bound(len: usize) -> usize {
    (4 << 20) + 256 * len
}

const NODE: &str = "node-a";

// ---- manifests --------------------------------------------------------------------------

fn dns_label() -> impl Strategy<Value = String> {
    "[a-z]([a-z0-9-]{0,14}[a-z0-9])?"
}

fn quantity_text() -> impl Strategy<Value = String> {
    (
        0u64..100_000,
        prop::sample::select(vec!["", "m", "k", "M", "G", "Ki", "Mi", "Gi"]),
    )
        .prop_map(|(n, s)| format!("{n}{s}"))
}

/// A pod manifest a user could write: a valid name, labels, one to three containers with
/// commands, env, ports and resources, a restart policy and a grace period.
fn pod_yaml() -> impl Strategy<Value = String> {
    let container = (
        dns_label(),
        prop::sample::select(vec!["busybox", "busybox:1.36", "registry.k8s.io/pause:3.9"]),
        prop::collection::vec("[ -~&&[^'\\\\]]{0,12}", 0..4),
        prop::collection::btree_map("[A-Z_][A-Z0-9_]{0,8}", "[a-z0-9 ]{0,10}", 0..3),
        prop::option::of((1u16..65535, prop::sample::select(vec!["TCP", "UDP"]))),
        prop::option::of((quantity_text(), quantity_text())),
    );
    (
        dns_label(),
        prop::collection::btree_map("[a-z]{1,8}", "[a-z0-9]{0,8}", 0..4),
        prop::collection::vec(container, 1..4),
        prop::sample::select(vec!["Always", "OnFailure", "Never"]),
        0i64..120,
    )
        .prop_map(|(name, labels, containers, restart, grace)| {
            let mut y = format!("apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n");
            if !labels.is_empty() {
                y.push_str("  labels:\n");
                for (k, v) in &labels {
                    y.push_str(&format!("    {k}: '{v}'\n"));
                }
            }
            y.push_str(&format!(
                "spec:\n  restartPolicy: {restart}\n  terminationGracePeriodSeconds: {grace}\n  containers:\n"
            ));
            for (i, (cname, image, args, env, port, res)) in containers.iter().enumerate() {
                // Container names are unique in a valid pod.
                y.push_str(&format!("  - name: {cname}-{i}\n    image: {image}\n"));
                y.push_str("    command: [sh, -c");
                for a in args {
                    y.push_str(&format!(", '{a}'"));
                }
                y.push_str("]\n");
                if !env.is_empty() {
                    y.push_str("    env:\n");
                    for (k, v) in env {
                        y.push_str(&format!("    - {{name: {k}, value: '{v}'}}\n"));
                    }
                }
                if let Some((p, proto)) = port {
                    y.push_str(&format!(
                        "    ports:\n    - {{containerPort: {p}, protocol: {proto}}}\n"
                    ));
                }
                if let Some((req, lim)) = res {
                    y.push_str(&format!(
                        "    resources:\n      requests: {{memory: '{req}'}}\n      limits: {{cpu: '{lim}'}}\n"
                    ));
                }
            }
            y
        })
}

/// Edits that break a manifest in the ways files break: cut short, a byte replaced, text
/// inserted (YAML punctuation, anchors and aliases, deep brackets, long runs).
#[derive(Debug, Clone)]
enum Edit {
    Truncate(usize),
    Replace(usize, u8),
    Insert(usize, String),
}

fn edit() -> impl Strategy<Value = Edit> {
    let fragment = prop_oneof![
        prop::sample::select(vec![
            ": ",
            "- ",
            "{",
            "}",
            "[",
            "]",
            "&a ",
            "*a",
            "!!binary ",
            "!!int ",
            "<<: *a\n",
            "\t",
            "\"",
            "'",
            "|\n",
            ">-\n",
            "---\n",
            "...\n",
            "%YAML 1.1\n",
            "? ",
            "\0",
            "\u{feff}",
            "~",
            "0o777",
            "1e400",
            "-.inf",
            ".nan",
        ])
        .prop_map(str::to_owned),
        (1usize..2000).prop_map(|n| "[".repeat(n)),
        (1usize..5000, "[a-z]{1,3}").prop_map(|(n, s)| s.repeat(n)),
        any::<String>(),
    ];
    prop_oneof![
        any::<prop::sample::Index>().prop_map(|i| Edit::Truncate(i.index(usize::MAX))),
        (any::<prop::sample::Index>(), any::<u8>())
            .prop_map(|(i, b)| Edit::Replace(i.index(usize::MAX), b)),
        (any::<prop::sample::Index>(), fragment)
            .prop_map(|(i, s)| Edit::Insert(i.index(usize::MAX), s)),
    ]
}

fn apply(text: &str, edits: &[Edit]) -> Vec<u8> {
    let mut b = text.as_bytes().to_vec();
    for e in edits {
        let at = |i: usize| if b.is_empty() { 0 } else { i % (b.len() + 1) };
        match e {
            Edit::Truncate(i) => {
                let n = at(*i);
                b.truncate(n);
            }
            Edit::Replace(i, v) => {
                if !b.is_empty() {
                    let n = i % b.len();
                    b[n] = *v;
                }
            }
            Edit::Insert(i, s) => {
                let n = at(*i);
                b.splice(n..n, s.bytes());
            }
        }
    }
    b
}

/// Decodes `bytes` and checks the allocation bound; returns whether it decoded.
fn decode_bounded(bytes: &[u8]) -> Result<bool, TestCaseError> {
    let (out, peak) = peak_of(|| decode_manifest(Path::new("/m/p.yaml"), bytes, NODE));
    prop_assert!(
        peak <= bound(bytes.len()),
        "decoding {} bytes held {peak} bytes at once (bound {})",
        bytes.len(),
        bound(bytes.len())
    );
    if let Err(e) = &out {
        // Every error names the file.
        prop_assert!(e.to_string().contains("/m/p.yaml"), "{e}");
    }
    Ok(out.is_ok())
}

proptest! {
    #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]

    /// A generated manifest decodes, and decoding is idempotent: the pod re-encoded (YAML and
    /// JSON) under the name the file gave it decodes to the same pod, every default and the UID
    /// kept. Only `config.hash` differs: it hashes the file's bytes.
    #[test]
    fn a_decoded_pod_reencoded_decodes_to_the_same_pod(y in pod_yaml()) {
        let m = decode_manifest(Path::new("/m/p.yaml"), y.as_bytes(), NODE)
            .map_err(|e| TestCaseError::fail(format!("{e}\n{y}")))?;
        let pod = m.pod.expect("a pod");
        let mut written = pod.clone();
        let name = written.metadata.name.take().unwrap();
        written.metadata.name = name.strip_suffix(&format!("-{NODE}")).map(str::to_owned);
        prop_assert!(written.metadata.name.is_some(), "{name} is not <name>-{NODE}");
        for again in [serde_yaml::to_string(&written).unwrap(), serde_json::to_string(&written).unwrap()] {
            let m2 = decode_manifest(Path::new("/m/p.yaml"), again.as_bytes(), NODE)
                .map_err(|e| TestCaseError::fail(format!("{e}\n{again}")))?;
            let mut pod2 = m2.pod.expect("a pod");
            let hash = |p: &mut k8s_openapi::api::core::v1::Pod| {
                p.metadata.annotations.as_mut().and_then(|a| a.remove("kubernetes.io/config.hash"))
            };
            prop_assert!(hash(&mut pod2).is_some());
            let mut pod1 = pod.clone();
            hash(&mut pod1);
            prop_assert_eq!(pod2, pod1);
        }
    }

    /// A broken manifest is an error naming the file, never a panic, within the bound.
    #[test]
    fn an_edited_manifest_never_panics_and_stays_bounded(
        y in pod_yaml(),
        edits in prop::collection::vec(edit(), 1..6),
    ) {
        let bytes = apply(&y, &edits);
        decode_bounded(&bytes)?;
    }

    /// Arbitrary bytes: an error naming the file, never a panic, within the bound.
    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..4096)) {
        decode_bounded(&bytes)?;
    }

    // ---- quantities -------------------------------------------------------------------

    /// Any text: a value or an error, never a panic; parse_amount agrees with parse_milli.
    #[test]
    fn any_quantity_text_parses_or_errs(s in any::<String>()) {
        let milli = parse_milli(&s);
        let amount = parse_amount(&s, Scale::Milli);
        match (&milli, &amount) {
            (Ok(m), Ok(a)) => prop_assert_eq!(*m, i128::from(*a)),
            (Ok(m), Err(_)) => prop_assert!(*m < 0 || *m > i128::from(i64::MAX)),
            (Err(_), Ok(_)) => prop_assert!(false, "amount without a quantity: {:?}", s),
            (Err(_), Err(_)) => {}
        }
        let _ = parse_value(&s);
    }

    /// Quantity-shaped text (sign, digits, fraction, any suffix or exponent): never a panic.
    #[test]
    fn quantity_shaped_text_never_panics(
        s in "[+-]?[0-9]{0,40}(\\.[0-9]{0,40})?([numkMGTPE]|[KMGTPE]i|[eE][+-]?[0-9]{1,12})?"
    ) {
        let _ = parse_milli(&s);
        let _ = parse_amount(&s, Scale::Whole);
    }

    /// Canonical spellings parse to what they spell.
    #[test]
    fn canonical_quantities_round_trip(n in 0i64..i64::MAX / 1000, f in 0u32..1000, neg: bool) {
        let n128 = i128::from(n);
        prop_assert_eq!(parse_milli(&format!("{n}m")), Ok(n128));
        prop_assert_eq!(parse_milli(&format!("{n}")), Ok(n128 * 1000));
        prop_assert_eq!(parse_milli(&format!("{n}.{f:03}")), Ok(n128 * 1000 + i128::from(f)));
        prop_assert_eq!(parse_value(&format!("{n}k")).ok(), Some(n128 * 1000).filter(|v| *v <= i128::from(i64::MAX)));
        let sign = if neg { -1 } else { 1 };
        prop_assert_eq!(parse_milli(&format!("{}{n}m", if neg { "-" } else { "" })), Ok(sign * n128));
        let small = n % (1 << 40);
        prop_assert_eq!(parse_value(&format!("{small}Ki")), Ok(i128::from(small) * 1024));
        prop_assert_eq!(parse_value(&format!("{small}e3")), Ok(i128::from(small) * 1000));
    }

    /// Order is kept: a < b as integers iff their quantities compare the same way, across
    /// spellings (`1Gi` against `1073741825`).
    #[test]
    fn quantities_keep_order(a in 0i64..1 << 40, b in 0i64..1 << 40) {
        let qa = parse_value(&format!("{a}Ki")).unwrap();
        let qb = parse_value(&format!("{}", b * 1024)).unwrap();
        prop_assert_eq!(qa.cmp(&qb), a.cmp(&b));
    }

    // ---- durations --------------------------------------------------------------------

    /// What nodelet prints as a Go duration parses back to the same duration (millisecond
    /// resolution, as the configuration keeps).
    #[test]
    fn go_durations_round_trip(ms in 0u64..8760 * 3600 * 1000) {
        let d = Duration::from_millis(ms);
        prop_assert_eq!(parse_go_duration(&format_go_duration(d)), Ok(d));
    }

    /// Any text: a duration or an error, never a panic.
    #[test]
    fn any_duration_text_parses_or_errs(s in "[0-9.+-]{0,20}(ns|us|µs|ms|s|m|h)?([0-9.]{0,5}(s|m|h))?") {
        let _ = parse_go_duration(&s);
    }

    // ---- the configuration file -------------------------------------------------------

    /// A configuration as `check-config` prints it loads to the same configuration.
    #[test]
    fn a_printed_configuration_loads_the_same(
        max_pods in 1u32..1000,
        sync in 1u64..600,
        hard in prop::sample::select(vec!["100Mi", "5%", "1Gi", "0.5%"]),
        reserved in quantity_text(),
        pids in -1i64..100_000,
        per_qos: bool,
        driver in prop::sample::select(vec!["cgroupfs", "systemd"]),
    ) {
        let text = format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nmaxPods: {max_pods}\n\
             syncFrequency: {sync}s\nevictionHard: {{memory.available: '{hard}'}}\n\
             systemReserved: {{memory: '{reserved}'}}\npodPidsLimit: {pids}\ncgroupsPerQOS: {per_qos}\ncgroupDriver: {driver}\n"
        );
        let Ok(first) = KubeletConfiguration::parse(Path::new("c.yaml"), &text) else {
            // A value out of range is refused with the field named: that is the other property.
            return Ok(());
        };
        let printed = serde_yaml::to_string(&first.file).unwrap();
        let again = KubeletConfiguration::parse(Path::new("c.yaml"), &printed)
            .map_err(|e| TestCaseError::fail(format!("{e}\n{printed}")))?;
        prop_assert_eq!(serde_yaml::to_string(&again.file).unwrap(), printed);
        prop_assert!(again.unknown_fields.is_empty(), "{:?}", again.unknown_fields);
    }

    /// Any text, or a configuration with edits: an error naming the file or a configuration,
    /// never a panic, within the bound.
    #[test]
    fn any_configuration_text_parses_or_errs(
        base in prop::sample::select(vec![
            "maxPods: 110\nevictionHard: {memory.available: 100Mi}\n",
            "kind: KubeletConfiguration\nsyncFrequency: 1m\nkubeReserved: {cpu: 100m}\n",
            "{\"staticPodPath\": \"/etc/kubernetes/manifests\", \"podPidsLimit\": -1}\n",
        ]),
        edits in prop::collection::vec(edit(), 0..5),
    ) {
        let bytes = apply(base, &edits);
        let Ok(text) = String::from_utf8(bytes) else { return Ok(()) };
        let (out, peak) = peak_of(|| KubeletConfiguration::parse(Path::new("c.yaml"), &text));
        prop_assert!(peak <= bound(text.len()), "{} bytes held {peak}", text.len());
        if let Err(e) = out {
            prop_assert!(e.to_string().contains("c.yaml"), "{e}");
        }
    }
}

/// The billion-laughs file (nine levels of ten aliases) is refused within the bound.
#[test]
fn a_billion_laughs_manifest_is_refused_within_the_bound() {
    let mut y = String::from(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: lol\n  annotations:\n    a0: &a0 \"lol\"\n",
    );
    for i in 1..10 {
        let prev = format!("*a{}", i - 1);
        y.push_str(&format!(
            "    a{i}: &a{i} [{}]\n",
            vec![prev; 10].join(", ")
        ));
    }
    y.push_str("spec:\n  containers: [{name: c, image: busybox}]\n");
    let (out, peak) = peak_of(|| decode_manifest(Path::new("/m/p.yaml"), y.as_bytes(), NODE));
    assert!(out.is_err(), "a billion laughs decoded");
    assert!(peak <= bound(y.len()), "held {peak} bytes");
}
