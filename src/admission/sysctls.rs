//! Sysctls at admission (kubelet's sysctl allowlist admit handler): a pod may set only the safe
//! sysctls and those `allowedUnsafeSysctls` allows (names, or prefixes ending in `*`), and none
//! of a namespace it shares with the host. A refusal has reason `SysctlForbidden` and the
//! message `forbidden sysctl: "<name>" not allowlisted`.

use k8s_openapi::api::core::v1::Pod;

use super::Rejection;

/// kubelet's safe sysctls (`SafeSysctlAllowlist`): namespaced, and harmless to other pods.
pub const SAFE_SYSCTLS: &[&str] = &[
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
    "net.ipv4.tcp_rmem",
    "net.ipv4.tcp_wmem",
];

/// A sysctl name in dotted form: kubelet's `NormalizeName` swaps '/' and '.' only when the
/// first separator is '/' (`net/ipv4/ip_forward`); any other name is kept as written.
pub fn normalize(name: &str) -> String {
    match name.find(['.', '/']) {
        Some(i) if name.as_bytes()[i] == b'/' => name
            .chars()
            .map(|c| match c {
                '/' => '.',
                '.' => '/',
                c => c,
            })
            .collect(),
        _ => name.to_owned(),
    }
}

/// The kernel namespace a sysctl belongs to (`ipc` or `net`), or `None` when it is not
/// namespaced (kubelet's `GetNamespace`).
pub fn namespace(name: &str) -> Option<&'static str> {
    let name = normalize(name);
    if name.starts_with("kernel.shm")
        || name.starts_with("kernel.msg")
        || name == "kernel.sem"
        || name.starts_with("fs.mqueue.")
    {
        Some("ipc")
    } else if name.starts_with("net.") {
        Some("net")
    } else {
        None
    }
}

/// Checks `allowedUnsafeSysctls` as kubelet does at start-up.
///
/// Errors: a message naming a pattern that is not a known namespaced sysctl or prefix.
pub fn validate_allowed(patterns: &[String]) -> Result<(), String> {
    for p in patterns {
        let name = p.trim_end_matches('*');
        if name.is_empty() || namespace(name).is_none() {
            return Err(format!("the sysctls {p:?} are not known to be namespaced"));
        }
    }
    Ok(())
}

/// Refuses `pod` when it sets a sysctl outside the safe set and `allowed`.
pub fn admit(pod: &Pod, allowed: &[String]) -> Option<Rejection> {
    let spec = pod.spec.as_ref()?;
    let sysctls = spec.security_context.as_ref()?.sysctls.as_deref()?;
    for s in sysctls {
        let name = normalize(&s.name);
        let listed = SAFE_SYSCTLS.contains(&name.as_str())
            || allowed.iter().any(|p| match p.strip_suffix('*') {
                Some(prefix) => name.starts_with(prefix),
                None => *p == name,
            });
        let shared = match namespace(&name) {
            Some("net") => spec.host_network == Some(true),
            Some("ipc") => spec.host_ipc == Some(true),
            _ => false,
        };
        let error = if !listed {
            format!("{name:?} not allowlisted")
        } else if shared {
            format!(
                "{name:?} not allowed with host {} enabled",
                namespace(&name).unwrap_or("")
            )
        } else {
            continue;
        };
        return Some(Rejection {
            reason: "SysctlForbidden".into(),
            message: format!("forbidden sysctl: {error}"),
        });
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_normalized_only_when_the_first_separator_is_a_slash() {
        assert_eq!(normalize("net/ipv4/ip_forward"), "net.ipv4.ip_forward");
        assert_eq!(
            normalize("kernel.shm_rmid_forced"),
            "kernel.shm_rmid_forced"
        );
        assert_eq!(normalize("../x"), "../x");
        assert_eq!(
            normalize("net.ipv4.conf.eth0/1.rp_filter"),
            "net.ipv4.conf.eth0/1.rp_filter"
        );
    }
    use crate::testing::pods::with_spec as pod;

    #[test]
    fn only_safe_and_allowed_sysctls_pass() {
        let safe = pod("{securityContext: {sysctls: [{name: net.ipv4.tcp_syncookies, value: '1'}]}, containers: []}");
        assert_eq!(admit(&safe, &[]), None);
        let unsafe_ = pod("{securityContext: {sysctls: [{name: net.core.somaxconn, value: '1024'}]}, containers: []}");
        let r = admit(&unsafe_, &[]).unwrap();
        assert_eq!(
            (r.reason.as_str(), r.message.as_str()),
            (
                "SysctlForbidden",
                "forbidden sysctl: \"net.core.somaxconn\" not allowlisted"
            )
        );
        assert_eq!(admit(&unsafe_, &["net.core.*".to_string()]), None);
        assert_eq!(admit(&unsafe_, &["net.core.somaxconn".to_string()]), None);
        assert!(validate_allowed(&["net.core.*".into(), "kernel.msgmax".into()]).is_ok());
        assert!(validate_allowed(&["vm.swappiness".into()]).is_err());
    }
}
