//! Registry credentials for image pulls (kubelet's `pkg/credentialprovider`: the docker keyring,
//! and `credentialprovider/secrets.MakeDockerKeyring` for a pod's `imagePullSecrets`).
//!
//! A pod's pull credentials come from the Secrets its `spec.imagePullSecrets` names (kubelet's
//! `getPullSecretsForPod`), read from the API server for an API pod and from the `kind: Secret`
//! documents of `staticPodPath` for a static pod, then from the node's own docker config file,
//! `<root-dir>/config.json` (kubelet's `--root-dir` config.json). A Secret's `.dockerconfigjson`
//! key (`{"auths": {"<registry>": {…}}}`) or `.dockercfg` key (`{"<registry>": {…}}`) gives
//! entries of `username`, `password` and `auth` (base64 of `username:password`, which wins).
//! kubelet reads only Secrets of the types `kubernetes.io/dockerconfigjson` and
//! `kubernetes.io/dockercfg`, which the API server makes hold those keys; nodelet's object store
//! keeps no type, so a Secret of another type holding such a key is read too.
//!
//! Each entry's registry (`registry.example:5000`, `https://registry.example/v2/`,
//! `*.example.com/team`) becomes a key of host and path (scheme dropped, a leading `/v1` or
//! `/v2` of the path too); the image's repository (`docker.io/library/busybox` for `busybox:1.36`)
//! matches a key whose port is the same, whose host has as many dot-separated parts, each
//! matching as a shell glob, and whose path is a prefix of the repository's path (kubelet's
//! `URLsMatch`). Every matching key's credentials are tried, the most specific key first (keys
//! in reverse lexical order); an entry for `index.docker.io` serves Docker Hub images when no
//! key matched. The pod's credentials come before the node's. [`crate::kuberuntime::image`]
//! pulls with each in turn until one succeeds, and without any when none matched. A docker
//! config that does not parse is reported by the kind and place of its fault, never quoting it:
//! its values are passwords.

use std::collections::BTreeMap;
use std::path::Path;

use base64::Engine as _;

use crate::cri::api::AuthConfig;

/// The Secret key of a docker config JSON (`kubernetes.io/dockerconfigjson`).
pub const DOCKER_CONFIG_JSON_KEY: &str = ".dockerconfigjson";

/// The Secret key of a legacy dockercfg (`kubernetes.io/dockercfg`).
pub const DOCKERCFG_KEY: &str = ".dockercfg";

/// Docker Hub's credential key, used for Docker Hub images when no other key matched.
const DEFAULT_REGISTRY_HOST: &str = "index.docker.io";

/// One entry of a docker config, as the file gives it.
#[derive(Debug, Default, serde::Deserialize)]
struct Entry {
    #[serde(default)]
    username: String,
    #[serde(default)]
    password: String,
    #[serde(default)]
    auth: String,
}

/// A `.dockerconfigjson` document: the entries under `auths`.
#[derive(Debug, Default, serde::Deserialize)]
struct ConfigJson {
    #[serde(default)]
    auths: BTreeMap<String, Entry>,
}

/// Credentials by registry key (host, or host and path), each key's in the order added.
/// Iterated in reverse key order, so `registry.example/team` comes before `registry.example`
/// (kubelet's `BasicDockerKeyring` and its reverse-sorted index).
#[derive(Debug, Default, Clone)]
pub struct DockerKeyring {
    creds: BTreeMap<String, Vec<AuthConfig>>,
}

impl DockerKeyring {
    /// Adds the entries of a `.dockerconfigjson` document (`{"auths": {…}}`).
    ///
    /// Errors: the JSON is not such a document, or an `auth` is not base64 of
    /// `username:password` (kubelet fails the pull with its decoding error too).
    pub fn add_config_json(&mut self, bytes: &[u8]) -> Result<(), String> {
        let doc: ConfigJson = serde_json::from_slice(bytes).map_err(|e| parse_error(&e))?;
        self.add(doc.auths)
    }

    /// Adds the entries of a legacy `.dockercfg` document (`{"<registry>": {…}}`).
    ///
    /// Errors: as [`DockerKeyring::add_config_json`].
    pub fn add_dockercfg(&mut self, bytes: &[u8]) -> Result<(), String> {
        let doc: BTreeMap<String, Entry> =
            serde_json::from_slice(bytes).map_err(|e| parse_error(&e))?;
        self.add(doc)
    }

    fn add(&mut self, entries: BTreeMap<String, Entry>) -> Result<(), String> {
        let mut parsed = Vec::new();
        for (registry, entry) in entries {
            let (username, password) = if entry.auth.is_empty() {
                (entry.username, entry.password)
            } else {
                decode_auth(&entry.auth).map_err(|e| format!("registry {registry:?}: {e}"))?
            };
            // An entry whose registry is not a URL is skipped, as kubelet skips it.
            if let Some(key) = registry_key(&registry) {
                parsed.push((key, username, password));
            }
        }
        for (key, username, password) in parsed {
            self.creds.entry(key).or_default().push(AuthConfig {
                username,
                password,
                ..Default::default()
            });
        }
        Ok(())
    }

    /// Whether the keyring holds no credentials.
    pub fn is_empty(&self) -> bool {
        self.creds.is_empty()
    }

    /// The credentials for `repository` (an image name without tag or digest, normalised:
    /// [`crate::parsers::repository`]), most specific key first; Docker Hub's when nothing else matched and the
    /// image is on Docker Hub. Empty: pull without credentials.
    pub fn lookup(&self, repository: &str) -> Vec<AuthConfig> {
        let found: Vec<AuthConfig> = self
            .creds
            .iter()
            .rev()
            .filter(|(key, _)| urls_match(key, repository))
            .flat_map(|(_, c)| c.iter().cloned())
            .collect();
        if found.is_empty() && is_default_registry_match(repository) {
            return self
                .creds
                .get(DEFAULT_REGISTRY_HOST)
                .cloned()
                .unwrap_or_default();
        }
        found
    }
}

/// Why a docker config does not parse, by the kind of fault and where it is, never with the
/// text at fault: serde_json's own messages quote the value (`invalid type: string "…"`), which
/// in a docker config is a password or its base64 (Go's decoder, kubelet's, names the type
/// only).
fn parse_error(e: &serde_json::Error) -> String {
    use serde_json::error::Category;
    let what = match e.classify() {
        Category::Syntax => "is not valid JSON",
        Category::Eof => "ends too soon",
        Category::Data => "has a value of the wrong type",
        Category::Io => "cannot be read",
    };
    format!(
        "the docker config {what} at line {} column {}",
        e.line(),
        e.column()
    )
}

/// `auth`: base64 (padded or not) of `username:password`.
fn decode_auth(field: &str) -> Result<(String, String), String> {
    let engine = if field.trim().ends_with('=') {
        &base64::engine::general_purpose::STANDARD
    } else {
        &base64::engine::general_purpose::STANDARD_NO_PAD
    };
    let decoded = engine
        .decode(field)
        .map_err(|_| "auth is not base64".to_owned())?;
    let text = String::from_utf8_lossy(&decoded);
    text.split_once(':')
        .map(|(u, p)| (u.to_owned(), p.to_owned()))
        .ok_or_else(|| {
            "unable to parse auth field, must be formatted as base64(username:password)".into()
        })
}

/// A config entry's registry as a key: host (with port), and the path unless it is empty or
/// `/` (a leading `/v1/` or `/v2/` counts as the root). `None` when it has no host.
fn registry_key(registry: &str) -> Option<String> {
    let rest = registry
        .strip_prefix("https://")
        .or_else(|| registry.strip_prefix("http://"))
        .unwrap_or(registry);
    let (host, path) = split_host_path(rest);
    if host.is_empty() || host.contains(char::is_whitespace) {
        return None;
    }
    let path = path
        .strip_prefix("/v2/")
        .or_else(|| path.strip_prefix("/v1/"))
        .map(|p| format!("/{p}"))
        .unwrap_or_else(|| path.to_owned());
    Some(if path.is_empty() || path == "/" {
        host.to_owned()
    } else {
        format!("{host}{path}")
    })
}

/// `host[:port]/path?query#fragment` → (host with port, without user info; path).
fn split_host_path(s: &str) -> (&str, &str) {
    let s = s.split(['?', '#']).next().unwrap_or_default();
    let (authority, path) = match s.find('/') {
        Some(i) => (&s[..i], &s[i..]),
        None => (s, ""),
    };
    let host = authority.rsplit('@').next().unwrap_or_default();
    (host, path)
}

/// Whether `target` (a repository) falls under `glob` (a key): same port, same number of host
/// parts each matching as a glob, and the key's path a prefix of the target's (kubelet's
/// `URLsMatch`).
fn urls_match(glob: &str, target: &str) -> bool {
    let (glob_host, glob_path) = split_host_path(glob);
    let (target_host, target_path) = split_host_path(target);
    let (glob_parts, glob_port) = host_parts(glob_host);
    let (target_parts, target_port) = host_parts(target_host);
    glob_port == target_port
        && glob_parts.len() == target_parts.len()
        && target_path.starts_with(glob_path)
        && glob_parts
            .iter()
            .zip(&target_parts)
            .all(|(g, t)| glob_match(g.as_bytes(), t.as_bytes()))
}

/// A host's dot-separated parts and its port (empty when none).
fn host_parts(host: &str) -> (Vec<&str>, &str) {
    let (name, port) = match host.rsplit_once(':') {
        Some((n, p)) if !n.contains(':') || n.ends_with(']') => (n, p),
        _ => (host, ""),
    };
    (name.split('.').collect(), port)
}

/// Shell glob match of one host part (Go's `filepath.Match`): `*` any run of characters, `?`
/// one, `[a-z]`/`[^a-z]` a class, `\x` the character x. A malformed pattern matches nothing.
fn glob_match(pattern: &[u8], text: &[u8]) -> bool {
    match pattern.first() {
        None => text.is_empty(),
        Some(b'*') => (0..=text.len()).any(|i| glob_match(&pattern[1..], &text[i..])),
        Some(b'?') => !text.is_empty() && glob_match(&pattern[1..], &text[1..]),
        Some(b'[') => {
            let Some((&c, rest)) = text.split_first() else {
                return false;
            };
            match class_match(&pattern[1..], c) {
                Some((matched, after)) => matched && glob_match(after, rest),
                None => false,
            }
        }
        Some(b'\\') => match (pattern.get(1), text.split_first()) {
            (Some(p), Some((c, rest))) => p == c && glob_match(&pattern[2..], rest),
            _ => false,
        },
        Some(p) => text.first() == Some(p) && glob_match(&pattern[1..], &text[1..]),
    }
}

/// Matches `c` against the class that starts `pattern` (after its `[`): whether it matched and
/// the pattern after the closing `]`; `None` when the class is malformed.
fn class_match(pattern: &[u8], c: u8) -> Option<(bool, &[u8])> {
    let (negated, mut p) = match pattern.first() {
        Some(b'^') => (true, &pattern[1..]),
        _ => (false, pattern),
    };
    let mut matched = false;
    let mut first = true;
    loop {
        match p.first()? {
            b']' if !first => return Some((matched != negated, &p[1..])),
            _ => {}
        }
        first = false;
        let lo = take_class_char(&mut p)?;
        let hi = if p.first() == Some(&b'-') && p.get(1).is_some_and(|&x| x != b']') {
            p = &p[1..];
            take_class_char(&mut p)?
        } else {
            lo
        };
        if lo <= c && c <= hi {
            matched = true;
        }
    }
}

fn take_class_char(p: &mut &[u8]) -> Option<u8> {
    let (&c, rest) = p.split_first()?;
    if c == b'\\' {
        let (&e, rest) = rest.split_first()?;
        *p = rest;
        return Some(e);
    }
    *p = rest;
    Some(c)
}

/// Whether `repository` is on Docker Hub: no registry host in its first component, or
/// `docker.io`/`index.docker.io` (kubelet's `isDefaultRegistryMatch`).
fn is_default_registry_match(repository: &str) -> bool {
    match repository.split_once('/') {
        _ if repository.is_empty() || repository.starts_with('/') => false,
        None => true,
        Some(("docker.io" | "index.docker.io", _)) => true,
        Some((first, _)) => !first.contains(['.', ':']),
    }
}

/// What a pod's `imagePullSecrets` give: their keyring, and the names of those that could not
/// be read (absent, or without a docker config key).
#[derive(Debug, Default)]
pub struct PullSecrets {
    /// The credentials of the Secrets that were read.
    pub keyring: DockerKeyring,
    /// Secrets named but not found (kubelet's `FailedToRetrieveImagePullSecret` names them).
    pub missing: Vec<String>,
}

/// The keyring of `names` (a pod's `imagePullSecrets`, empty names skipped as kubelet skips
/// them) from `lookup` (the Secret's data by name, in the pod's namespace).
///
/// Errors: a Secret's docker config does not parse, naming the Secret.
pub fn pull_secrets<'a, D>(
    names: impl IntoIterator<Item = &'a str>,
    lookup: impl Fn(&str) -> Option<D>,
) -> Result<PullSecrets, String>
where
    D: std::ops::Deref<Target = crate::objects::Data>,
{
    let mut out = PullSecrets::default();
    for name in names.into_iter().filter(|n| !n.is_empty()) {
        let Some(data) = lookup(name) else {
            out.missing.push(name.to_owned());
            continue;
        };
        let read = if let Some(b) = data.get(DOCKER_CONFIG_JSON_KEY) {
            out.keyring.add_config_json(b)
        } else if let Some(b) = data.get(DOCKERCFG_KEY) {
            out.keyring.add_dockercfg(b)
        } else {
            // kubelet passes such a Secret on and finds no credentials in it.
            Ok(())
        };
        read.map_err(|e| format!("image pull secret {name:?}: {e}"))?;
    }
    Ok(out)
}

/// The node's credentials: `<root_dir>/config.json` (a docker config file, `{"auths": …}`),
/// read at each pull. A missing file gives none; one that does not parse gives none with a
/// warning naming it (kubelet logs and pulls without it too).
pub fn node_keyring(root_dir: &Path) -> DockerKeyring {
    let path = root_dir.join("config.json");
    let mut keyring = DockerKeyring::default();
    match std::fs::read(&path) {
        Ok(bytes) => {
            if let Err(e) = keyring.add_config_json(&bytes) {
                tracing::warn!(file = %path.display(), error = %e, "ignoring the node's registry credentials: the file does not parse");
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            tracing::warn!(file = %path.display(), error = %e, "ignoring the node's registry credentials: the file cannot be read");
        }
    }
    keyring
}

#[cfg(test)]
mod tests {
    use super::*;

    fn users(creds: &[AuthConfig]) -> Vec<&str> {
        creds.iter().map(|c| c.username.as_str()).collect()
    }

    fn b64(s: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(s)
    }

    #[test]
    fn keys_drop_scheme_and_api_version_and_keep_paths() {
        for (registry, key) in [
            ("registry.example", Some("registry.example")),
            ("https://registry.example/", Some("registry.example")),
            (
                "http://registry.example:5000/v2/",
                Some("registry.example:5000"),
            ),
            ("https://index.docker.io/v1/", Some("index.docker.io")),
            ("registry.example/team", Some("registry.example/team")),
            (
                "https://registry.example/v2/team",
                Some("registry.example/team"),
            ),
            (
                "https://user@registry.example?x=1",
                Some("registry.example"),
            ),
            ("", None),
        ] {
            assert_eq!(registry_key(registry).as_deref(), key, "{registry}");
        }
    }

    #[test]
    fn urls_match_as_kubelets_keyring_matches() {
        for (glob, target, want) in [
            ("registry.example", "registry.example/team/app", true),
            ("registry.example", "other.example/team/app", false),
            ("*.example", "registry.example/app", true),
            ("*.example", "a.registry.example/app", false),
            ("*.example", "example/app", false),
            ("registry.example:5000", "registry.example:5000/app", true),
            ("registry.example:5000", "registry.example/app", false),
            ("registry.example", "registry.example:5000/app", false),
            ("registry.example/team", "registry.example/team/app", true),
            ("registry.example/team", "registry.example/other/app", false),
            ("r*y.ex*", "registry.example/app", true),
            ("r*x.example", "registry.example/app", false),
            ("127.0.0.1:5001", "127.0.0.1:5001/library/busybox", true),
            ("[bad.example", "[bad.example/app", false),
        ] {
            assert_eq!(urls_match(glob, target), want, "{glob} ~ {target}");
        }
    }

    #[test]
    fn host_parts_match_as_shell_globs() {
        for (glob, text, want) in [
            ("reg?stry", "registry", true),
            ("ex[a-c]mple", "example", true),
            ("ex[^a-c]mple", "example", false),
            ("ex[^b]mple", "example", true),
            ("a\\*", "a*", true),
            ("a\\*", "ab", false),
            ("[bad", "b", false),
        ] {
            assert_eq!(
                glob_match(glob.as_bytes(), text.as_bytes()),
                want,
                "{glob} ~ {text}"
            );
        }
    }

    #[test]
    fn the_most_specific_key_comes_first_and_docker_hub_is_the_fallback() {
        let mut k = DockerKeyring::default();
        k.add_config_json(
            br#"{"auths": {
                "registry.example": {"username": "host", "password": "p"},
                "registry.example/team": {"auth": "dGVhbTpwOnE="},
                "https://index.docker.io/v1/": {"username": "hub", "password": "h"}
            }}"#,
        )
        .unwrap();
        // `auth` wins and splits at the first colon: team / p:q.
        let team = k.lookup("registry.example/team/app");
        assert_eq!(users(&team), ["team", "host"]);
        assert_eq!(team[0].password, "p:q");
        assert_eq!(users(&k.lookup("registry.example/other")), ["host"]);
        assert_eq!(users(&k.lookup("docker.io/library/busybox")), ["hub"]);
        assert!(k.lookup("elsewhere.example/app").is_empty());
    }

    #[test]
    fn secrets_are_read_by_key_missing_ones_are_named_and_bad_ones_refused() {
        let data = |key: &str, value: String| {
            let mut d = crate::objects::Data::new();
            d.insert(key.to_owned(), value.into_bytes());
            std::sync::Arc::new(d)
        };
        let json = data(
            DOCKER_CONFIG_JSON_KEY,
            format!(
                r#"{{"auths": {{"a.example": {{"auth": "{}"}}}}}}"#,
                b64("ann:pw")
            ),
        );
        let cfg = data(
            DOCKERCFG_KEY,
            r#"{"a.example": {"username": "bob", "password": "pw"}}"#.into(),
        );
        let opaque = data("token", "x".into());
        let lookup = |name: &str| match name {
            "json" => Some(json.clone()),
            "cfg" => Some(cfg.clone()),
            "opaque" => Some(opaque.clone()),
            _ => None,
        };
        let got = pull_secrets(["json", "", "gone", "cfg", "opaque"], lookup).unwrap();
        assert_eq!(got.missing, ["gone"]);
        assert_eq!(users(&got.keyring.lookup("a.example/app")), ["ann", "bob"]);

        let broken = data(DOCKER_CONFIG_JSON_KEY, "{not json".into());
        let err = pull_secrets(["broken"], |_| Some(broken.clone())).unwrap_err();
        assert!(err.starts_with("image pull secret \"broken\": "), "{err}");
        let bad_auth = data(
            DOCKER_CONFIG_JSON_KEY,
            format!(
                r#"{{"auths": {{"a.example": {{"auth": "{}"}}}}}}"#,
                b64("nocolon")
            ),
        );
        let err = pull_secrets(["s"], |_| Some(bad_auth.clone())).unwrap_err();
        assert!(
            err.contains("must be formatted as base64(username:password)"),
            "{err}"
        );
        // Unpadded base64 is read too.
        let unpadded = data(
            DOCKER_CONFIG_JSON_KEY,
            format!(
                r#"{{"auths": {{"a.example": {{"auth": "{}"}}}}}}"#,
                b64("u:pw").trim_end_matches('=')
            ),
        );
        let got = pull_secrets(["s"], |_| Some(unpadded.clone())).unwrap();
        assert_eq!(users(&got.keyring.lookup("a.example/x")), ["u"]);
    }

    /// A docker config of the wrong shape is refused without quoting it: the values there are
    /// passwords (from a bad-input pass: serde_json's messages quoted them into statuses,
    /// events and logs).
    #[test]
    fn parse_errors_never_quote_the_config() {
        const SECRET: &str = "bm9kZWxldDpyZWdpc3RyeS1wYXNz";
        for doc in [
            format!(r#"{{"auths": {{"r.example": "{SECRET}"}}}}"#),
            format!(r#"{{"auths": "{SECRET}"}}"#),
            format!(r#"["{SECRET}"]"#),
            format!(
                r#"{{"auths": {{"r.example": {{"username": "u", "password": 12345678, "x": "{SECRET}"}}}}}}"#
            ),
            format!(r#"{{"auths": {{"r.example": {{"auth": "{SECRET}!"}}}}}}"#),
            format!("{{\"auths\": {{\"{SECRET}"),
        ] {
            let err = DockerKeyring::default()
                .add_config_json(doc.as_bytes())
                .unwrap_err();
            assert!(!err.contains(SECRET) && !err.contains("12345678"), "{err}");
            assert!(err.len() < 120, "{err}");
        }
        let err = DockerKeyring::default()
            .add_config_json(br#"{"auths": {"r.example": "x"}}"#)
            .unwrap_err();
        assert_eq!(
            err,
            "the docker config has a value of the wrong type at line 1 column 27"
        );
    }

    #[test]
    fn the_node_file_is_optional_and_a_broken_one_gives_nothing() {
        let dir = tempfile::tempdir().unwrap();
        assert!(node_keyring(dir.path()).is_empty());
        std::fs::write(dir.path().join("config.json"), "{broken").unwrap();
        assert!(node_keyring(dir.path()).is_empty());
        std::fs::write(
            dir.path().join("config.json"),
            r#"{"auths": {"n.example": {"username": "node", "password": "pw"}}}"#,
        )
        .unwrap();
        assert_eq!(
            users(&node_keyring(dir.path()).lookup("n.example/app")),
            ["node"]
        );
    }
}
