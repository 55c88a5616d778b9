//! Facts about this node: its name, hostname and IP (kubelet's `nodeutil`).

use std::net::IpAddr;

/// The node name: `--hostname-override` if given, else the hostname, lower-cased (kubelet's
/// `GetHostname`).
///
/// Errors: a message when the hostname cannot be read, is empty, or is not a DNS-1123 subdomain
/// (every static pod name would then be refused).
pub fn node_name(override_: Option<&str>) -> Result<String, String> {
    let name = match override_ {
        Some(n) => n.trim().to_owned(),
        None => hostname::get()
            .map_err(|e| format!("cannot read hostname: {e}"))?
            .to_string_lossy()
            .trim()
            .to_owned(),
    };
    if name.is_empty() {
        return Err("empty hostname; use --hostname-override".into());
    }
    let name = name.to_lowercase();
    if !crate::pod::is_dns1123_subdomain(&name) {
        return Err(format!(
            "{name:?} is not a valid node name (a DNS-1123 subdomain: a-z, 0-9, '-', '.'); use --hostname-override"
        ));
    }
    Ok(name)
}

/// The machine's own hostname (the kernel's, as a host-network pod sees it), or `fallback` when
/// it cannot be read.
pub fn hostname(fallback: &str) -> String {
    hostname::get()
        .ok()
        .map(|h| h.to_string_lossy().trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| fallback.to_owned())
}

/// The node's IP: the first IPv4 address of an interface that is up and not loopback, or
/// 127.0.0.1 when there is none (kubelet picks the node's InternalIP the same way when
/// `--node-ip` is not given).
pub fn node_ip() -> IpAddr {
    let fallback = IpAddr::from([127, 0, 0, 1]);
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else {
        return fallback;
    };
    for a in addrs {
        if !a.flags.contains(nix::net::if_::InterfaceFlags::IFF_UP)
            || a.flags
                .contains(nix::net::if_::InterfaceFlags::IFF_LOOPBACK)
        {
            continue;
        }
        if let Some(sin) = a.address.as_ref().and_then(|s| s.as_sockaddr_in()) {
            return IpAddr::V4(sin.ip());
        }
    }
    fallback
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn override_wins_and_is_lowercased() {
        assert_eq!(node_name(Some("Node-A")).unwrap(), "node-a");
        assert!(node_name(Some("  ")).is_err());
        assert!(node_name(Some("Bad_Node/x")).is_err());
        assert!(!node_name(None).unwrap().is_empty());
    }
}
