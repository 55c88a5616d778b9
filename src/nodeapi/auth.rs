//! Who is asking, and may they (kubelet's `pkg/kubelet/server/auth.go` with the delegating
//! authenticator and authorizer it builds in `BuildAuth`).
//!
//! Authentication, in kubelet's order: an x509 client certificate that chains to
//! `authentication.x509.clientCAFile` with the client-auth usage (user = CN, groups = O); a bearer
//! token the API server vouches for through a `TokenReview` (`authentication.webhook.enabled`,
//! answers cached `cacheTTL`); anonymous (`authentication.anonymous.enabled`: user
//! `system:anonymous`, group `system:unauthenticated`). Anything else: 401 `Unauthorized`.
//!
//! Authorization: `AlwaysAllow`, or `Webhook`, a `SubjectAccessReview` per request (allowed
//! answers cached 5 minutes, denied 30 seconds: `cacheAuthorizedTTL`, `cacheUnauthorizedTTL`),
//! on kubelet's attributes ([`attributes`]); a denial is 403 naming user, verb, resource and
//! subresources as kubelet's message does.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use rustls_pki_types::{CertificateDer, TrustAnchor, UnixTime};

/// An authenticated user.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct User {
    /// The user name (a certificate's CN, the TokenReview's username, `system:anonymous`).
    pub name: String,
    /// Groups (a certificate's O values, the TokenReview's groups, `system:unauthenticated`).
    pub groups: Vec<String>,
}

/// The anonymous user (kubelet's, when `authentication.anonymous.enabled`).
pub fn anonymous() -> User {
    User {
        name: "system:anonymous".into(),
        groups: vec!["system:unauthenticated".into()],
    }
}

/// The verb and the subresources a request is authorized for (kubelet's
/// `GetRequestAttributes`, with the fine-grained `KubeletFineGrainedAuthz` subresources first):
/// the verb from the method (POST `create`, GET and HEAD `get`, PUT `update`, PATCH `patch`,
/// DELETE `delete`), resource `nodes`, name the node; the subresource from the path: `/pods`
/// and `/runningpods/` → `pods`, `/healthz` → `healthz`, `/configz` → `configz` (each then
/// `proxy`), `/stats` → `stats`, `/metrics` → `metrics`, `/logs` → `log`, `/checkpoint` →
/// `checkpoint`, anything else → `proxy`. A request is allowed when any of them is.
pub fn attributes(method: &str, path: &str) -> (&'static str, Vec<&'static str>) {
    let verb = match method {
        "POST" => "create",
        "PUT" => "update",
        "PATCH" => "patch",
        "DELETE" => "delete",
        _ => "get",
    };
    let under = |prefix: &str| {
        let p = prefix.trim_end_matches('/');
        path == p || path.starts_with(&format!("{p}/"))
    };
    let mut subresources = Vec::new();
    for (prefix, sub) in [
        ("/pods", "pods"),
        ("/runningpods", "pods"),
        ("/healthz", "healthz"),
        ("/configz", "configz"),
    ] {
        if under(prefix) {
            subresources.push(sub);
        }
    }
    let general = [
        ("/stats", "stats"),
        ("/metrics", "metrics"),
        ("/logs", "log"),
        ("/checkpoint", "checkpoint"),
    ]
    .into_iter()
    .find(|(prefix, _)| under(prefix))
    .map_or("proxy", |(_, sub)| sub);
    subresources.push(general);
    (verb, subresources)
}

/// kubelet's 403 message: `Forbidden (user=…, verb=…, resource=nodes, subresource(s)=[…])`.
pub fn forbidden_message(user: &User, verb: &str, subresources: &[&str]) -> String {
    format!(
        "Forbidden (user={}, verb={verb}, resource=nodes, subresource(s)=[{}])\n",
        user.name,
        subresources.join(" ")
    )
}

/// Why a request was not let through.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No method authenticated the request: 401.
    #[error("Unauthorized")]
    Unauthorized,
    /// Authenticated, not allowed: 403 with kubelet's message.
    #[error("{0}")]
    Forbidden(String),
    /// The API server could not be asked: 500.
    #[error("authorization error: {0}")]
    Failed(String),
}

/// The client-certificate authenticator: trust anchors from `clientCAFile`.
pub struct X509 {
    anchors: Vec<TrustAnchor<'static>>,
}

impl X509 {
    /// The authenticator for the CA certificates in PEM file `path`.
    ///
    /// Errors: the file cannot be read, holds no certificate, or one is not a CA kubelet could
    /// use; the message names the file.
    pub fn from_file(path: &std::path::Path) -> Result<Self, String> {
        use rustls_pki_types::pem::PemObject;
        let what = |e: &dyn std::fmt::Display| {
            format!("authentication.x509.clientCAFile {}: {e}", path.display())
        };
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
            .map_err(|e| what(&e))?
            .collect::<Result<_, _>>()
            .map_err(|e| what(&e))?;
        if certs.is_empty() {
            return Err(what(&"no certificate in the file"));
        }
        let anchors = certs
            .iter()
            .map(|c| {
                webpki::anchor_from_trusted_cert(c)
                    .map(|a| a.to_owned())
                    .map_err(|e| what(&e))
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { anchors })
    }

    /// The user of a client certificate chain (`chain[0]` the client's own) that chains to a
    /// trusted CA with the client-auth usage and is valid at `now`; `None` otherwise.
    pub fn authenticate(&self, chain: &[CertificateDer<'static>], now: UnixTime) -> Option<User> {
        let leaf = chain.first()?;
        let ee = webpki::EndEntityCert::try_from(leaf).ok()?;
        ee.verify_for_usage(
            webpki::ALL_VERIFICATION_ALGS,
            &self.anchors,
            &chain[1..],
            now,
            webpki::KeyUsage::client_auth(),
            None,
            None,
        )
        .ok()?;
        subject_user(leaf)
    }
}

/// CN and O values of a certificate's subject.
fn subject_user(cert: &CertificateDer<'_>) -> Option<User> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    let subject = parsed.subject();
    let name = subject
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())?
        .to_owned();
    let groups = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(str::to_owned))
        .collect();
    Some(User { name, groups })
}

/// Answers kept for a while, by key.
struct TtlCache<K, V> {
    entries: Mutex<HashMap<K, (V, Instant)>>,
}

/// Most answers a cache holds; past it, the expired ones go, then all.
const CACHE_ENTRIES: usize = 4096;

impl<K: std::hash::Hash + Eq + Clone, V: Clone> TtlCache<K, V> {
    fn new() -> Self {
        Self {
            entries: Mutex::new(HashMap::new()),
        }
    }

    fn get(&self, k: &K, now: Instant) -> Option<V> {
        let g = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        g.get(k)
            .filter(|(_, until)| *until > now)
            .map(|(v, _)| v.clone())
    }

    fn put(&self, k: K, v: V, until: Instant, now: Instant) {
        let mut g = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if g.len() >= CACHE_ENTRIES {
            g.retain(|_, (_, t)| *t > now);
            if g.len() >= CACHE_ENTRIES {
                g.clear();
            }
        }
        g.insert(k, (v, until));
    }
}

/// Posts review `obj` to the API server and returns its answer.
///
/// Errors: the request's, as a message.
async fn create<K>(api: kube::Api<K>, obj: &K) -> Result<K, String>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    api.create(&kube::api::PostParams::default(), obj)
        .await
        .map_err(|e| e.to_string())
}

/// Bearer tokens checked with the API server (`TokenReview`), answers cached `ttl`.
pub struct TokenWebhook {
    client: kube::Client,
    ttl: Duration,
    cache: TtlCache<String, Option<User>>,
}

impl TokenWebhook {
    /// Reviews through `client`, caching each answer `ttl` (`authentication.webhook.cacheTTL`).
    pub fn new(client: kube::Client, ttl: Duration) -> Self {
        Self {
            client,
            ttl,
            cache: TtlCache::new(),
        }
    }

    /// The user the API server says `token` belongs to; `None` when it is not authenticated.
    ///
    /// Errors: the review could not be made.
    pub async fn authenticate(&self, token: &str) -> Result<Option<User>, String> {
        let now = crate::clock::monotonic_now();
        if let Some(u) = self.cache.get(&token.to_owned(), now) {
            return Ok(u);
        }
        let api: kube::Api<TokenReview> = kube::Api::all(self.client.clone());
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_owned()),
                ..Default::default()
            },
            ..Default::default()
        };
        let answer = create(api, &review).await?;
        let user = answer
            .status
            .filter(|s| s.authenticated == Some(true))
            .and_then(|s| s.user)
            .and_then(|u| {
                Some(User {
                    name: u.username?,
                    groups: u.groups.unwrap_or_default(),
                })
            });
        self.cache
            .put(token.to_owned(), user.clone(), now + self.ttl, now);
        Ok(user)
    }
}

/// `SubjectAccessReview`s with the API server, answers cached.
pub struct SarWebhook {
    client: kube::Client,
    node_name: String,
    allowed_ttl: Duration,
    denied_ttl: Duration,
    cache: TtlCache<(User, &'static str, &'static str), bool>,
}

impl SarWebhook {
    /// Reviews through `client` for node `node_name`, allowed answers cached `allowed_ttl`
    /// (`authorization.webhook.cacheAuthorizedTTL`), denied ones `denied_ttl`
    /// (`cacheUnauthorizedTTL`).
    pub fn new(
        client: kube::Client,
        node_name: String,
        allowed_ttl: Duration,
        denied_ttl: Duration,
    ) -> Self {
        Self {
            client,
            node_name,
            allowed_ttl,
            denied_ttl,
            cache: TtlCache::new(),
        }
    }

    /// Whether `user` may `verb` `nodes/<subresource>` of this node.
    ///
    /// Errors: the review could not be made.
    pub async fn allowed(
        &self,
        user: &User,
        verb: &'static str,
        subresource: &'static str,
    ) -> Result<bool, String> {
        let now = crate::clock::monotonic_now();
        let key = (user.clone(), verb, subresource);
        if let Some(a) = self.cache.get(&key, now) {
            return Ok(a);
        }
        let api: kube::Api<SubjectAccessReview> = kube::Api::all(self.client.clone());
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.name.clone()),
                groups: Some(user.groups.clone()),
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(verb.into()),
                    resource: Some("nodes".into()),
                    subresource: Some(subresource.into()),
                    name: Some(self.node_name.clone()),
                    version: Some("v1".into()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let answer = create(api, &review).await?;
        let allowed = answer.status.is_some_and(|s| s.allowed);
        let ttl = if allowed {
            self.allowed_ttl
        } else {
            self.denied_ttl
        };
        self.cache.put(key, allowed, now + ttl, now);
        Ok(allowed)
    }
}

/// How requests are authenticated and authorized.
pub struct Auth {
    /// Client certificates, when `clientCAFile` is set.
    pub x509: Option<X509>,
    /// Bearer tokens, when the webhook is enabled and the node is in a cluster.
    pub tokens: Option<TokenWebhook>,
    /// Anonymous requests let through to authorization.
    pub anonymous: bool,
    /// `None`: AlwaysAllow.
    pub authorizer: Option<SarWebhook>,
}

impl Auth {
    /// The user of a request with client certificate chain `chain` (empty: none) and
    /// `Authorization` header `authorization`.
    ///
    /// Errors: [`AuthError::Unauthorized`].
    pub async fn authenticate(
        &self,
        chain: &[CertificateDer<'static>],
        authorization: Option<&str>,
    ) -> Result<User, AuthError> {
        if let Some(x) = &self.x509 {
            let now = UnixTime::since_unix_epoch(
                crate::clock::wall_now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default(),
            );
            if let Some(u) = x.authenticate(chain, now) {
                return Ok(u);
            }
        }
        let token = authorization
            .and_then(|h| h.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|t| !t.is_empty());
        if let (Some(t), Some(w)) = (token, &self.tokens) {
            match w.authenticate(t).await {
                Ok(Some(u)) => return Ok(u),
                Ok(None) => {}
                Err(e) => tracing::warn!(error = %e, "node API: TokenReview failed"),
            }
        }
        // kubelet's union authenticator: anonymous only when nothing was presented or
        // nothing presented was recognised.
        if self.anonymous {
            return Ok(anonymous());
        }
        Err(AuthError::Unauthorized)
    }

    /// Whether `user` may make a `method` request to `path`.
    ///
    /// Errors: [`AuthError::Forbidden`] with kubelet's message, [`AuthError::Failed`] when the
    /// API server could not be asked.
    pub async fn authorize(&self, user: &User, method: &str, path: &str) -> Result<(), AuthError> {
        let Some(sar) = &self.authorizer else {
            return Ok(());
        };
        let (verb, subresources) = attributes(method, path);
        for sub in &subresources {
            match sar.allowed(user, verb, sub).await {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(e) => return Err(AuthError::Failed(e)),
            }
        }
        Err(AuthError::Forbidden(forbidden_message(
            user,
            verb,
            &subresources,
        )))
    }
}

/// Shared [`Auth`].
pub type SharedAuth = Arc<Auth>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_follow_kubelets_mapping_fine_grained_first() {
        assert_eq!(attributes("GET", "/pods"), ("get", vec!["pods", "proxy"]));
        assert_eq!(
            attributes("GET", "/runningpods/"),
            ("get", vec!["pods", "proxy"])
        );
        assert_eq!(
            attributes("GET", "/healthz"),
            ("get", vec!["healthz", "proxy"])
        );
        assert_eq!(attributes("GET", "/stats/summary"), ("get", vec!["stats"]));
        assert_eq!(
            attributes("GET", "/metrics/cadvisor"),
            ("get", vec!["metrics"])
        );
        assert_eq!(
            attributes("POST", "/exec/default/p/c"),
            ("create", vec!["proxy"])
        );
        assert_eq!(
            attributes("GET", "/containerLogs/default/p/c"),
            ("get", vec!["proxy"])
        );
        assert_eq!(attributes("GET", "/logs/syslog"), ("get", vec!["log"]));
        assert_eq!(
            attributes("GET", "/podsx"),
            ("get", vec!["proxy"]),
            "a prefix is the path or a parent of it"
        );
    }

    #[test]
    fn a_denial_names_user_verb_and_subresources_as_kubelet() {
        let u = User {
            name: "alice".into(),
            groups: vec![],
        };
        assert_eq!(
            forbidden_message(&u, "get", &["pods", "proxy"]),
            "Forbidden (user=alice, verb=get, resource=nodes, subresource(s)=[pods proxy])\n"
        );
    }
}
