//! The runtime's cgroup driver against the agent's (kubelet's check at start, which kubelet 1.28
//! and later make through the CRI `RuntimeConfig` call; containerd 1.6 has no such call, so it
//! is read from the CRI plugin's configuration in the verbose `Status`). Both must place
//! containers the same way: a runtime on cgroupfs under an agent on systemd puts containers in
//! plain directories below systemd's slices, which systemd then does not account for, and the
//! other way round the runtime refuses every sandbox. nodelet refuses to start on a mismatch,
//! naming both settings.

use std::collections::HashMap;

/// The runtime's driver, from its verbose `Status` info: `Some(true)` for systemd, when
/// containerd's configuration (`info["config"]`, JSON) has `SystemdCgroup` in the options of its
/// default runtime (`containerd.runtimes.<defaultRuntimeName>.options.SystemdCgroup`; absent
/// is false, containerd's default). `None` when the runtime does not say (another runtime, or
/// an answer without that configuration).
pub fn runtime_uses_systemd(info: &HashMap<String, String>) -> Option<bool> {
    let config: serde_json::Value = serde_json::from_str(info.get("config")?).ok()?;
    let containerd = config.get("containerd")?;
    let name = containerd.get("defaultRuntimeName")?.as_str()?;
    let runtime = containerd.get("runtimes")?.get(name)?;
    Some(
        runtime
            .get("options")
            .and_then(|o| o.get("SystemdCgroup"))
            .and_then(serde_json::Value::as_bool)
            .unwrap_or(false),
    )
}

/// A cgroup driver's name in KubeletConfiguration's spelling.
fn name(systemd: bool) -> &'static str {
    if systemd {
        "systemd"
    } else {
        "cgroupfs"
    }
}

/// Checks the agent's driver (`systemd`: `cgroupDriver: systemd`) against the runtime's.
/// A runtime that does not say is taken at its word: nothing to compare.
///
/// Errors: a message naming both settings and how to make them agree.
pub fn check(systemd: bool, runtime: Option<bool>, endpoint: &str) -> Result<(), String> {
    match runtime {
        Some(r) if r != systemd => Err(format!(
            "cgroupDriver is {:?} in nodelet's configuration, but the container runtime at {endpoint} \
             uses the {} driver (containerd: SystemdCgroup = {r} in the options of its default runtime, \
             [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc.options]); make them \
             agree: set cgroupDriver: {} in nodelet's configuration, or SystemdCgroup = {systemd} \
             in containerd's config.toml and restart containerd",
            name(systemd),
            name(r),
            name(r),
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(config: &str) -> HashMap<String, String> {
        HashMap::from([("config".to_owned(), config.to_owned())])
    }

    #[test]
    fn containerds_driver_is_read_from_its_default_runtimes_options() {
        let systemd = info(
            r#"{"containerd":{"defaultRuntimeName":"runc","runtimes":{"runc":{"runtimeType":"io.containerd.runc.v2","options":{"SystemdCgroup":true}}}}}"#,
        );
        assert_eq!(runtime_uses_systemd(&systemd), Some(true));
        let cgroupfs = info(
            r#"{"containerd":{"defaultRuntimeName":"runc","runtimes":{"runc":{"options":{"Root":"/run/x"}},"other":{"options":{"SystemdCgroup":true}}}}}"#,
        );
        assert_eq!(runtime_uses_systemd(&cgroupfs), Some(false));
        assert_eq!(runtime_uses_systemd(&HashMap::new()), None);
        assert_eq!(runtime_uses_systemd(&info("not json")), None);
    }

    #[test]
    fn a_mismatch_names_both_settings() {
        let e = check(true, Some(false), "unix:///run/containerd/containerd.sock").unwrap_err();
        assert!(e.starts_with("cgroupDriver is \"systemd\" in nodelet's configuration, but the container runtime at unix:///run/containerd/containerd.sock uses the cgroupfs driver"), "{e}");
        assert!(
            e.contains("set cgroupDriver: cgroupfs") && e.contains("SystemdCgroup = true"),
            "{e}"
        );
        assert!(check(false, Some(false), "x").is_ok());
        assert!(check(true, None, "x").is_ok());
    }
}
