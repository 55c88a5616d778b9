//! A container's probe as the prober runs it: kubelet's defaults applied
//! (`initialDelaySeconds` 0, `periodSeconds` 10, `timeoutSeconds` 1, `successThreshold` 1,
//! `failureThreshold` 3) and the one handler it names.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::ProbeKind;

/// Where a probe or hook connects: a port number, or the name of one of the container's ports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PortRef {
    /// A port number.
    Number(i32),
    /// A port name, resolved against the container's `ports`.
    Name(String),
}

impl PortRef {
    fn of(p: &IntOrString) -> Self {
        match p {
            IntOrString::Int(n) => Self::Number(*n),
            IntOrString::String(s) => match s.parse() {
                Ok(n) => Self::Number(n),
                Err(_) => Self::Name(s.clone()),
            },
        }
    }

    /// The port number for `container` (kubelet's `findPortByName`).
    ///
    /// Errors: a message naming the port when no port of the container has that name, or the
    /// number is outside 1..=65535.
    pub fn resolve(&self, container: &Container) -> Result<u16, String> {
        let n = match self {
            Self::Number(n) => *n,
            Self::Name(name) => container
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(name.as_str()))
                .map(|p| p.container_port)
                .ok_or_else(|| {
                    format!(
                        "couldn't find port {name:?} in container {:?}",
                        container.name
                    )
                })?,
        };
        u16::try_from(n)
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("invalid port number {n}"))
    }
}

/// What a probe or a lifecycle hook does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handler {
    /// Runs the command in the container (CRI ExecSync); exit code 0 is success.
    Exec(Vec<String>),
    /// An HTTP GET; 200–399 is success.
    Http(HttpGet),
    /// A TCP connection that opens is success.
    Tcp {
        /// Host; the pod's IP when absent.
        host: Option<String>,
        /// Port.
        port: PortRef,
    },
    /// `grpc.health.v1.Health/Check`; SERVING is success.
    Grpc {
        /// Port number.
        port: i32,
        /// The service asked about (empty: the server as a whole).
        service: String,
    },
    /// A pause (lifecycle hooks only).
    Sleep(Duration),
}

/// An httpGet probe or hook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpGet {
    /// `http` or `https` (lower case).
    pub scheme: String,
    /// Host; the pod's IP when absent.
    pub host: Option<String>,
    /// Port.
    pub port: PortRef,
    /// Path, starting with `/`.
    pub path: String,
    /// Extra headers (a `Host` header sets the request's host).
    pub headers: Vec<(String, String)>,
}

/// One probe of a container, ready to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeSpec {
    /// The handler.
    pub handler: Handler,
    /// `initialDelaySeconds`.
    pub initial_delay: Duration,
    /// `periodSeconds` (at least 1 s).
    pub period: Duration,
    /// `timeoutSeconds` (at least 1 s).
    pub timeout: Duration,
    /// `successThreshold` (at least 1).
    pub success_threshold: u32,
    /// `failureThreshold` (at least 1).
    pub failure_threshold: u32,
    /// The probe's own `terminationGracePeriodSeconds`, used when it kills.
    pub termination_grace_seconds: Option<i64>,
}

/// The probe of `kind` on `container`, if it has one. A probe with no handler or more than one
/// is refused earlier, by manifest validation ([`validate`]); here it is `None`.
pub fn probe_of(container: &Container, kind: ProbeKind) -> Option<ProbeSpec> {
    let p = match kind {
        ProbeKind::Liveness => container.liveness_probe.as_ref(),
        ProbeKind::Readiness => container.readiness_probe.as_ref(),
        ProbeKind::Startup => container.startup_probe.as_ref(),
    }?;
    let secs = |v: Option<i32>, default: i32, min: i32| {
        Duration::from_secs(u64::try_from(v.unwrap_or(default).max(min)).unwrap_or(0))
    };
    let threshold =
        |v: Option<i32>, default: i32| u32::try_from(v.unwrap_or(default).max(1)).unwrap_or(1);
    Some(ProbeSpec {
        handler: handler_of_probe(p).ok()??,
        initial_delay: secs(p.initial_delay_seconds, 0, 0),
        period: secs(p.period_seconds, 10, 1),
        timeout: secs(p.timeout_seconds, 1, 1),
        success_threshold: threshold(p.success_threshold, 1),
        failure_threshold: threshold(p.failure_threshold, 3),
        termination_grace_seconds: p.termination_grace_period_seconds,
    })
}

fn http_get(h: &k8s_openapi::api::core::v1::HTTPGetAction) -> HttpGet {
    let path = h.path.clone().unwrap_or_default();
    HttpGet {
        scheme: h.scheme.as_deref().unwrap_or("HTTP").to_ascii_lowercase(),
        host: h.host.clone().filter(|s| !s.is_empty()),
        port: PortRef::of(&h.port),
        path: if path.starts_with('/') {
            path
        } else {
            format!("/{path}")
        },
        headers: h
            .http_headers
            .iter()
            .flatten()
            .map(|x| (x.name.clone(), x.value.clone()))
            .collect(),
    }
}

/// The one handler of a probe: `Ok(None)` when it names none, `Err` with the count when more.
fn handler_of_probe(p: &Probe) -> Result<Option<Handler>, usize> {
    let mut found = Vec::new();
    if let Some(e) = &p.exec {
        found.push(Handler::Exec(e.command.clone().unwrap_or_default()));
    }
    if let Some(h) = &p.http_get {
        found.push(Handler::Http(http_get(h)));
    }
    if let Some(t) = &p.tcp_socket {
        found.push(Handler::Tcp {
            host: t.host.clone().filter(|s| !s.is_empty()),
            port: PortRef::of(&t.port),
        });
    }
    if let Some(g) = &p.grpc {
        found.push(Handler::Grpc {
            port: g.port,
            service: g.service.clone().unwrap_or_default(),
        });
    }
    match found.len() {
        0 => Ok(None),
        1 => Ok(found.pop()),
        n => Err(n),
    }
}

/// The one handler of a lifecycle hook (exec, httpGet, sleep; kubelet's `LifecycleHandler`).
pub fn handler_of_hook(
    h: &k8s_openapi::api::core::v1::LifecycleHandler,
) -> Result<Option<Handler>, usize> {
    let mut found = Vec::new();
    if let Some(e) = &h.exec {
        found.push(Handler::Exec(e.command.clone().unwrap_or_default()));
    }
    if let Some(g) = &h.http_get {
        found.push(Handler::Http(http_get(g)));
    }
    if let Some(s) = &h.sleep {
        found.push(Handler::Sleep(Duration::from_secs(
            u64::try_from(s.seconds).unwrap_or(0),
        )));
    }
    if let Some(t) = &h.tcp_socket {
        // Deprecated and not supported by kubelet as a hook; kept so validation can name it.
        found.push(Handler::Tcp {
            host: t.host.clone(),
            port: PortRef::of(&t.port),
        });
    }
    match found.len() {
        0 => Ok(None),
        1 => Ok(found.pop()),
        n => Err(n),
    }
}

/// Validates a container's probes and lifecycle hooks as the API server does
/// (`validateProbe`, `validateLifecycle`): each names exactly one handler; liveness and startup
/// probes have `successThreshold` 1; a grpc port is a number in 1..=65535; numbers are not
/// negative. `field` is the container's path (`spec.containers[0]`).
///
/// Errors: the field path and the rule, as `(field, reason)`.
pub fn validate(field: &str, c: &Container) -> Result<(), (String, String)> {
    for (name, kind) in [
        ("livenessProbe", ProbeKind::Liveness),
        ("readinessProbe", ProbeKind::Readiness),
        ("startupProbe", ProbeKind::Startup),
    ] {
        let p = match kind {
            ProbeKind::Liveness => &c.liveness_probe,
            ProbeKind::Readiness => &c.readiness_probe,
            ProbeKind::Startup => &c.startup_probe,
        };
        let Some(p) = p else { continue };
        let at = format!("{field}.{name}");
        match handler_of_probe(p) {
            Ok(None) => return Err((at, "must specify a handler type".into())),
            Err(_) => return Err((at, "may not specify more than 1 handler type".into())),
            Ok(Some(Handler::Grpc { port, .. })) if !(1..=65535).contains(&port) => {
                return Err((
                    format!("{at}.grpc.port"),
                    "must be between 1 and 65535".into(),
                ))
            }
            Ok(Some(h)) => validate_handler(&at, &h)?,
        }
        for (f, v) in [
            ("initialDelaySeconds", p.initial_delay_seconds),
            ("timeoutSeconds", p.timeout_seconds),
            ("periodSeconds", p.period_seconds),
            ("successThreshold", p.success_threshold),
            ("failureThreshold", p.failure_threshold),
        ] {
            if v.is_some_and(|v| v < 0) {
                return Err((
                    format!("{at}.{f}"),
                    "must be greater than or equal to 0".into(),
                ));
            }
        }
        if kind != ProbeKind::Readiness && p.success_threshold.is_some_and(|v| v > 1) {
            return Err((format!("{at}.successThreshold"), "must be 1".into()));
        }
        if p.termination_grace_period_seconds.is_some_and(|v| v <= 0) {
            return Err((
                format!("{at}.terminationGracePeriodSeconds"),
                "must be greater than 0".into(),
            ));
        }
        if kind == ProbeKind::Readiness && p.termination_grace_period_seconds.is_some() {
            return Err((
                format!("{at}.terminationGracePeriodSeconds"),
                "must not be set for readinessProbes".into(),
            ));
        }
    }
    if let Some(l) = &c.lifecycle {
        for (name, h) in [("postStart", &l.post_start), ("preStop", &l.pre_stop)] {
            let Some(h) = h else { continue };
            let at = format!("{field}.lifecycle.{name}");
            match handler_of_hook(h) {
                Ok(None) => return Err((at, "must specify a handler type".into())),
                Err(_) => return Err((at, "may not specify more than 1 handler type".into())),
                Ok(Some(Handler::Tcp { .. })) => {
                    return Err((
                        format!("{at}.tcpSocket"),
                        "is not supported by lifecycle hooks".into(),
                    ))
                }
                Ok(Some(h)) => validate_handler(&at, &h)?,
            }
            if h.sleep.as_ref().is_some_and(|s| s.seconds < 0) {
                return Err((
                    format!("{at}.sleep.seconds"),
                    "must be greater than or equal to 0".into(),
                ));
            }
        }
    }
    Ok(())
}

/// A port number in 1..=65535, or a port name as the API server allows it (an IANA service
/// name: at most 15 lowercase letters, digits and '-', with a letter).
fn validate_port(at: &str, p: &PortRef) -> Result<(), (String, String)> {
    match p {
        PortRef::Number(n) if (1..=65535).contains(n) => Ok(()),
        PortRef::Number(_) => Err((at.into(), "must be between 1 and 65535".into())),
        PortRef::Name(s)
            if !s.is_empty()
                && s.len() <= 15
                && s.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && s.chars().any(|c| c.is_ascii_lowercase())
                && !s.starts_with('-')
                && !s.ends_with('-') =>
        {
            Ok(())
        }
        PortRef::Name(_) => Err((
            at.into(),
            "must be a port number or an IANA service name (at most 15 lowercase letters, digits and '-')".into(),
        )),
    }
}

/// The API server's checks of one handler: exec has a command; httpGet has scheme HTTP or
/// HTTPS, a valid port and header names that are HTTP tokens; tcpSocket a valid port.
fn validate_handler(at: &str, h: &Handler) -> Result<(), (String, String)> {
    match h {
        Handler::Exec(cmd) if cmd.is_empty() => {
            Err((format!("{at}.exec.command"), "is required".into()))
        }
        Handler::Http(g) => {
            if !matches!(g.scheme.as_str(), "http" | "https") {
                return Err((
                    format!("{at}.httpGet.scheme"),
                    "must be HTTP or HTTPS".into(),
                ));
            }
            validate_port(&format!("{at}.httpGet.port"), &g.port)?;
            let token = |s: &str| {
                !s.is_empty()
                    && s.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
            };
            if let Some((name, _)) = g.headers.iter().find(|(n, _)| !token(n)) {
                return Err((
                    format!("{at}.httpGet.httpHeaders"),
                    format!("{name:?} is not a valid HTTP header name"),
                ));
            }
            if let Some((name, _)) = g.headers.iter().find(|(_, v)| v.contains(['\r', '\n'])) {
                return Err((
                    format!("{at}.httpGet.httpHeaders"),
                    format!("the value of {name:?} may not hold a line break"),
                ));
            }
            Ok(())
        }
        Handler::Tcp { port, .. } => validate_port(&format!("{at}.tcpSocket.port"), port),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn container(yaml: &str) -> Container {
        serde_yaml::from_str(yaml).unwrap()
    }

    #[test]
    fn kubelets_defaults_and_ports_by_name() {
        let c = container("{name: c, ports: [{name: http, containerPort: 8080}], readinessProbe: {httpGet: {port: http, path: healthz}}}");
        let p = probe_of(&c, ProbeKind::Readiness).unwrap();
        assert_eq!(p.period, Duration::from_secs(10));
        assert_eq!(p.timeout, Duration::from_secs(1));
        assert_eq!((p.success_threshold, p.failure_threshold), (1, 3));
        let Handler::Http(h) = &p.handler else {
            panic!()
        };
        assert_eq!((h.scheme.as_str(), h.path.as_str()), ("http", "/healthz"));
        assert_eq!(h.port.resolve(&c), Ok(8080));
        assert_eq!(
            PortRef::Name("metrics".into()).resolve(&c),
            Err("couldn't find port \"metrics\" in container \"c\"".into())
        );
        assert!(probe_of(&c, ProbeKind::Liveness).is_none());
    }

    #[test]
    fn a_probe_names_exactly_one_handler() {
        let none = container("{name: c, livenessProbe: {periodSeconds: 1}}");
        assert_eq!(
            validate("spec.containers[0]", &none),
            Err((
                "spec.containers[0].livenessProbe".into(),
                "must specify a handler type".into()
            ))
        );
        let two = container(
            "{name: c, readinessProbe: {exec: {command: [true]}, tcpSocket: {port: 80}}}",
        );
        assert_eq!(
            validate("spec.containers[0]", &two).unwrap_err().1,
            "may not specify more than 1 handler type"
        );
        for (bad, field) in [
            ("{name: c, readinessProbe: {tcpSocket: {port: 0}}}", "spec.containers[0].readinessProbe.tcpSocket.port"),
            ("{name: c, readinessProbe: {httpGet: {port: 70000}}}", "spec.containers[0].readinessProbe.httpGet.port"),
            ("{name: c, readinessProbe: {httpGet: {port: 80, scheme: FTP}}}", "spec.containers[0].readinessProbe.httpGet.scheme"),
            ("{name: c, readinessProbe: {httpGet: {port: 80, httpHeaders: [{name: 'Bad Name', value: x}]}}}", "spec.containers[0].readinessProbe.httpGet.httpHeaders"),
            ("{name: c, livenessProbe: {exec: {command: []}}}", "spec.containers[0].livenessProbe.exec.command"),
            ("{name: c, livenessProbe: {tcpSocket: {port: Not_A_Name}}}", "spec.containers[0].livenessProbe.tcpSocket.port"),
        ] {
            assert_eq!(validate("spec.containers[0]", &container(bad)).unwrap_err().0, field, "{bad}");
        }
        let hook = container("{name: c, lifecycle: {preStop: {}}}");
        assert_eq!(
            validate("spec.containers[0]", &hook).unwrap_err().0,
            "spec.containers[0].lifecycle.preStop"
        );
        let ok = container("{name: c, startupProbe: {exec: {command: [true]}}, lifecycle: {preStop: {sleep: {seconds: 3}}}}");
        assert_eq!(validate("spec.containers[0]", &ok), Ok(()));
        let liveness =
            container("{name: c, livenessProbe: {exec: {command: [true]}, successThreshold: 2}}");
        assert_eq!(
            validate("spec.containers[0]", &liveness).unwrap_err().0,
            "spec.containers[0].livenessProbe.successThreshold"
        );
    }
}
