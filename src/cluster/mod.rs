//! Cluster mode (kubelet run with `--kubeconfig`): nodelet as a node of a Kubernetes control
//! plane. Without a kubeconfig nodelet runs standalone, static pods only.
//!
//! What it does: the API client ([`client`]), node registration and status ([`node_status`],
//! kubelet's `kubelet_node_status.go` and `nodestatus` setters), the node Lease ([`node_lease`],
//! kubelet's `nodelease` controller), mirror pods for static pods with their status
//! ([`mirror_pods`]), the API pod source ([`crate::source::api`]) with its pods' status
//! ([`pod_status`]; a pod refused at admission is posted Failed with kubelet's reason) and final
//! delete, events posted with kubelet's correlation and rate limits ([`events`]), and the API
//! pods' ConfigMaps and Secrets read from the apiserver and watched ([`objects`]). Each runs as
//! its own task on the agent's runtime; an unreachable apiserver delays them and nothing else:
//! static pods run whether or not the node has registered. With the apiserver away, pods run
//! on, each pod's latest status waits and is posted within [`pod_status::MAX_STATUS_BACKOFF`] of
//! its return, and the pod watch resumes or lists again within
//! [`crate::source::api::WATCH_MAX_BACKOFF`].
//!
//! The control plane the tests use is kube-apiserver v1.20 (scripts/env/cluster.sh). Fields a
//! newer one adds that nodelet writes (`status.hostIPs`, 1.28) are dropped by 1.20; the README's
//! cluster section lists them.

pub mod events;
pub mod mirror_pods;
pub mod node_lease;
pub mod node_status;
pub mod objects;
pub mod pod_status;
pub mod services;

use std::path::Path;

/// A client that cannot be built from the kubeconfig.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The file cannot be read or is not a kubeconfig.
    #[error("kubeconfig {path}: {message}")]
    Kubeconfig {
        /// The file.
        path: String,
        /// What is wrong.
        message: String,
    },
}

/// The kubeconfig at `path`, read and parsed (nothing is dialled): what `check-config` checks
/// of `--kubeconfig`, and the start of [`client`].
///
/// Errors: [`ClusterError::Kubeconfig`], the file unreadable or not a kubeconfig, its content
/// left out (only the parser message's first line, quoted values elided).
pub fn read_kubeconfig(path: &Path) -> Result<kube::config::Kubeconfig, ClusterError> {
    kube::config::Kubeconfig::read_from(path).map_err(|e| ClusterError::Kubeconfig {
        path: path.display().to_string(),
        message: redacted(&e.to_string()),
    })
}

/// A client for the apiserver named by the kubeconfig at `path` (its current context; client
/// certificate or bearer token), as kubelet's `--kubeconfig`.
///
/// Errors: [`ClusterError::Kubeconfig`] when the file cannot be read or parsed, names no
/// current context, or its credentials cannot be loaded.
pub async fn client(path: &Path) -> Result<kube::Client, ClusterError> {
    let err = |message: String| ClusterError::Kubeconfig {
        path: path.display().to_string(),
        message,
    };
    let kubeconfig = read_kubeconfig(path)?;
    if let Some(field) = x509_v1_client_certificate(&kubeconfig, path) {
        return Err(err(format!(
            "the client certificate ({field}) is an X.509 v1 certificate, which nodelet's TLS \
             library (rustls) does not accept (kubectl, in Go, does): issue it again as X.509 v3. \
             With openssl, give `openssl x509 -req` an extension file, for example \
             `-extfile <(printf 'basicConstraints=CA:FALSE\\nkeyUsage=digitalSignature,keyEncipherment\\nextendedKeyUsage=clientAuth\\n')`"
        )));
    }
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .map_err(|e| err(e.to_string()))?;
    kube::Client::try_from(config).map_err(|e| err(e.to_string()))
}

/// A kubeconfig parse error without the file's content: its first line only (the YAML parser
/// appends the lines around the error, which hold tokens and keys), double-quoted values
/// replaced by `"…"`. What is left names the line, column and rule (field names stay: serde
/// quotes them with backticks), as client-go reports `yaml: line N: …`.
fn redacted(message: &str) -> String {
    let first = message.lines().next().unwrap_or_default();
    let mut out = String::with_capacity(first.len());
    let mut quoted = false;
    for c in first.chars() {
        match (c, quoted) {
            ('"', false) => {
                out.push_str("\"…");
                quoted = true;
            }
            ('"', true) => {
                out.push('"');
                quoted = false;
            }
            (_, false) => out.push(c),
            (_, true) => {}
        }
    }
    if quoted {
        out.push('"');
    }
    out
}

/// The field of the current context's client certificate when that certificate is X.509 v1
/// (`users[<name>].user.client-certificate-data`, or `...client-certificate` and its file),
/// which rustls refuses with `UnsupportedCertVersion`; `None` when it is v3, absent or
/// unreadable (the client's own loading then reports what is wrong). A relative
/// `client-certificate` path is read from the kubeconfig's directory, as kubectl reads it.
fn x509_v1_client_certificate(kc: &kube::config::Kubeconfig, path: &Path) -> Option<String> {
    use base64::Engine;
    use rustls_pki_types::pem::PemObject;
    let context = kc.current_context.as_deref()?;
    let user = kc
        .contexts
        .iter()
        .find(|c| c.name == context)?
        .context
        .as_ref()?
        .user
        .as_deref()?;
    let auth = kc
        .auth_infos
        .iter()
        .find(|a| a.name == user)?
        .auth_info
        .as_ref()?;
    let (field, pem) = if let Some(data) = &auth.client_certificate_data {
        let pem = base64::engine::general_purpose::STANDARD
            .decode(data.trim())
            .ok()?;
        (format!("users[{user}].user.client-certificate-data"), pem)
    } else {
        let file = auth.client_certificate.as_deref()?;
        let file = path.parent().unwrap_or(Path::new(".")).join(file);
        let pem = std::fs::read(&file).ok()?;
        (
            format!("users[{user}].user.client-certificate: {}", file.display()),
            pem,
        )
    };
    let der = rustls_pki_types::CertificateDer::pem_slice_iter(&pem)
        .next()?
        .ok()?;
    matches!(
        webpki::EndEntityCert::try_from(&der),
        Err(webpki::Error::UnsupportedCertVersion)
    )
    .then_some(field)
}

/// Starts the node's tasks on `rt`: registration and node status, the Lease, mirror pods for the
/// static pods and the API pods' status (both read from `status`), and the events of
/// `recorder`. The API pod source is started with the other pod sources
/// ([`crate::source::api::run`]).
pub fn spawn(
    rt: &tokio::runtime::Handle,
    client: kube::Client,
    facts: node_status::NodeFacts,
    inputs: node_status::StatusInputs,
    status: crate::status::StatusManager,
    recorder: crate::events::Recorder,
) {
    let name = facts.name.clone();
    let (registered_tx, registered_rx) = tokio::sync::watch::channel(None);
    rt.spawn(node_status::run(
        client.clone(),
        facts,
        inputs,
        registered_tx,
        recorder.clone(),
    ));
    rt.spawn(node_lease::run(
        client.clone(),
        name.clone(),
        registered_rx.clone(),
    ));
    rt.spawn(events::run(client.clone(), name.clone(), recorder));
    rt.spawn(mirror_pods::run(
        client.clone(),
        name,
        status.clone(),
        registered_rx,
    ));
    rt.spawn(pod_status::run(client, status));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kubeconfig that does not parse is named with the place and the rule, never with its
    /// lines (tokens, keys) or a quoted value.
    #[tokio::test]
    async fn a_broken_kubeconfig_is_reported_without_its_content() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kc.yaml");
        std::fs::write(
            &path,
            "apiVersion: v1\nkind: Config\nusers:\n- name: n\n  user:\n    token: SUPERSECRETTOKEN123\n    client-key-data: \"LS0tLS1CRUdJTi\n",
        )
        .unwrap();
        let e = client(&path)
            .await
            .err()
            .expect("does not parse")
            .to_string();
        assert!(!e.contains("SUPERSECRET") && !e.contains("LS0t"), "{e}");
        assert!(
            e.starts_with(&format!("kubeconfig {}: ", path.display())),
            "{e}"
        );
        assert!(e.contains("line 7"), "{e}");
        assert_eq!(
            redacted("invalid type: string \"hunter2\", expected a map at line 3\n 3 | x: hunter2"),
            "invalid type: string \"…\", expected a map at line 3"
        );
    }

    // A self-signed client certificate for system:node:n1 made by `openssl x509 -req` without
    // an extension file (X.509 v1), the same with one (v3), and their key.
    const V1: &str = "-----BEGIN CERTIFICATE-----\nMIIBXDCCAQECFF9cLKRJDiU6KKaqtjUIcj0WFFNsMAoGCCqGSM49BAMCMDAxFzAV\nBgNVBAMMDnN5c3RlbTpub2RlOm4xMRUwEwYDVQQKDAxzeXN0ZW06bm9kZXMwHhcN\nMjYxMjAzMDc1MzAyWhcNMzYxMTMwMDc1MzAyWjAwMRcwFQYDVQQDDA5zeXN0ZW06\nbm9kZTpuMTEVMBMGA1UECgwMc3lzdGVtOm5vZGVzMFkwEwYHKoZIzj0CAQYIKoZI\nzj0DAQcDQgAEsxIGECMIQJ8b22/ABcjXhGg6wuI92BQCeXBPzUaRxIFr45lBSN7F\n/VH8yEa+XW99SFyeNT16XeJWy71rzSmWATAKBggqhkjOPQQDAgNJADBGAiEAqa9u\njGPqVHSe7azI/gbIbPy2yBZ1BZZkHKWozizgUeQCIQDLKeE5w+O9HmReJ6H8X2/E\nNPhO1HCMt7ywSS9w/TnNbQ==\n-----END CERTIFICATE-----\n";
    const V3: &str = "-----BEGIN CERTIFICATE-----\nMIIBrzCCAVagAwIBAgIULrqIg1DYCMQUiBeTREd5/0JOSuUwCgYIKoZIzj0EAwIw\nMDEXMBUGA1UEAwwOc3lzdGVtOm5vZGU6bjExFTATBgNVBAoMDHN5c3RlbTpub2Rl\nczAeFw0yNjEyMDMwNzUzMDJaFw0zNjExMzAwNzUzMDJaMDAxFzAVBgNVBAMMDnN5\nc3RlbTpub2RlOm4xMRUwEwYDVQQKDAxzeXN0ZW06bm9kZXMwWTATBgcqhkjOPQIB\nBggqhkjOPQMBBwNCAASzEgYQIwhAnxvbb8AFyNeEaDrC4j3YFAJ5cE/NRpHEgWvj\nmUFI3sX9UfzIRr5db31IXJ41PXpd4lbLvWvNKZYBo04wTDAJBgNVHRMEAjAAMAsG\nA1UdDwQEAwIFoDATBgNVHSUEDDAKBggrBgEFBQcDAjAdBgNVHQ4EFgQULcVV3xAU\nCzWv4vsYoAWsWHEnb24wCgYIKoZIzj0EAwIDRwAwRAIgbf/+InivARlRrNmguCey\nSwOWtVxLrDTQT/42wajlFl8CIFCf8bcCzzl4RtiZP0mTgQj9VhbwRdWd24P0ZjDq\nHvsM\n-----END CERTIFICATE-----\n";
    const KEY: &str = "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgQ194LxJr3ONB08Rf\npegFxwXrX4Yvr9gIH+RI9U3BKRKhRANCAASzEgYQIwhAnxvbb8AFyNeEaDrC4j3Y\nFAJ5cE/NRpHEgWvjmUFI3sX9UfzIRr5db31IXJ41PXpd4lbLvWvNKZYB\n-----END PRIVATE KEY-----\n";

    fn kubeconfig(dir: &Path, cert: &str, inline: bool) -> std::path::PathBuf {
        use base64::Engine;
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let cert_field = if inline {
            format!("client-certificate-data: {}", b64(cert))
        } else {
            std::fs::write(dir.join("node.crt"), cert).unwrap();
            "client-certificate: node.crt".to_owned()
        };
        let path = dir.join("kubeconfig");
        std::fs::write(
            &path,
            format!(
                "apiVersion: v1\nkind: Config\nclusters: [{{name: c, cluster: {{server: 'https://127.0.0.1:1', insecure-skip-tls-verify: true}}}}]\nusers: [{{name: node, user: {{{cert_field}, client-key-data: {}}}}}]\ncontexts: [{{name: ctx, context: {{cluster: c, user: node}}}}]\ncurrent-context: ctx\n",
                b64(KEY)
            ),
        )
        .unwrap();
        path
    }

    #[tokio::test]
    async fn an_x509_v1_client_certificate_is_named_with_how_to_fix_it() {
        let dir = tempfile::tempdir().unwrap();
        for inline in [true, false] {
            let path = kubeconfig(dir.path(), V1, inline);
            let e = client(&path).await.err().expect("refused").to_string();
            let field = if inline {
                "users[node].user.client-certificate-data".to_owned()
            } else {
                format!(
                    "users[node].user.client-certificate: {}",
                    dir.path().join("node.crt").display()
                )
            };
            assert!(
                e.starts_with(&format!(
                    "kubeconfig {}: the client certificate ({field}) is an X.509 v1 certificate",
                    path.display()
                )),
                "{e}"
            );
            assert!(e.contains("issue it again as X.509 v3"), "{e}");
        }
        // The same key with a v3 certificate makes a client.
        let path = kubeconfig(dir.path(), V3, true);
        client(&path).await.unwrap();
    }
}
