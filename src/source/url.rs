//! The HTTP pod source (kubelet's `pkg/kubelet/config/http.go`, `staticPodURL`): the body at a
//! URL, fetched every `httpCheckFrequency` with the `staticPodURLHeader` headers, is one pod
//! manifest or a `PodList` (YAML or JSON). Its pods are static pods as those of `staticPodPath`
//! are: the same decoding, validation and defaults (name `<name>-<nodeName>`, namespace
//! `default`, a UID derived from the URL, namespace and name), annotation
//! `kubernetes.io/config.source: http`, mirror pods in cluster mode.
//!
//! As kubelet: a fetch that fails (unreachable, a status other than 200, a body nodelet cannot
//! decode) changes nothing, the pods run on; an empty body means no pods. Each distinct failure
//! is reported once (log, event naming the URL, `nodelet_static_pod_manifest_errors_total`)
//! until a fetch succeeds; the URL shown there has no user, password or query ([`redacted`]).
//! Bodies above [`MAX_BODY_BYTES`] are refused. ConfigMap and Secret
//! documents are served from `staticPodPath` only: a body holding one is refused.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use tracing::{info, warn};

use super::manifest::decode_manifest;
use super::mux::{SourceMsg, SourceSender};
use super::ManifestError;
use crate::events::Recorder;
use crate::metrics::Metrics;
use crate::pod::CONFIG_SOURCE_ANNOTATION;

/// The source's name (kubelet's `HTTPSource`).
pub const SOURCE: &str = "http";

/// Longest body read, bytes.
pub const MAX_BODY_BYTES: usize = 16 << 20;

/// Timeout of one fetch (kubelet's HTTP source client uses 10 s).
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(10);

fn invalid(url: &str, field: &str, reason: &str) -> ManifestError {
    ManifestError::Invalid {
        file: url.to_owned(),
        error: super::validation::FieldError {
            field: field.into(),
            value: String::new(),
            reason: reason.into(),
        },
    }
}

/// What one body fetched from the URL defines.
#[derive(Debug, Default)]
pub struct Body {
    /// The pods, with the static pod defaults and `config.source: http`.
    pub pods: Vec<Pod>,
    /// Paths of the fields that the v1 Pod API (or, for a list, `PodList`) does not have, as
    /// [`Manifest::unknown_fields`](super::manifest::Manifest::unknown_fields) gives them, a
    /// list's items prefixed `items[i].`: dropped by decoding, named in a warning by [`run`].
    pub unknown_fields: Vec<String>,
}

/// The pods of one body fetched from `url` for node `node_name`: a pod manifest, or a `PodList`
/// (`kind: PodList` or `List`) whose `items` are pods; each decoded and given the static pod
/// defaults ([`decode_manifest`]) with `config.source: http`.
///
/// Errors: those of [`decode_manifest`] for the body or an item (named `items[i]`), and
/// [`ManifestError::Invalid`] for a body that holds ConfigMaps or Secrets or no pod, or a list
/// that names one pod twice. An empty body is no pods.
pub fn decode(url: &str, body: &[u8], node_name: &str) -> Result<Body, ManifestError> {
    if body.iter().all(|b| b.is_ascii_whitespace()) {
        return Ok(Body::default());
    }
    let file = Path::new(url);
    crate::yaml::check_nesting(body).map_err(|message| ManifestError::Parse {
        file: url.to_owned(),
        message,
    })?;
    // A list is told by its kind; anything else is decoded as a manifest.
    let list: Option<serde_yaml::Value> = serde_yaml::from_slice::<serde_yaml::Value>(body)
        .ok()
        .filter(|v| {
            v.get("kind")
                .and_then(|k| k.as_str())
                .is_some_and(|k| k == "PodList" || k == "List")
        });
    let mut pods = Vec::new();
    let mut unknown_fields = Vec::new();
    match list {
        Some(v) => {
            if let serde_yaml::Value::Mapping(m) = &v {
                unknown_fields.extend(
                    m.keys()
                        .filter_map(|k| k.as_str())
                        .filter(|k| !["apiVersion", "kind", "metadata", "items"].contains(k))
                        .map(str::to_owned),
                );
            }
            let items = match v.get("items") {
                Some(serde_yaml::Value::Sequence(items)) => items.clone(),
                // No pods: a list with no items, as the apiserver writes one.
                None | Some(serde_yaml::Value::Null) => Vec::new(),
                Some(_) => return Err(invalid(url, "items", "must be a list of pods")),
            };
            for (i, mut item) in items.into_iter().enumerate() {
                // A list's items may leave out their kind (the apiserver's PodList does).
                if let serde_yaml::Value::Mapping(m) = &mut item {
                    for (k, v) in [("apiVersion", "v1"), ("kind", "Pod")] {
                        if !m.contains_key(k) {
                            m.insert(k.into(), v.into());
                        }
                    }
                }
                let text = serde_yaml::to_string(&item).map_err(|e| ManifestError::Parse {
                    file: url.to_owned(),
                    message: format!("items[{i}]: {e}"),
                })?;
                let m = decode_manifest(file, text.as_bytes(), node_name).map_err(|e| {
                    ManifestError::Parse {
                        file: url.to_owned(),
                        message: format!("items[{i}]: {e}"),
                    }
                })?;
                unknown_fields.extend(m.unknown_fields.iter().map(|f| format!("items[{i}].{f}")));
                match (m.pod, m.objects.is_empty()) {
                    (Some(p), true) => pods.push(p),
                    _ => {
                        return Err(invalid(
                            url,
                            &format!("items[{i}].kind"),
                            "a PodList from staticPodURL holds pods only",
                        ))
                    }
                }
            }
        }
        None => {
            let m = decode_manifest(file, body, node_name)?;
            if !m.objects.is_empty() {
                return Err(invalid(
                    url,
                    "kind",
                    "ConfigMap and Secret documents are served from staticPodPath only",
                ));
            }
            pods.extend(m.pod);
            unknown_fields = m.unknown_fields;
            if pods.is_empty() {
                return Err(invalid(url, "kind", "the body defines no Pod"));
            }
        }
    }
    let mut seen = std::collections::HashSet::new();
    for p in &mut pods {
        if !seen.insert(crate::pod::pod_uid(p).to_owned()) {
            return Err(invalid(
                url,
                "metadata.name",
                &format!(
                    "pod {} is defined twice",
                    p.metadata.name.as_deref().unwrap_or_default()
                ),
            ));
        }
        p.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(CONFIG_SOURCE_ANNOTATION.into(), SOURCE.into());
    }
    Ok(Body {
        pods,
        unknown_fields,
    })
}

/// `url` as logs and events show it: without user, password and query (they may hold
/// credentials).
pub fn redacted(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(mut u) => {
            let _ = u.set_username("");
            let _ = u.set_password(None);
            u.set_query(None);
            u.to_string()
        }
        Err(_) => "<staticPodURL>".into(),
    }
}

/// Why a fetch changed nothing: the message and the reason for the metric.
type Refusal = (String, &'static str);

/// What one fetch came to.
enum Fetched {
    /// A 200 with this body.
    Body(Vec<u8>),
    /// Anything else, with its message and reason for the metric.
    Failed(String, &'static str),
}

/// GETs `url`; messages name it as `shown` (without credentials), and quote no URL of
/// reqwest's (a redirect's target could hold some).
async fn fetch(
    client: &reqwest::Client,
    url: &str,
    shown: &str,
    headers: &[(String, String)],
) -> Fetched {
    let mut req = client.get(url);
    for (k, v) in headers {
        req = req.header(k, v);
    }
    let mut resp = match req.send().await {
        Ok(r) => r,
        Err(e) => {
            return Fetched::Failed(format!("{shown}: {}", cause(e, FETCH_TIMEOUT)), "ReadError")
        }
    };
    if resp.status() != reqwest::StatusCode::OK {
        return Fetched::Failed(format!("{shown}: {}", resp.status()), "ReadError");
    }
    let mut body = Vec::new();
    loop {
        match resp.chunk().await {
            Ok(Some(c)) => {
                if body.len() + c.len() > MAX_BODY_BYTES {
                    return Fetched::Failed(
                        format!("{shown}: body larger than {MAX_BODY_BYTES} bytes"),
                        "ReadError",
                    );
                }
                body.extend_from_slice(&c);
            }
            Ok(None) => return Fetched::Body(body),
            Err(e) => {
                return Fetched::Failed(
                    format!("{shown}: {}", cause(e, FETCH_TIMEOUT)),
                    "ReadError",
                )
            }
        }
    }
}

/// A failed request as the operator can act on it: the whole chain of causes (reqwest's own
/// message is only "error sending request" or "error decoding response body"), a timeout named
/// with the client's `limit` ([`FETCH_TIMEOUT`]), and no URL (a redirect's target could hold
/// credentials).
fn cause(e: reqwest::Error, limit: Duration) -> String {
    let e = e.without_url();
    let mut out = if e.is_timeout() {
        format!("no complete answer within {limit:?} ({e})")
    } else {
        e.to_string()
    };
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

/// Warns (log and a Warning event `UnknownField` on `url:<shown>`) of the fields a body has that
/// the v1 Pod API does not: its pods run without them, as kubelet's non-strict decoding runs
/// them, but a misspelling is named rather than dropped silently. Called once per body decoded,
/// so once per content of the URL (as the file source warns once per content of a file).
fn report_unknown_fields(fields: &[String], shown: &str, recorder: &Recorder) {
    if fields.is_empty() {
        return;
    }
    let list = fields.join(", ");
    warn!(url = %shown, fields = %list, "HTTP pod source: the body has fields the v1 Pod API does not have; they are ignored");
    recorder.warning(
        format!("url:{shown}"),
        "UnknownField",
        format!("{shown}: unknown field(s), ignored (misspelled?): {list}"),
    );
}

/// Fetches `url` every `period` until the task is dropped, sending the HTTP source's pods to
/// `config` (the mux) when a body decodes and differs from the last one.
pub async fn run(
    url: String,
    headers: Vec<(String, String)>,
    period: Duration,
    node_name: String,
    config: SourceSender,
    recorder: Recorder,
    metrics: Arc<Metrics>,
) {
    let client = match reqwest::Client::builder().timeout(FETCH_TIMEOUT).build() {
        Ok(c) => c,
        Err(e) => {
            warn!(url = %redacted(&url), error = %e, "HTTP pod source: cannot build a client; no pods from the URL");
            return;
        }
    };
    // The body last decoded, and what came of it (an error is not decoded again).
    let mut last_body: Option<(Vec<u8>, Option<Refusal>)> = None;
    let mut last_error: Option<String> = None;
    let shown = redacted(&url);
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let outcome = match fetch(&client, &url, &shown, &headers).await {
            Fetched::Body(body) if last_body.as_ref().is_some_and(|(b, _)| *b == body) => {
                match last_body.as_ref().and_then(|(_, e)| e.clone()) {
                    Some(e) => Err(e),
                    None => Ok(None),
                }
            }
            Fetched::Body(body) => {
                // Decoding up to 16 MiB is CPU work: off the runtime's threads.
                let (u, n, b) = (shown.clone(), node_name.clone(), body.clone());
                let decoded = tokio::task::spawn_blocking(move || decode(&u, &b, &n))
                    .await
                    .unwrap_or_else(|e| {
                        Err(ManifestError::Parse {
                            file: shown.clone(),
                            message: format!("decoding failed: {e}"),
                        })
                    });
                match decoded {
                    Ok(decoded) => {
                        last_body = Some((body, None));
                        report_unknown_fields(&decoded.unknown_fields, &shown, &recorder);
                        Ok(Some(decoded.pods))
                    }
                    Err(e) => {
                        let err = (e.to_string(), e.reason());
                        last_body = Some((body, Some(err.clone())));
                        Err(err)
                    }
                }
            }
            Fetched::Failed(message, reason) => Err((message, reason)),
        };
        match outcome {
            Ok(pods) => {
                if last_error.take().is_some() {
                    info!(url = %shown, "HTTP pod source: fetched again");
                }
                if let Some(pods) = pods {
                    let pods = pods.into_iter().map(Arc::new).collect();
                    if !config.send(SourceMsg::Snapshot(pods)).await {
                        return;
                    }
                }
            }
            Err((message, reason)) => {
                if last_error.as_deref() != Some(message.as_str()) {
                    warn!(url = %shown, reason, error = %message, "HTTP pod source: fetch refused; the pods from it run on");
                    recorder.warning(format!("url:{shown}"), reason, message.clone());
                    metrics.manifest_error(reason);
                    last_error = Some(message);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const URL: &str = "http://127.0.0.1:1/pods";

    /// A fetch's failure says why: the refused connection, or the time limit, not only
    /// "error sending request".
    #[tokio::test]
    async fn a_failed_fetch_names_its_cause() {
        let refused = reqwest::Client::new().get(URL).send().await.unwrap_err();
        let m = cause(refused, FETCH_TIMEOUT);
        assert!(m.contains("Connection refused"), "{m}");
        assert!(!m.contains("127.0.0.1:1"), "no URL: {m}");
        // A server that takes the request and never answers.
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/pods", silent.local_addr().unwrap());
        let limit = Duration::from_millis(200);
        let client = reqwest::Client::builder().timeout(limit).build().unwrap();
        let timed_out = client.get(&url).send().await.unwrap_err();
        let m = cause(timed_out, limit);
        assert!(m.starts_with("no complete answer within 200ms"), "{m}");
        drop(silent);
    }

    fn pod(name: &str) -> String {
        format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  containers:\n  - {{name: c, image: busybox:1.36}}\n")
    }

    #[test]
    fn one_pod_or_a_list_becomes_static_pods_of_the_http_source() {
        let one = decode(URL, pod("a").as_bytes(), "n1").unwrap().pods;
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].metadata.name.as_deref(), Some("a-n1"));
        let ann = one[0].metadata.annotations.as_ref().unwrap();
        assert_eq!(ann[CONFIG_SOURCE_ANNOTATION], "http");
        assert!(crate::pod::is_static_pod(&one[0]));

        let list = format!(
            "{{\"apiVersion\": \"v1\", \"kind\": \"PodList\", \"items\": [{}, {}]}}",
            serde_json::to_string(&serde_yaml::from_str::<serde_json::Value>(&pod("a")).unwrap())
                .unwrap(),
            serde_json::to_string(&serde_yaml::from_str::<serde_json::Value>(&pod("b")).unwrap())
                .unwrap(),
        );
        let pods = decode(URL, list.as_bytes(), "n1").unwrap().pods;
        let names: Vec<_> = pods
            .iter()
            .map(|p| p.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(names, ["a-n1", "b-n1"]);
        assert_eq!(
            pods[0].metadata.uid, one[0].metadata.uid,
            "the same pod, the same UID, alone or in a list"
        );
        assert!(
            decode(URL, b"  \n", "n1").unwrap().pods.is_empty(),
            "empty: no pods"
        );
    }

    #[test]
    fn bad_bodies_are_refused_with_the_place_named() {
        let e = decode(URL, b"kind: [", "n1").unwrap_err();
        assert_eq!(e.reason(), "DecodeError");
        let list = "apiVersion: v1\nkind: PodList\nitems:\n- {apiVersion: v1, kind: Pod, metadata: {name: a}, spec: {containers: []}}\n";
        let e = decode(URL, list.as_bytes(), "n1").unwrap_err().to_string();
        assert!(e.contains("items[0]"), "{e}");
        let twice = "apiVersion: v1\nkind: PodList\nitems:\n- {apiVersion: v1, kind: Pod, metadata: {name: a}, spec: {containers: [{name: c, image: busybox}]}}\n- {apiVersion: v1, kind: Pod, metadata: {name: a}, spec: {containers: [{name: c, image: busybox}]}}\n";
        let e = decode(URL, twice.as_bytes(), "n1").unwrap_err().to_string();
        assert!(e.contains("defined twice"), "{e}");
        let with_cm = format!(
            "{}---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: c}}\ndata: {{k: v}}\n",
            pod("a")
        );
        let e = decode(URL, with_cm.as_bytes(), "n1")
            .unwrap_err()
            .to_string();
        assert!(e.contains("staticPodPath only"), "{e}");
        let e = decode(URL, pod("../x").as_bytes(), "n1").unwrap_err();
        assert_eq!(e.reason(), "InvalidManifest");
        let e = decode(URL, b"kind: PodList\nitems: {a: b}\n", "n1")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("must be a list"),
            "a malformed list is no empty list: {e}"
        );
        assert!(decode(URL, b"kind: PodList\nitems: null\n", "n1")
            .unwrap()
            .pods
            .is_empty());
    }

    #[test]
    fn list_items_may_leave_out_their_kind_and_urls_lose_their_credentials() {
        let list = "kind: PodList\napiVersion: v1\nitems:\n- {metadata: {name: a}, spec: {containers: [{name: c, image: busybox}]}}\n";
        assert_eq!(decode(URL, list.as_bytes(), "n1").unwrap().pods.len(), 1);
        assert_eq!(
            redacted("https://user:pw@host:8443/pods?token=s3cret"),
            "https://host:8443/pods"
        );
    }

    #[test]
    fn fields_the_pod_api_does_not_have_are_named_with_their_item() {
        let typo = pod("a").replace(
            "image: busybox:1.36",
            "image: busybox:1.36, imagePullPolicyy: Always",
        );
        let one = decode(URL, typo.as_bytes(), "n1").unwrap();
        assert_eq!(one.unknown_fields, ["spec.containers[0].imagePullPolicyy"]);
        assert_eq!(one.pods.len(), 1, "the pod runs without the field");
        assert_eq!(
            one.pods[0].spec.as_ref().unwrap().containers[0]
                .image_pull_policy
                .as_deref(),
            Some("IfNotPresent"),
            "the default, not the misspelled Always"
        );

        let list = "apiVersion: v1\nkind: PodList\nitemz: []\nitems:\n- {metadata: {name: a}, spec: {containers: [{name: c, image: busybox}]}}\n- {metadata: {name: b, lables: {x: y}}, spec: {containers: [{name: c, image: busybox}]}}\n";
        let two = decode(URL, list.as_bytes(), "n1").unwrap();
        assert_eq!(two.unknown_fields, ["itemz", "items[1].metadata.lables"]);
        assert_eq!(two.pods.len(), 2);
        assert!(decode(URL, pod("a").as_bytes(), "n1")
            .unwrap()
            .unknown_fields
            .is_empty());
    }
}
