//! Image references as the registry client reads them (kubelet's `pkg/util/parsers`, over
//! containerd's `reference/docker` normalisation): the full reference the runtime records, and
//! the repository credentials are matched to.

/// A reference as the runtime records it (Docker's normalisation, containerd's
/// `reference/docker.ParseNormalizedNamed`, then `TagNameOnly`): a name without a registry is on
/// `docker.io` (`index.docker.io` is the same), an official image there is under `library/`, a
/// name with neither tag nor digest is `:latest`, and a name with both keeps the digest alone.
/// `busybox` → `docker.io/library/busybox:latest`; `docker.io/busybox:1.35` →
/// `docker.io/library/busybox:1.35`; `x:1@sha256:…` → `docker.io/library/x@sha256:…`.
pub fn normalize_reference(reference: &str) -> String {
    let (named, digest) = match reference.split_once('@') {
        Some((n, d)) => (n, Some(d)),
        None => (reference, None),
    };
    // A tag is a `:` after the last `/` (a `:` before it is a registry's port).
    let last = named.rsplit('/').next().unwrap_or(named);
    let (name, tag) = match last.rfind(':') {
        Some(colon) => {
            let cut = named.len() - last.len() + colon;
            (&named[..cut], Some(&named[cut + 1..]))
        }
        None => (named, None),
    };
    let (domain, path) = match name.split_once('/') {
        Some((first, rest))
            if first.contains('.') || first.contains(':') || first == "localhost" =>
        {
            (first, rest.to_owned())
        }
        _ => ("docker.io", name.to_owned()),
    };
    let domain = if domain == "index.docker.io" {
        "docker.io"
    } else {
        domain
    };
    let path = if domain == "docker.io" && !path.contains('/') {
        format!("library/{path}")
    } else {
        path
    };
    match (digest, tag) {
        (Some(d), _) => format!("{domain}/{path}@{d}"),
        (None, Some(t)) => format!("{domain}/{path}:{t}"),
        (None, None) => format!("{domain}/{path}:latest"),
    }
}

/// The repository an image reference names, normalised as the registry client normalises it
/// and without tag or digest (kubelet's `parsers.ParseImageName`): `busybox:1.36` →
/// `docker.io/library/busybox`, `registry.example:5000/team/app@sha256:…` →
/// `registry.example:5000/team/app`.
pub fn repository(image: &str) -> String {
    let full = normalize_reference(image);
    let named = full.split('@').next().unwrap_or_default();
    let last = named.rsplit('/').next().unwrap_or(named);
    match last.rfind(':') {
        Some(colon) => named[..named.len() - last.len() + colon].to_owned(),
        None => named.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_are_normalised_as_the_runtime_records_them() {
        for (given, want) in [
            ("busybox", "docker.io/library/busybox:latest"),
            ("busybox:1.36", "docker.io/library/busybox:1.36"),
            ("library/busybox:1.36", "docker.io/library/busybox:1.36"),
            ("me/app", "docker.io/me/app:latest"),
            ("registry.k8s.io/pause:3.9", "registry.k8s.io/pause:3.9"),
            ("127.0.0.1:5000/x:1", "127.0.0.1:5000/x:1"),
            ("127.0.0.1:5000/x", "127.0.0.1:5000/x:latest"),
            ("localhost/x", "localhost/x:latest"),
            ("busybox@sha256:ab", "docker.io/library/busybox@sha256:ab"),
            ("docker.io/busybox:1.35", "docker.io/library/busybox:1.35"),
            (
                "index.docker.io/library/busybox",
                "docker.io/library/busybox:latest",
            ),
            ("docker.io/me/app:2", "docker.io/me/app:2"),
            (
                "registry.k8s.io/etcd:3.4.23-0@sha256:0b10",
                "registry.k8s.io/etcd@sha256:0b10",
            ),
            (
                "busybox:1.36@sha256:ab",
                "docker.io/library/busybox@sha256:ab",
            ),
            ("127.0.0.1:5000/x@sha256:ab", "127.0.0.1:5000/x@sha256:ab"),
        ] {
            assert_eq!(normalize_reference(given), want, "{given}");
        }
    }

    #[test]
    fn repositories_are_normalised_without_tag_or_digest() {
        for (image, repo) in [
            ("busybox", "docker.io/library/busybox"),
            ("busybox:1.36", "docker.io/library/busybox"),
            ("team/app:v1", "docker.io/team/app"),
            ("index.docker.io/team/app", "docker.io/team/app"),
            (
                "registry.example:5000/team/app:v1",
                "registry.example:5000/team/app",
            ),
            (
                "registry.example:5000/app@sha256:abcd",
                "registry.example:5000/app",
            ),
            ("localhost/app:1", "localhost/app"),
        ] {
            assert_eq!(repository(image), repo, "{image}");
        }
    }
}
