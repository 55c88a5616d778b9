//! KubeletConfiguration: the agent's configuration file, read once into typed values.
//!
//! The file is a `kubelet.config.k8s.io/v1beta1` `KubeletConfiguration` document (YAML or JSON)
//! with kubelet's field names and defaults. Loading it takes two steps, each in its own file:
//!
//! - [`document`]: [`KubeletConfiguration`], the serde shape of the file with every default
//!   filled in. Its values are the file's own strings (quantities, thresholds, addresses), so
//!   `nodelet check-config` prints it in kubelet's spelling, and the set of its field names tells
//!   which fields of a file nodelet does not implement (a warning names them).
//! - [`typed`]: [`Config`], what the agent runs on. [`KubeletConfiguration::to_config`] checks
//!   every field (kubelet's `ValidateKubeletConfiguration`) and converts it once: durations to
//!   [`std::time::Duration`], quantities to integer bytes and millicores, addresses to
//!   [`std::net::SocketAddr`], eviction thresholds to parsed
//!   [`Threshold`](crate::eviction::threshold::Threshold)s, reservations to
//!   [`NodeResources`](crate::cm::resources::NodeResources) whose sums are checked, back-off
//!   bounds to [`BackoffPolicy`](crate::kuberuntime::backoff::BackoffPolicy). A value that does
//!   not convert, or is out of range, is an error naming the field and the value; nothing is
//!   re-parsed later, so no part of the agent has a fallback for a bad string.
//!
//! [`KubeletConfiguration::load`] does both and returns a [`LoadedConfig`] holding the two. The
//! binary loads once, before any subcommand, so `nodelet --config`, `nodelet check-config` and
//! `nodelet plan` refuse the same files with the same message (exit code 2).
//!
//! Dependencies go one way: this module builds the container manager's
//! [`NodeConfig`](crate::cm::NodeConfig) and the eviction manager's settings from the typed
//! values; neither `cm` nor `eviction` imports `config`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub mod document;
pub mod typed;

pub use document::{CrashLoopBackOff, ImagePullBackOff, KubeletConfiguration};
pub use typed::Config;

/// Errors from loading or validating the configuration file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// Path of the file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not a YAML/JSON mapping, or a field has the wrong type.
    #[error("config file {path}: {message}")]
    Parse {
        /// Path of the file.
        path: PathBuf,
        /// What the parser said.
        message: String,
    },
    /// A field holds a value nodelet cannot use.
    #[error("config file {path}: invalid value {value:?} for field {field}: {reason}")]
    Invalid {
        /// Path of the file.
        path: PathBuf,
        /// The field's name as written in the file (camelCase); two names joined by ` + ` when
        /// the fields are only invalid together (a sum that overflows).
        field: &'static str,
        /// The offending value.
        value: String,
        /// Why it is invalid and what is accepted.
        reason: String,
    },
}

/// A loaded configuration and the warnings found while loading it.
#[derive(Debug, Clone)]
pub struct LoadedConfig {
    /// The file as written, defaults filled in (what `nodelet check-config` prints).
    pub file: KubeletConfiguration,
    /// The validated, typed values the agent runs on.
    pub config: Config,
    /// Top-level fields nodelet does not know or implement; they are ignored.
    pub unknown_fields: Vec<String>,
}

/// Largest configuration file read, bytes.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

impl KubeletConfiguration {
    /// Reads, parses and validates a configuration file (at most [`MAX_CONFIG_BYTES`]).
    ///
    /// Errors: [`ConfigError::Read`] when the file cannot be read, [`ConfigError::Parse`] when it is
    /// not a mapping or a field has the wrong type, [`ConfigError::Invalid`] naming the field and
    /// value that fail validation.
    pub fn load(path: &Path) -> Result<LoadedConfig, ConfigError> {
        use std::io::Read;
        let read_err = |source| ConfigError::Read {
            path: path.to_owned(),
            source,
        };
        // Bounded: a configuration is a few kilobytes; `/dev/zero` must not hang the agent.
        let mut bytes = Vec::new();
        std::fs::File::open(path)
            .and_then(|f| f.take(MAX_CONFIG_BYTES + 1).read_to_end(&mut bytes))
            .map_err(read_err)?;
        if bytes.len() as u64 > MAX_CONFIG_BYTES {
            return Err(read_err(std::io::Error::other(format!(
                "more than {MAX_CONFIG_BYTES} bytes"
            ))));
        }
        let text = String::from_utf8(bytes)
            .map_err(|e| read_err(std::io::Error::new(std::io::ErrorKind::InvalidData, e)))?;
        Self::parse(path, &text)
    }

    /// Parses and validates configuration text; `path` only labels errors.
    ///
    /// Errors: as [`KubeletConfiguration::load`], without [`ConfigError::Read`].
    pub fn parse(path: &Path, text: &str) -> Result<LoadedConfig, ConfigError> {
        let parse_err = |message: String| ConfigError::Parse {
            path: path.to_owned(),
            message,
        };
        // A UTF-8 byte order mark before the YAML is not part of the document (as for
        // manifests; kubelet's decoder reads past it too).
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        crate::yaml::check_nesting(text.as_bytes()).map_err(parse_err)?;
        let value: serde_yaml::Value =
            serde_yaml::from_str(text).map_err(|e| parse_err(e.to_string()))?;
        let map: BTreeMap<String, serde_yaml::Value> = match value {
            serde_yaml::Value::Mapping(_) => {
                serde_yaml::from_value(value.clone()).map_err(|e| parse_err(e.to_string()))?
            }
            serde_yaml::Value::Null => BTreeMap::new(),
            _ => {
                return Err(parse_err(
                    "the file must hold a KubeletConfiguration mapping".into(),
                ))
            }
        };
        let known = document::known_fields();
        let unknown_fields: Vec<String> = map
            .keys()
            .filter(|k| !known.contains(k.as_str()))
            .cloned()
            .collect();
        // Fields inside known sections that nothing reads (`crashLoopBackOff:
        // {maxContainerRestartPeriodd: 1m}`) are named as the top-level ones are.
        let mut nested_unknown = Vec::new();
        let file: KubeletConfiguration = if map.is_empty() {
            KubeletConfiguration::default()
        } else {
            let mut note = |p: serde_ignored::Path| nested_unknown.push(p.to_string());
            serde_path_to_error::deserialize(serde_ignored::Deserializer::new(
                serde_yaml::Deserializer::from_str(text),
                &mut note,
            ))
            .map_err(|e| parse_err(field_error_message(&e)))?
        };
        let config = file.to_config(path)?;
        // kubelet refuses an empty file ("kubelet config file … was empty") and a document
        // without its kind (its decoder's "Object 'Kind' is missing"): a wrong path or a file
        // half written would otherwise run the node on defaults.
        if map.is_empty() {
            return Err(parse_err(
                "the file is empty; a KubeletConfiguration needs at least apiVersion: kubelet.config.k8s.io/v1beta1 and kind: KubeletConfiguration".into(),
            ));
        }
        for key in ["apiVersion", "kind"] {
            if !map.contains_key(key) {
                return Err(ConfigError::Invalid {
                    path: path.to_owned(),
                    field: if key == "kind" { "kind" } else { "apiVersion" },
                    value: String::new(),
                    reason: "is required (apiVersion: kubelet.config.k8s.io/v1beta1, kind: KubeletConfiguration)".into(),
                });
            }
        }
        let nested: Vec<String> = nested_unknown
            .into_iter()
            .filter(|p| p.contains('.'))
            .filter(|p| {
                !unknown_fields
                    .iter()
                    .any(|u| p.starts_with(&format!("{u}.")))
            })
            .collect();
        let mut unknown_fields = unknown_fields;
        unknown_fields.extend(nested);
        unknown_fields.extend(
            file.feature_gates
                .keys()
                .filter(|g| !document::KNOWN_FEATURE_GATES.contains(&g.as_str()))
                .map(|g| format!("featureGates.{g}")),
        );
        Ok(LoadedConfig {
            file,
            config,
            unknown_fields,
        })
    }
}

/// A decoding error as `field <path>: <problem>`, without repeating the path when the YAML
/// parser's own message already starts with it.
pub fn field_error_message(e: &serde_path_to_error::Error<serde_yaml::Error>) -> String {
    let (path, inner) = (e.path().to_string(), e.inner().to_string());
    match inner.strip_prefix(&format!("{path}: ")) {
        Some(rest) => format!("field {path}: {rest}"),
        None => format!("field {path}: {inner}"),
    }
}

/// The socket path of a `unix://` endpoint (`unix:///run/x.sock` → `/run/x.sock`); a bare
/// absolute path is accepted too, as kubelet does with a deprecation warning. `None` for any
/// other endpoint.
pub fn socket_path(endpoint: &str) -> Option<PathBuf> {
    let p = endpoint.strip_prefix("unix://").unwrap_or(endpoint);
    (p.starts_with('/') && p.len() > 1).then(|| PathBuf::from(p))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn parse(text: &str) -> Result<LoadedConfig, ConfigError> {
        KubeletConfiguration::parse(Path::new("test.yaml"), text)
    }

    #[test]
    fn defaults_are_kubelets() {
        let l = parse("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n")
            .unwrap();
        let c = l.config;
        assert_eq!(c.file_check_frequency, Duration::from_secs(20));
        assert_eq!(c.sync_frequency, Duration::from_secs(60));
        assert_eq!(c.healthz_address, Some("127.0.0.1:10248".parse().unwrap()));
        assert!(!c.cgroup_layout.systemd, "cgroupfs");
        assert!(c.cgroup_layout.per_qos);
        assert_eq!(c.pod_logs_dir, PathBuf::from("/var/log/pods"));
        assert_eq!(c.eviction.thresholds.len(), 5);
        assert_eq!(c.eviction.transition, Duration::from_secs(300));
        assert!(!c.eviction.static_pods_are_critical);
        assert_eq!(
            c.runtime_socket,
            PathBuf::from("/run/containerd/containerd.sock")
        );
        // The document keeps kubelet's spelling for check-config.
        assert_eq!(l.file.healthz_port, 10248);
        assert_eq!(l.file.cgroup_driver, "cgroupfs");
        assert_eq!(l.file.container_log_max_size, "10Mi");
    }

    #[test]
    fn unknown_fields_are_named() {
        let l = parse("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nfooBar: 1\nregistryPullQPS: 5\n").unwrap();
        assert_eq!(
            l.unknown_fields,
            vec!["fooBar".to_string(), "registryPullQPS".to_string()]
        );
    }

    #[test]
    fn unknown_fields_inside_known_sections_are_named_too() {
        let l = parse("\u{feff}apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncrashLoopBackOff: {maxContainerRestartPeriodd: 1m}\nimagePullBackOff: {maxPeriodd: 1m}\nshutdownGracePeriodByPodPriority: [{priority: 0, shutdownGracePeriodSeconds: 5, extra: 3}]\nfooBar: {x: 1}\n").unwrap();
        assert_eq!(
            l.unknown_fields,
            vec![
                "fooBar".to_string(),
                "crashLoopBackOff.maxContainerRestartPeriodd".to_string(),
                "imagePullBackOff.maxPeriodd".to_string(),
                "shutdownGracePeriodByPodPriority.0.extra".to_string(),
            ],
            "a byte order mark first is read past"
        );
    }

    #[test]
    fn invalid_values_name_field_and_value() {
        let cases = [
            ("cgroupDriver: docker", "cgroupDriver", "docker"),
            ("clusterDNS: [kube-dns]", "clusterDNS", "kube-dns"),
            ("clusterDomain: ../x", "clusterDomain", "../x"),
            ("fileCheckFrequency: 0s", "fileCheckFrequency", "0s"),
            ("fileCheckFrequency: 1ns", "fileCheckFrequency", "1ns"),
            ("syncFrequency: 10ms", "syncFrequency", "10ms"),
            (
                "containerRuntimeEndpoint: tcp://1.2.3.4:5",
                "containerRuntimeEndpoint",
                "tcp://1.2.3.4:5",
            ),
            (
                "healthzBindAddress: localhost",
                "healthzBindAddress",
                "localhost",
            ),
            (
                "staticPodPath: relative/dir",
                "staticPodPath",
                "relative/dir",
            ),
            ("cgroupRoot: /a/../b", "cgroupRoot", "/a/../b"),
            ("kind: Pod", "kind", "Pod"),
            (
                "kubeReserved: {memory: lots}",
                "kubeReserved",
                "memory=lots",
            ),
            ("systemReserved: {gpu: '1'}", "systemReserved", "gpu=1"),
            ("qosReserved: {memory: 150%}", "qosReserved", "memory=150%"),
            (
                "enforceNodeAllocatable: [everything]",
                "enforceNodeAllocatable",
                "everything",
            ),
            ("oomScoreAdj: -2000", "oomScoreAdj", "-2000"),
            ("cpuCFSQuotaPeriod: 5s", "cpuCFSQuotaPeriod", "5s"),
            ("podPidsLimit: -5", "podPidsLimit", "-5"),
            (
                "crashLoopBackOff: {initialContainerRestartPeriod: 10ms}",
                "crashLoopBackOff",
                "10ms..5m0s",
            ),
            (
                "crashLoopBackOff: {maxContainerRestartPeriod: 10m}",
                "crashLoopBackOff.maxContainerRestartPeriod",
                "10m0s",
            ),
            (
                "crashLoopBackOff: {maxContainerRestartPeriod: 500ms}",
                "crashLoopBackOff.maxContainerRestartPeriod",
                "500ms",
            ),
            (
                "cgroupsPerQOS: false",
                "enforceNodeAllocatable",
                "[pods] with cgroupsPerQOS false",
            ),
            (
                "enforceNodeAllocatable: [none, pods]",
                "enforceNodeAllocatable",
                "none,pods",
            ),
            (
                "evictionHard: {memory.available: '0'}",
                "evictionHard",
                "memory.available=0",
            ),
            (
                "evictionHard: {memory.free: 1Gi}",
                "evictionHard",
                "memory.free=1Gi",
            ),
            (
                "evictionSoft: {memory.available: 1Gi}",
                "evictionSoft",
                "memory.available=1Gi",
            ),
            (
                "evictionMinimumReclaim: {nodefs.available: much}",
                "evictionMinimumReclaim",
                "nodefs.available=much",
            ),
            (
                "evictionMonitoringPeriod: 1ms",
                "evictionMonitoringPeriod",
                "1ms",
            ),
            (
                "shutdownGracePeriod: 500ms",
                "shutdownGracePeriod",
                "500ms",
            ),
            (
                "shutdownGracePeriod: 10s\nshutdownGracePeriodCriticalPods: 20s",
                "shutdownGracePeriodCriticalPods",
                "20s",
            ),
            (
                "shutdownGracePeriod: 10s\nshutdownGracePeriodByPodPriority: [{priority: 0, shutdownGracePeriodSeconds: 5}]",
                "shutdownGracePeriodByPodPriority",
                "1 groups",
            ),
            ("kubeReserved: {cpu: '1e16'}", "kubeReserved", "cpu=1e16"),
            (
                "systemReserved: {memory: 7Ei}\nkubeReserved: {memory: 7Ei}",
                "systemReserved + kubeReserved",
                "memory=7Ei + memory=7Ei",
            ),
        ];
        for (line, field, value) in cases {
            let text = format!(
                "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n{line}\n"
            );
            let text = if field == "kind" {
                format!("apiVersion: kubelet.config.k8s.io/v1beta1\n{line}\n")
            } else {
                text
            };
            match parse(&text) {
                Err(ConfigError::Invalid {
                    field: f, value: v, ..
                }) => {
                    assert_eq!((f, v.as_str()), (field, value), "{line}");
                }
                other => panic!("{line}: expected Invalid, got {other:?}"),
            }
        }
    }

    /// kubelet refuses an empty file and a document without its kind: they do not run the node
    /// on defaults.
    #[test]
    fn an_empty_file_or_one_without_its_kind_is_refused() {
        for text in ["", "\n", "# nothing\n", "{}\n", "null\n"] {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.contains("the file is empty"), "{text:?}: {e}");
        }
        for (text, field) in [
            ("kind: KubeletConfiguration\nmaxPods: 10\n", "apiVersion"),
            (
                "apiVersion: kubelet.config.k8s.io/v1beta1\nmaxPods: 10\n",
                "kind",
            ),
        ] {
            match parse(text) {
                Err(ConfigError::Invalid { field: f, .. }) => assert_eq!(f, field, "{text}"),
                other => panic!("{text}: expected Invalid, got {other:?}"),
            }
        }
    }

    #[test]
    fn wrong_types_are_parse_errors() {
        let e = parse("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nhealthzPort: abc\n").unwrap_err();
        assert!(matches!(e, ConfigError::Parse { .. }), "{e}");
        assert!(e.to_string().contains("healthzPort"), "{e}");
        let e = parse("syncFrequency: 10x\n").unwrap_err();
        assert!(e.to_string().contains("10x"), "{e}");
    }
}
