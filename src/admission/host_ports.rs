//! Host ports at admission (the scheduler's `NodePorts` filter, which kubelet's
//! `GeneralPredicates` runs for every new pod).
//!
//! A pod wants the host ports of its containers' ports (and of its sidecars, init containers
//! with `restartPolicy: Always`) whose `hostPort` is set; on the host network every container
//! port is one (the API default copies `containerPort` into `hostPort`). Two ports conflict when
//! protocol and port match and the host IPs overlap: an unset or unspecified IP (`0.0.0.0`, `::`)
//! overlaps every IP.

use std::net::IpAddr;

use k8s_openapi::api::core::v1::Pod;

use super::Rejection;

/// The predicate's name, kubelet's rejection reason.
pub const REASON: &str = "NodePorts";

/// The scheduler's description of the failure.
pub const ERR_REASON: &str = "node(s) didn't have free ports for the requested pod ports";

/// One host port a pod claims.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPort {
    /// The host IP, `0.0.0.0` when unset or unspecified.
    pub ip: String,
    /// `TCP`, `UDP` or `SCTP`.
    pub protocol: String,
    /// 1..=65535.
    pub port: i32,
}

impl HostPort {
    fn all_ips(&self) -> bool {
        self.ip == "0.0.0.0"
    }

    /// True when both claim the same protocol and port on overlapping IPs.
    pub fn conflicts_with(&self, other: &HostPort) -> bool {
        self.protocol == other.protocol
            && self.port == other.port
            && (self.all_ips() || other.all_ips() || self.ip == other.ip)
    }
}

/// The host ports `pod` claims, in spec order.
pub fn host_ports(pod: &Pod) -> Vec<HostPort> {
    let Some(spec) = pod.spec.as_ref() else {
        return Vec::new();
    };
    let host_network = spec.host_network.unwrap_or(false);
    crate::pod::long_running_containers(spec)
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| {
            let port = match p.host_port.unwrap_or(0) {
                0 if host_network => p.container_port,
                hp => hp,
            };
            if port <= 0 {
                return None;
            }
            let ip = match p.host_ip.as_deref().map(str::parse::<IpAddr>) {
                Some(Ok(ip)) if !ip.is_unspecified() => ip.to_string(),
                _ => "0.0.0.0".to_owned(),
            };
            Some(HostPort {
                ip,
                protocol: p.protocol.clone().unwrap_or_else(|| "TCP".into()),
                port,
            })
        })
        .collect()
}

/// Refuses `pod` when one of its host ports conflicts with a port of `running` (the pods
/// already admitted and not finished), with kubelet's reason `NodePorts` and message
/// `Predicate NodePorts failed: node(s) didn't have free ports for the requested pod ports`.
pub fn admit<'a>(pod: &Pod, running: impl IntoIterator<Item = &'a Pod>) -> Option<Rejection> {
    let wanted = host_ports(pod);
    if wanted.is_empty() {
        return None;
    }
    let taken: Vec<HostPort> = running.into_iter().flat_map(host_ports).collect();
    let clash = wanted
        .iter()
        .any(|w| taken.iter().any(|t| w.conflicts_with(t)));
    clash.then(|| Rejection {
        reason: REASON.into(),
        message: format!("Predicate {REASON} failed: {ERR_REASON}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::testing::pods::with_spec as pod;

    #[test]
    fn host_network_ports_and_host_ports_are_claimed() {
        let p = pod("{hostNetwork: true, containers: [{name: c, image: b, ports: [{containerPort: 4534}, {containerPort: 53, protocol: UDP}]}]}");
        assert_eq!(
            host_ports(&p),
            vec![
                HostPort {
                    ip: "0.0.0.0".into(),
                    protocol: "TCP".into(),
                    port: 4534
                },
                HostPort {
                    ip: "0.0.0.0".into(),
                    protocol: "UDP".into(),
                    port: 53
                },
            ]
        );
        let p = pod("{containers: [{name: c, image: b, ports: [{containerPort: 80}, {containerPort: 81, hostPort: 8081, hostIP: '::'}]}]}");
        assert_eq!(
            host_ports(&p),
            vec![HostPort {
                ip: "0.0.0.0".into(),
                protocol: "TCP".into(),
                port: 8081
            }],
            "a container port without hostPort claims nothing off the host network"
        );
    }

    #[test]
    fn conflicts_follow_protocol_port_and_overlapping_ips() {
        let first = pod("{hostNetwork: true, containers: [{name: c, image: b, ports: [{containerPort: 4534}]}]}");
        let cases = [
            ("{hostNetwork: true, containers: [{name: d, image: b, ports: [{containerPort: 4534}]}]}", true),
            ("{containers: [{name: d, image: b, ports: [{containerPort: 80, hostPort: 4534, hostIP: 127.0.0.1}]}]}", true),
            ("{containers: [{name: d, image: b, ports: [{containerPort: 4534, protocol: UDP, hostPort: 4534}]}]}", false),
            ("{containers: [{name: d, image: b, ports: [{containerPort: 4535, hostPort: 4535}]}]}", false),
            ("{containers: [{name: d, image: b, ports: [{containerPort: 4534}]}]}", false),
            ("{initContainers: [{name: s, image: b, restartPolicy: Always, ports: [{containerPort: 1, hostPort: 4534}]}], containers: [{name: d, image: b}]}", true),
        ];
        for (spec, refused) in cases {
            let r = admit(&pod(spec), [&first]);
            assert_eq!(r.is_some(), refused, "{spec}");
            if let Some(r) = r {
                assert_eq!(r.reason, "NodePorts");
                assert_eq!(
                    r.status_message(),
                    "Pod was rejected: Predicate NodePorts failed: node(s) didn't have free ports for the requested pod ports"
                );
            }
        }
        let a = pod("{containers: [{name: d, image: b, ports: [{containerPort: 1, hostPort: 9000, hostIP: 10.0.0.1}]}]}");
        let b = pod("{containers: [{name: d, image: b, ports: [{containerPort: 1, hostPort: 9000, hostIP: 10.0.0.2}]}]}");
        assert!(admit(&a, [&b]).is_none(), "distinct IPs do not overlap");
    }
}
