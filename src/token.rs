//! Service account tokens for projected `serviceAccountToken` volume sources (kubelet's
//! `pkg/kubelet/token` token manager and the projected volume's `getServiceAccountToken`).
//!
//! For each source of an API pod nodelet asks the API server for a token (`TokenRequest`, the
//! `token` subresource of the pod's ServiceAccount) bound to the pod (its name and UID), with the
//! source's `audience` (none: the API server's own audiences) and `expirationSeconds` (3600 when
//! absent, the API server's default). A token is kept per ServiceAccount, audience, lifetime and
//! pod, and asked for again at a pod sync once 80 % of its lifetime (the one the API server
//! gave, which may be less than asked) has passed or it is more than 24 hours old (kubelet's
//! `requiresRefresh`, without its random jitter of up to 10 s); pod syncs come at least every
//! `syncFrequency` (1m), and the API server refuses lifetimes under 10 minutes, so a token is
//! renewed well before it expires. While renewal fails (the API server away) the token in hand
//! serves until it expires; an API server's refusal is reported with its own message (kubelet's
//! `failed to fetch token: serviceaccounts "x" not found`). The node's credentials may ask only
//! for pods bound to the node (the Node authorizer); a static pod has no such binding, and its
//! `serviceAccountToken` sources are refused by validation.
//!
//! Only a node joined to a cluster has a client ([`TokenManager::set_client`]); without one a
//! request fails naming why.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock};

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};

/// A token is asked for again once it is this old, whatever its lifetime (kubelet's `maxTTL`).
pub const MAX_TTL_SECONDS: i64 = 24 * 3600;

/// `expirationSeconds` when a source gives none (the API server's default).
pub const DEFAULT_EXPIRATION_SECONDS: i64 = 3600;

/// What a `serviceAccountToken` source asks for: its audience (empty: the API server's) and
/// lifetime in seconds.
pub type TokenSpec = (String, i64);

/// The tokens of one pod, by what they were asked for.
pub type PodTokens = BTreeMap<TokenSpec, String>;

/// Every `serviceAccountToken` source of `pod`'s projected volumes, as [`TokenSpec`]s.
pub fn token_specs(pod: &Pod) -> Vec<TokenSpec> {
    let mut out: Vec<TokenSpec> = pod
        .spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter_map(|v| v.projected.as_ref())
        .flat_map(|p| p.sources.iter().flatten())
        .filter_map(|s| s.service_account_token.as_ref())
        .map(|t| {
            (
                t.audience.clone().unwrap_or_default(),
                t.expiration_seconds.unwrap_or(DEFAULT_EXPIRATION_SECONDS),
            )
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The name of `pod`'s first volume with a `serviceAccountToken` source (what a failure to have
/// a token is reported on).
pub fn first_token_volume(pod: &Pod) -> Option<String> {
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .find(|v| {
            v.projected
                .iter()
                .flat_map(|p| p.sources.iter().flatten())
                .any(|s| s.service_account_token.is_some())
        })
        .map(|v| v.name.clone())
}

/// Whether a token that expires at `expires` (seconds since the epoch) after a lifetime of
/// `lifetime` seconds is to be asked for again at `now`: more than [`MAX_TTL_SECONDS`] since it
/// was issued, or within the last 20 % of its lifetime (kubelet's `requiresRefresh`).
pub fn requires_refresh(expires: i64, lifetime: i64, now: i64) -> bool {
    let issued = expires - lifetime;
    now > issued + MAX_TTL_SECONDS || now > expires - lifetime * 20 / 100
}

#[derive(Clone, PartialEq, Eq, Hash)]
struct Key {
    namespace: String,
    service_account: String,
    spec: TokenSpec,
    pod_uid: String,
}

struct Issued {
    token: String,
    /// Seconds since the epoch.
    expires: i64,
    /// The lifetime the API server gave, seconds (its answer's `expirationSeconds`: less than
    /// asked where it caps lifetimes, `--service-account-max-token-expiration`).
    lifetime: i64,
}

/// The tokens asked for and not yet due for renewal, and the client to ask with. Cheap to clone;
/// the pod workers are its users (each for its own pod), the agent sets its client once.
#[derive(Clone, Default)]
pub struct TokenManager {
    client: Arc<OnceLock<kube::Client>>,
    cache: Arc<Mutex<HashMap<Key, Issued>>>,
}

impl TokenManager {
    /// The API client tokens are asked with (cluster mode); set once, at start.
    pub fn set_client(&self, client: kube::Client) {
        let _ = self.client.set(client);
    }

    /// The tokens of `pod`'s `serviceAccountToken` sources at `now` (seconds since the epoch):
    /// kept ones while they are not due ([`requires_refresh`]), new ones asked for otherwise.
    ///
    /// Errors: kubelet's `failed to fetch token: …` with the API server's answer, or that the
    /// node has no API server to ask.
    pub async fn pod_tokens(&self, pod: &Pod, now: i64) -> Result<PodTokens, String> {
        let specs = token_specs(pod);
        let mut out = PodTokens::new();
        if specs.is_empty() {
            return Ok(out);
        }
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let spec = pod.spec.as_ref();
        let service_account = spec
            .and_then(|s| s.service_account_name.clone())
            .or_else(|| spec.and_then(|s| s.service_account.clone()))
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| "default".into());
        let pod_uid = crate::pod::pod_uid(pod).to_owned();
        for ts in specs {
            let key = Key {
                namespace: namespace.clone(),
                service_account: service_account.clone(),
                spec: ts.clone(),
                pod_uid: pod_uid.clone(),
            };
            let kept = self
                .lock()
                .get(&key)
                .map(|i| (i.token.clone(), i.expires, i.lifetime));
            let token = match kept {
                Some((t, expires, lifetime)) if !requires_refresh(expires, lifetime, now) => t,
                _ => match self.request(pod, &key).await {
                    Ok(issued) => {
                        let token = issued.token.clone();
                        self.lock().insert(key, issued);
                        token
                    }
                    // Renewal failed (the API server away): the token in hand serves until it
                    // expires, as kubelet's.
                    Err(e) => match kept {
                        Some((t, expires, _)) if now < expires => {
                            tracing::warn!(pod = ?pod.metadata.name, uid = %pod_uid, error = %e, "cannot renew a service account token; the current one serves until it expires");
                            t
                        }
                        Some(_) => {
                            return Err(format!(
                                "token for service account {}/{} expired and refresh failed: {e}",
                                key.namespace, key.service_account
                            ))
                        }
                        None => return Err(e),
                    },
                },
            };
            out.insert(ts, token);
        }
        Ok(out)
    }

    /// Drops the tokens kept for the pod with UID `uid` (it is gone).
    pub fn forget_pod(&self, uid: &str) {
        self.lock().retain(|k, _| k.pod_uid != uid);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Issued>> {
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn request(&self, pod: &Pod, key: &Key) -> Result<Issued, String> {
        let Some(client) = self.client.get() else {
            return Err(
                "failed to fetch token: no API server (the node is not joined to a cluster)".into(),
            );
        };
        let (audience, lifetime) = &key.spec;
        let tr = TokenRequest {
            spec: TokenRequestSpec {
                audiences: if audience.is_empty() {
                    Vec::new()
                } else {
                    vec![audience.clone()]
                },
                expiration_seconds: Some(*lifetime),
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: pod.metadata.name.clone(),
                    uid: Some(key.pod_uid.clone()),
                }),
            },
            ..Default::default()
        };
        let api: kube::Api<ServiceAccount> = kube::Api::namespaced(client.clone(), &key.namespace);
        let answer = api
            .create_token_request(&key.service_account, &Default::default(), &tr)
            .await
            .map_err(|e| match e {
                // The API server's own message, as kubelet reports it
                // (`serviceaccounts "x" not found`).
                kube::Error::Api(status) => format!("failed to fetch token: {}", status.message),
                e => format!("failed to fetch token: {e}"),
            })?;
        let status = answer
            .status
            .ok_or("failed to fetch token: the API server's answer has no status")?;
        Ok(Issued {
            token: status.token,
            expires: status.expiration_timestamp.0.as_second(),
            lifetime: answer.spec.expiration_seconds.unwrap_or(*lifetime),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_renewed_in_the_last_fifth_of_its_life_or_after_a_day() {
        // An hour's token issued at 0: kept until 48 minutes, renewed after.
        assert!(!requires_refresh(3600, 3600, 0));
        assert!(!requires_refresh(3600, 3600, 2880));
        assert!(requires_refresh(3600, 3600, 2881));
        // A week's token: renewed after a day, long before its last fifth.
        let week = 7 * 24 * 3600;
        assert!(!requires_refresh(week, week, MAX_TTL_SECONDS));
        assert!(requires_refresh(week, week, MAX_TTL_SECONDS + 1));
    }

    #[test]
    fn the_sources_of_every_projected_volume_are_asked_for_once_each() {
        let pod: Pod = serde_yaml::from_str(
            "metadata: {name: p}\nspec:\n  containers: []\n  volumes:\n  - name: a\n    projected:\n      sources:\n      - serviceAccountToken: {path: t}\n      - serviceAccountToken: {path: u, audience: vault, expirationSeconds: 600}\n  - name: b\n    projected:\n      sources:\n      - serviceAccountToken: {path: t}\n      - configMap: {name: c}\n",
        )
        .unwrap();
        assert_eq!(
            token_specs(&pod),
            vec![(String::new(), 3600), ("vault".to_string(), 600)]
        );
    }

    #[test]
    fn a_token_due_but_not_renewable_serves_until_it_expires() {
        let pod: Pod = serde_yaml::from_str(
            "metadata: {name: p, namespace: ns, uid: u1}\nspec:\n  containers: []\n  volumes:\n  - name: a\n    projected: {sources: [{serviceAccountToken: {path: t, expirationSeconds: 600}}]}\n",
        )
        .unwrap();
        // No client: every renewal fails.
        let m = TokenManager::default();
        m.lock().insert(
            Key {
                namespace: "ns".into(),
                service_account: "default".into(),
                spec: (String::new(), 600),
                pod_uid: "u1".into(),
            },
            Issued {
                token: "old".into(),
                expires: 1600,
                lifetime: 600,
            },
        );
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let at = |now| rt.block_on(m.pod_tokens(&pod, now));
        // Not due yet, then due (past 80 %) but unexpired: the token in hand.
        assert_eq!(at(1000).unwrap()[&(String::new(), 600)], "old");
        assert_eq!(at(1500).unwrap()[&(String::new(), 600)], "old");
        // Expired.
        let e = at(1600).unwrap_err();
        assert!(e.contains("expired and refresh failed"), "{e}");
        m.forget_pod("u1");
        assert!(at(1000).unwrap_err().starts_with("failed to fetch token"));
    }

    #[test]
    fn without_a_client_the_failure_says_why() {
        let pod: Pod = serde_yaml::from_str(
            "metadata: {name: p, namespace: ns, uid: u1}\nspec:\n  containers: []\n  volumes:\n  - name: a\n    projected: {sources: [{serviceAccountToken: {path: t}}]}\n",
        )
        .unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let e = rt
            .block_on(TokenManager::default().pod_tokens(&pod, 0))
            .unwrap_err();
        assert!(e.starts_with("failed to fetch token: no API server"), "{e}");
        assert!(rt
            .block_on(TokenManager::default().pod_tokens(&Pod::default(), 0))
            .unwrap()
            .is_empty());
    }
}
