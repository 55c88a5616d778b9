//! AppArmor admission (kubelet's `AppArmorAdmitHandler` with `apparmor.Validator`): a pod that
//! asks for an AppArmor profile other than `Unconfined` (the `appArmorProfile` field of the pod
//! or a container, or the deprecated `container.apparmor.security.beta.kubernetes.io/<name>`
//! annotation) is refused on a host without AppArmor, with kubelet's reason `AppArmor` and
//! message `Cannot enforce AppArmor: AppArmor is not enabled on the host`. On a host with
//! AppArmor the profile goes to the runtime
//! ([`crate::kuberuntime::security_context::apparmor_profile`]).

use k8s_openapi::api::core::v1::Pod;

use super::Rejection;

use crate::pod::APPARMOR_ANNOTATION_PREFIX as ANNOTATION_PREFIX;

/// True when the kernel has AppArmor enabled (`/sys/module/apparmor/parameters/enabled` is
/// `Y`, as kubelet's `IsEnabled` reads it). Read once per process, as kubelet's validator checks
/// the host once when it is built (a module parameter does not change while the node runs).
pub fn host_enabled() -> bool {
    static ENABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ENABLED.get_or_init(|| {
        std::fs::read_to_string("/sys/module/apparmor/parameters/enabled")
            .is_ok_and(|s| s.trim_start().starts_with('Y'))
    })
}

/// kubelet's `isRequired`: some profile other than Unconfined is asked for.
pub fn required(pod: &Pod) -> bool {
    let spec = pod.spec.as_ref();
    let confined = |t: &str| t != "Unconfined";
    let pod_field = spec
        .and_then(|s| s.security_context.as_ref())
        .and_then(|s| s.app_armor_profile.as_ref())
        .is_some_and(|p| confined(&p.type_));
    let container_field = spec.is_some_and(|s| {
        s.init_containers
            .iter()
            .flatten()
            .chain(s.containers.iter())
            .any(|c| {
                c.security_context
                    .as_ref()
                    .and_then(|s| s.app_armor_profile.as_ref())
                    .is_some_and(|p| confined(&p.type_))
            })
    });
    let annotation = pod
        .metadata
        .annotations
        .iter()
        .flatten()
        .any(|(k, v)| k.starts_with(ANNOTATION_PREFIX) && v != "unconfined");
    pod_field || container_field || annotation
}

/// The refusal of `pod` on a host where AppArmor is `enabled` or not.
pub fn admit(pod: &Pod, enabled: bool) -> Option<Rejection> {
    (required(pod) && !enabled).then(|| Rejection {
        reason: "AppArmor".into(),
        message: "Cannot enforce AppArmor: AppArmor is not enabled on the host".into(),
    })
}

/// Validates AppArmor settings as the API server does: a field's `type` is RuntimeDefault,
/// Unconfined or Localhost (which needs `localhostProfile`); an annotation names a container of
/// the pod and holds `runtime/default`, `unconfined` or `localhost/<profile>`.
///
/// Errors: `(field, reason)`.
pub fn validate(pod: &Pod) -> Result<(), (String, String)> {
    let Some(spec) = pod.spec.as_ref() else {
        return Ok(());
    };
    let check = |at: String, p: &k8s_openapi::api::core::v1::AppArmorProfile| match p.type_.as_str()
    {
        "RuntimeDefault" | "Unconfined" if p.localhost_profile.is_some() => Err((
            format!("{at}.localhostProfile"),
            "may only be set for a Localhost profile".into(),
        )),
        "RuntimeDefault" | "Unconfined" => Ok(()),
        "Localhost"
            if p.localhost_profile
                .as_deref()
                .is_some_and(|l| !l.is_empty()) =>
        {
            Ok(())
        }
        "Localhost" => Err((
            format!("{at}.localhostProfile"),
            "is required for a Localhost profile".into(),
        )),
        _ => Err((
            format!("{at}.type"),
            "must be RuntimeDefault, Unconfined or Localhost".into(),
        )),
    };
    if let Some(p) = spec
        .security_context
        .as_ref()
        .and_then(|s| s.app_armor_profile.as_ref())
    {
        check("spec.securityContext.appArmorProfile".into(), p)?;
    }
    let init = spec.init_containers.as_deref().unwrap_or(&[]);
    for (list, containers) in [
        ("spec.initContainers", init),
        ("spec.containers", &spec.containers[..]),
    ] {
        for (i, c) in containers.iter().enumerate() {
            if let Some(p) = c
                .security_context
                .as_ref()
                .and_then(|s| s.app_armor_profile.as_ref())
            {
                check(format!("{list}[{i}].securityContext.appArmorProfile"), p)?;
            }
        }
    }
    for (k, v) in pod.metadata.annotations.iter().flatten() {
        let Some(name) = k.strip_prefix(ANNOTATION_PREFIX) else {
            continue;
        };
        let at = format!("metadata.annotations[{k}]");
        if !init
            .iter()
            .chain(spec.containers.iter())
            .any(|c| c.name == name)
        {
            return Err((at, format!("{name:?} is not a container of the pod")));
        }
        let ok = v == "runtime/default"
            || v == "unconfined"
            || v.strip_prefix("localhost/").is_some_and(|p| !p.is_empty());
        if !ok {
            return Err((
                at,
                "must be runtime/default, unconfined or localhost/<profile>".into(),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(yaml: &str) -> Pod {
        serde_yaml::from_str(yaml).unwrap()
    }

    #[test]
    fn confined_profiles_are_refused_where_the_host_has_no_apparmor() {
        let runtime_default = pod("metadata: {name: p}\nspec: {containers: [{name: c, image: b, securityContext: {appArmorProfile: {type: RuntimeDefault}}}]}");
        let unconfined = pod("metadata: {name: p}\nspec: {securityContext: {appArmorProfile: {type: Unconfined}}, containers: [{name: c, image: b}]}");
        let annotated = pod("metadata: {name: p, annotations: {container.apparmor.security.beta.kubernetes.io/c: localhost/mine}}\nspec: {containers: [{name: c, image: b}]}");
        let none = pod("metadata: {name: p}\nspec: {containers: [{name: c, image: b}]}");
        let r = admit(&runtime_default, false).unwrap();
        assert_eq!(
            (r.reason.as_str(), r.message.as_str()),
            (
                "AppArmor",
                "Cannot enforce AppArmor: AppArmor is not enabled on the host"
            )
        );
        assert!(admit(&annotated, false).is_some());
        assert!(admit(&unconfined, false).is_none());
        assert!(admit(&none, false).is_none());
        assert!(admit(&runtime_default, true).is_none());
    }

    #[test]
    fn bad_profiles_are_refused_naming_the_field() {
        for (yaml, field) in [
            ("metadata: {name: p}\nspec: {containers: [{name: c, image: b, securityContext: {appArmorProfile: {type: Localhost}}}]}", "spec.containers[0].securityContext.appArmorProfile.localhostProfile"),
            ("metadata: {name: p}\nspec: {securityContext: {appArmorProfile: {type: Strict}}, containers: [{name: c, image: b}]}", "spec.securityContext.appArmorProfile.type"),
            ("metadata: {name: p, annotations: {container.apparmor.security.beta.kubernetes.io/x: runtime/default}}\nspec: {containers: [{name: c, image: b}]}", "metadata.annotations[container.apparmor.security.beta.kubernetes.io/x]"),
            ("metadata: {name: p, annotations: {container.apparmor.security.beta.kubernetes.io/c: strict}}\nspec: {containers: [{name: c, image: b}]}", "metadata.annotations[container.apparmor.security.beta.kubernetes.io/c]"),
        ] {
            assert_eq!(validate(&pod(yaml)).unwrap_err().0, field);
        }
    }
}
