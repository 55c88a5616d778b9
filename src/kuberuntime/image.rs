//! Image manager (kubelet's `images/image_manager.go`, `EnsureImageExists`): pull by
//! `imagePullPolicy` and report the reasons kubelet reports.

use k8s_openapi::api::core::v1::Container;

use crate::cri::{api, ImageService};

/// Why an image is not available, with kubelet's waiting reasons.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImageError {
    /// The pull failed (`ErrImagePull`).
    #[error("failed to pull image {image:?}: {message}")]
    Pull {
        /// Image as written in the spec.
        image: String,
        /// The runtime's message.
        message: String,
    },
    /// Policy Never and the image is not present (`ErrImageNeverPull`).
    #[error("image {image:?} is not present with pull policy of Never")]
    NeverPull {
        /// Image as written in the spec.
        image: String,
    },
    /// The image is not a valid reference (`InvalidImageName`): never pulled.
    #[error("Failed to apply default image tag {image:?}: couldn't parse image reference {image:?}: {message}")]
    InvalidName {
        /// Image as written in the spec.
        image: String,
        /// What is wrong with it.
        message: String,
    },
    /// The image service could not be asked (`ErrImageInspect`).
    #[error("failed to inspect image {image:?}: {message}")]
    Inspect {
        /// Image as written in the spec.
        image: String,
        /// The runtime's message.
        message: String,
    },
}

impl ImageError {
    /// kubelet's waiting reason for this error.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Pull { .. } => "ErrImagePull",
            Self::InvalidName { .. } => "InvalidImageName",
            Self::NeverPull { .. } => "ErrImageNeverPull",
            Self::Inspect { .. } => "ImageInspectError",
        }
    }

    /// The Warning event kubelet's image manager records for this error (`EnsureImageExists`):
    /// its reason and message (`Failed`: `Failed to pull image "x": <the runtime's message>`;
    /// `ErrImageNeverPull`; `InspectFailed` for a reference that does not parse or an image
    /// service that cannot be asked). kubelet's `startContainer` follows it with a second,
    /// `Failed`: `Error: <waiting reason>`.
    pub fn event(&self) -> (&'static str, String) {
        match self {
            Self::Pull { image, message } => (
                "Failed",
                format!("Failed to pull image {image:?}: {message}"),
            ),
            Self::NeverPull { image } => (
                "ErrImageNeverPull",
                format!("Container image {image:?} is not present with pull policy of Never"),
            ),
            Self::InvalidName { .. } => ("InspectFailed", self.to_string()),
            Self::Inspect { image, message } => (
                "InspectFailed",
                format!("Failed to inspect image {image:?}: {message}"),
            ),
        }
    }
}

/// What [`ensure_image`] found or did on the way to an image, each reported as it happens for
/// kubelet's Normal image events (`Pulled`: `Container image "x" already present on machine`;
/// `Pulling`: `Pulling image "x"`; `Pulled`: `Successfully pulled image "x" in 1.2s`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageStep {
    /// The image is present and the policy does not pull it.
    Present,
    /// A pull is about to start.
    Pulling,
    /// The pull succeeded.
    Pulled,
}

/// An image made sure of by [`ensure_image`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnsuredImage {
    /// The reference containers are created with: the image ID (`sha256:…`).
    pub id: String,
    /// The reference containerd's ContainerStatus will report for a container of it, when the
    /// image's status was read: its first repository digest, else its ID (containerd's
    /// `ContainerStatus` takes the first of the image's repo digests). `None` after a pull.
    pub status_ref: Option<String>,
}

/// Checks `image` against the grammar of image references that kubelet parses it with before a
/// pull (`reference.ParseNormalizedNamed` of the distribution library, in kubelet's
/// `applyDefaultImageTag`): `[domain[:port]/]path[:tag][@digest]`, path components of
/// lowercase letters and digits joined by `.`, `_`, `__` or dashes, a tag of at most 128 word
/// characters, `.` and `-` (not starting with either), a digest `algorithm:hex` of at least 32
/// hex digits, the name at most 255 characters, and not 64 hex digits alone.
///
/// Errors: the library's message (`invalid reference format`, `…: repository name must be
/// lowercase`, …).
pub fn check_reference(image: &str) -> Result<(), &'static str> {
    const INVALID: &str = "invalid reference format";
    let is_hex = |s: &str| s.bytes().all(|b| b.is_ascii_hexdigit());
    if image.len() == 64 && is_hex(image) {
        return Err("invalid repository name (64 hex characters), cannot specify 64-byte hexadecimal strings");
    }
    let (named, digest) = match image.split_once('@') {
        Some((n, d)) => (n, Some(d)),
        None => (image, None),
    };
    if let Some(d) = digest {
        let (alg, hex) = d.split_once(':').ok_or(INVALID)?;
        let alg_ok = !alg.is_empty()
            && alg.split(['-', '_', '+', '.']).all(|c| {
                c.as_bytes().first().is_some_and(u8::is_ascii_alphabetic)
                    && c.bytes().all(|b| b.is_ascii_alphanumeric())
            });
        if !alg_ok || hex.len() < 32 || !is_hex(hex) {
            return Err(INVALID);
        }
    }
    // The tag is after the last ':' that follows the last '/' (a ':' before it is a port).
    let slash = named.rfind('/').map_or(0, |i| i + 1);
    let (name, tag) = match named[slash..].rfind(':') {
        Some(i) => (&named[..slash + i], Some(&named[slash + i + 1..])),
        None => (named, None),
    };
    if let Some(t) = tag {
        let b = t.as_bytes();
        let word = |c: &u8| c.is_ascii_alphanumeric() || *c == b'_';
        if b.is_empty()
            || b.len() > 128
            || !word(&b[0])
            || !b.iter().all(|c| word(c) || matches!(c, b'.' | b'-'))
        {
            return Err(INVALID);
        }
    }
    if name.is_empty() {
        return Err(INVALID);
    }
    if name.len() > 255 {
        return Err("repository name must not be more than 255 characters");
    }
    let mut parts: Vec<&str> = name.split('/').collect();
    // The first part is a domain when it has a '.' or a ':' or is localhost, and more follow.
    if parts.len() > 1 && (parts[0].contains(['.', ':']) || parts[0] == "localhost") {
        let domain = parts.remove(0);
        // `[v6]`, `[v6]:port`, `host`, `host:port`.
        let (host, port) = match domain.find(']') {
            Some(i) if domain.starts_with('[') => match &domain[i + 1..] {
                "" => (&domain[..=i], None),
                rest => (&domain[..=i], Some(rest.strip_prefix(':').ok_or(INVALID)?)),
            },
            _ => match domain.split_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (domain, None),
            },
        };
        if port.is_some_and(|p| p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit())) {
            return Err(INVALID);
        }
        let host_ok = if let Some(v6) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
            !v6.is_empty() && v6.bytes().all(|b| b.is_ascii_hexdigit() || b == b':')
        } else {
            host.split('.').all(|c| {
                let b = c.as_bytes();
                !b.is_empty()
                    && b[0].is_ascii_alphanumeric()
                    && b[b.len() - 1].is_ascii_alphanumeric()
                    && b.iter().all(|x| x.is_ascii_alphanumeric() || *x == b'-')
            })
        };
        if !host_ok {
            return Err(INVALID);
        }
    }
    for part in parts {
        if part.bytes().any(|b| b.is_ascii_uppercase()) {
            return Err("invalid reference format: repository name must be lowercase");
        }
        if !path_component_ok(part) {
            return Err(INVALID);
        }
    }
    Ok(())
}

/// A path component: `[a-z0-9]+` runs joined by `.`, `_`, `__` or one or more `-`.
fn path_component_ok(part: &str) -> bool {
    let b = part.as_bytes();
    let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    if b.is_empty() || !alnum(b[0]) || !alnum(b[b.len() - 1]) {
        return false;
    }
    let mut i = 0;
    while i < b.len() {
        if alnum(b[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && !alnum(b[i]) {
            i += 1;
        }
        let sep = &part[start..i];
        if !(sep == "." || sep == "_" || sep == "__" || sep.bytes().all(|c| c == b'-')) {
            return false;
        }
    }
    true
}

/// Makes sure the container's image is present and returns its references: `Always` pulls
/// every time, `IfNotPresent` pulls when ImageStatus finds nothing, `Never` only looks.
///
/// A pull asks `credentials` for the registry credentials of the image's repository
/// ([`crate::parsers::repository`]) and tries each in turn until one pulls; none:
/// an anonymous pull (kubelet's `PullImage` in `kuberuntime_image.go`). Errors: as
/// [`ImageError`]; a failed pull gives the runtime's message, or every attempt's as
/// `[first, second]` (kubelet's aggregate error), and a `credentials` error (a pull secret
/// that does not parse) fails the pull with its message. `report` hears each [`ImageStep`]
/// as it happens (an error is the caller's to report).
pub async fn ensure_image(
    cri: &impl ImageService,
    c: &Container,
    sandbox: &api::PodSandboxConfig,
    credentials: impl FnOnce(&str) -> Result<Vec<api::AuthConfig>, String>,
    mut report: impl FnMut(ImageStep),
) -> Result<EnsuredImage, ImageError> {
    let image = c.image.clone().unwrap_or_default();
    check_reference(&image).map_err(|message| ImageError::InvalidName {
        image: image.clone(),
        message: message.into(),
    })?;
    let policy = c.image_pull_policy.as_deref().unwrap_or("IfNotPresent");
    if policy != "Always" {
        let present = cri
            .image_status(&image)
            .await
            .map_err(|e| ImageError::Inspect {
                image: image.clone(),
                message: e.message,
            })?;
        if let Some(img) = present {
            let status_ref = img.repo_digests.first().unwrap_or(&img.id).clone();
            report(ImageStep::Present);
            return Ok(EnsuredImage {
                id: img.id,
                status_ref: Some(status_ref),
            });
        }
        if policy == "Never" {
            return Err(ImageError::NeverPull { image });
        }
    }
    let pull_error = |message| ImageError::Pull {
        image: image.clone(),
        message,
    };
    report(ImageStep::Pulling);
    let creds = credentials(&crate::parsers::repository(&image)).map_err(pull_error)?;
    tracing::info!(image = %image, credentials = creds.len(), "pulling image");
    let attempts: Vec<Option<api::AuthConfig>> = if creds.is_empty() {
        vec![None]
    } else {
        creds.into_iter().map(Some).collect()
    };
    let mut errors = Vec::new();
    for auth in attempts {
        match cri.pull_image(&image, auth, Some(sandbox.clone())).await {
            Ok(id) => {
                report(ImageStep::Pulled);
                return Ok(EnsuredImage {
                    id,
                    status_ref: None,
                });
            }
            Err(e) => errors.push(e.message),
        }
    }
    Err(pull_error(if errors.len() == 1 {
        errors.remove(0)
    } else {
        format!("[{}]", errors.join(", "))
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_references_are_checked_as_the_distribution_library_parses_them() {
        for ok in [
            "busybox",
            "busybox:1.36",
            "library/busybox:latest",
            "127.0.0.1:5000/busybox:1.36",
            "localhost/app",
            "localhost:5000/team/app_x.y__z--w:v1.2-rc_3",
            "Registry.Example.COM/app",
            "[::1]:5000/app",
            "[fe80::1]/app",
            "busybox@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            "a/b:tag@sha256:0123456789abcdef0123456789abcdef",
        ] {
            assert_eq!(check_reference(ok), Ok(()), "{ok}");
        }
        for (bad, why) in [
            ("UPPER", "lowercase"),
            ("team/App:1", "lowercase"),
            ("busybox:", "invalid reference format"),
            ("busybox:-x", "invalid reference format"),
            ("busybox:a b", "invalid reference format"),
            ("bad_.name", "invalid reference format"),
            ("-x", "invalid reference format"),
            ("a//b", "invalid reference format"),
            ("host:port/app", "invalid reference format"),
            ("[::1]x/app", "invalid reference format"),
            ("a:1:2/app", "invalid reference format"),
            ("busybox@sha256:abc", "invalid reference format"),
            (
                "busybox@:0123456789abcdef0123456789abcdef",
                "invalid reference format",
            ),
            (":1.0", "invalid reference format"),
            (
                "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
                "64-byte",
            ),
        ] {
            let e = check_reference(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
        assert!(check_reference(&"a".repeat(256))
            .unwrap_err()
            .contains("255"));
    }
}
