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
            Self::NeverPull { .. } => "ErrImageNeverPull",
            Self::Inspect { .. } => "ImageInspectError",
        }
    }
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

/// Makes sure the container's image is present and returns its references: `Always` pulls
/// every time, `IfNotPresent` pulls when ImageStatus finds nothing, `Never` only looks.
pub async fn ensure_image(
    cri: &impl ImageService,
    c: &Container,
    sandbox: &api::PodSandboxConfig,
) -> Result<EnsuredImage, ImageError> {
    let image = c.image.clone().unwrap_or_default();
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
            return Ok(EnsuredImage {
                id: img.id,
                status_ref: Some(status_ref),
            });
        }
        if policy == "Never" {
            return Err(ImageError::NeverPull { image });
        }
    }
    tracing::info!(image = %image, "pulling image");
    cri.pull_image(&image, Some(sandbox.clone()))
        .await
        .map(|id| EnsuredImage {
            id,
            status_ref: None,
        })
        .map_err(|e| ImageError::Pull {
            image,
            message: e.message,
        })
}
