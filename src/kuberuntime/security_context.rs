//! Security contexts to CRI (kubelet's `kuberuntime_container_linux.go` and
//! `security_context.go`): the container's settings over the pod's, as
//! `LinuxContainerSecurityContext`. Fields nodelet cannot enforce refuse the pod (validation),
//! so that isolation is never silently weaker than the manifest asks.

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};

use crate::cri::api;

/// The settings that kubelet resolves container-over-pod, as CRI fields: run as user/group,
/// supplemental groups (with `fsGroup`), capabilities, `no_new_privs`, seccomp.
/// `seccomp_root` is where `Localhost` profiles live (`<root-dir>/seccomp`).
pub fn apply(
    pod: &Pod,
    c: &Container,
    seccomp_root: &std::path::Path,
    sc: &mut api::LinuxContainerSecurityContext,
) {
    let csc = c.security_context.as_ref();
    let psc = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
    if let Some(caps) = csc.and_then(|s| s.capabilities.as_ref()) {
        sc.capabilities = Some(api::Capability {
            add_capabilities: caps.add.clone().unwrap_or_default(),
            drop_capabilities: caps.drop.clone().unwrap_or_default(),
            ..Default::default()
        });
    }
    // kubelet's AddNoNewPrivileges: only an explicit false sets no_new_privs.
    sc.no_new_privs = csc
        .and_then(|s| s.allow_privilege_escalation)
        .is_some_and(|allow| !allow);
    let mut groups: Vec<i64> = psc
        .and_then(|s| s.supplemental_groups.clone())
        .unwrap_or_default();
    if let Some(g) = psc.and_then(|s| s.fs_group) {
        if !groups.contains(&g) {
            groups.push(g);
        }
    }
    sc.supplemental_groups = groups;
    let profile = csc
        .and_then(|s| s.seccomp_profile.as_ref())
        .or_else(|| psc.and_then(|s| s.seccomp_profile.as_ref()));
    // Without a profile kubelet runs Unconfined (SeccompDefault off), and so does nodelet.
    sc.seccomp = Some(match profile.map(|p| p.type_.as_str()) {
        Some("RuntimeDefault") => api::SecurityProfile {
            profile_type: api::security_profile::ProfileType::RuntimeDefault as i32,
            ..Default::default()
        },
        Some("Localhost") => api::SecurityProfile {
            profile_type: api::security_profile::ProfileType::Localhost as i32,
            localhost_ref: seccomp_root
                .join(
                    profile
                        .and_then(|p| p.localhost_profile.as_deref())
                        .unwrap_or(""),
                )
                .display()
                .to_string(),
        },
        _ => api::SecurityProfile {
            profile_type: api::security_profile::ProfileType::Unconfined as i32,
            ..Default::default()
        },
    });
}

/// The AppArmor profile of container `c` for the runtime (kubelet's `getAppArmorProfile` with
/// `apparmor.GetProfile`): the container's `appArmorProfile` field, else the deprecated
/// per-container annotation (static pods may carry only that), else the pod's field. `None`
/// when none is set: the runtime then applies its own default, which a runtime that cannot load
/// profiles (containerd without `apparmor_parser`) skips, where an explicit `RuntimeDefault`
/// would fail every container with "apparmor is not supported". `None` also on a host without
/// AppArmor (where admission lets only unconfined pods in, see [`crate::admission::apparmor`]).
pub fn apparmor_profile(
    pod: &Pod,
    c: &Container,
    enabled: bool,
) -> Option<crate::cri::api::SecurityProfile> {
    use crate::cri::api::security_profile::ProfileType;
    if !enabled {
        return None;
    }
    let field = |p: &k8s_openapi::api::core::v1::AppArmorProfile| {
        (
            p.type_.clone(),
            p.localhost_profile.clone().unwrap_or_default(),
        )
    };
    let container_field = c
        .security_context
        .as_ref()
        .and_then(|s| s.app_armor_profile.as_ref())
        .map(field);
    let pod_field = || {
        pod.spec
            .as_ref()
            .and_then(|s| s.security_context.as_ref())
            .and_then(|s| s.app_armor_profile.as_ref())
            .map(field)
    };
    let annotation = || {
        let v = pod.metadata.annotations.as_ref()?.get(&format!(
            "{}{}",
            crate::pod::APPARMOR_ANNOTATION_PREFIX,
            c.name
        ))?;
        Some(match v.as_str() {
            "unconfined" => ("Unconfined".to_owned(), String::new()),
            "runtime/default" => ("RuntimeDefault".to_owned(), String::new()),
            other => (
                "Localhost".to_owned(),
                other.strip_prefix("localhost/").unwrap_or(other).to_owned(),
            ),
        })
    };
    let (kind, localhost) = container_field.or_else(annotation).or_else(pod_field)?;
    let profile_type = match kind.as_str() {
        "Unconfined" => ProfileType::Unconfined,
        "Localhost" => ProfileType::Localhost,
        _ => ProfileType::RuntimeDefault,
    };
    Some(crate::cri::api::SecurityProfile {
        profile_type: profile_type as i32,
        localhost_ref: localhost,
    })
}

/// `runAsNonRoot` of the container over the pod's.
pub fn run_as_non_root(pod: &Pod, c: &Container) -> bool {
    c.security_context
        .as_ref()
        .and_then(|s| s.run_as_non_root)
        .or_else(|| {
            pod.spec
                .as_ref()
                .and_then(|s| s.security_context.as_ref())
                .and_then(|s| s.run_as_non_root)
        })
        .unwrap_or(false)
}

/// kubelet's `verifyRunAsNonRoot`: with `runAsNonRoot`, the user the container will run as
/// (`run_as_user`, else the image's uid or user name) must be known and not root.
///
/// Errors: kubelet's message.
pub fn verify_run_as_non_root(
    pod: &Pod,
    c: &Container,
    run_as_user: Option<i64>,
    image_uid: Option<i64>,
    image_user: &str,
) -> Result<(), String> {
    if !run_as_non_root(pod, c) {
        return Ok(());
    }
    let who = format!(
        "(pod: {:?}, container: {})",
        crate::pod::pod_ref(pod),
        c.name
    );
    match (run_as_user, image_uid) {
        (Some(0), _) => Err(format!("container's runAsUser breaks non-root policy {who}")),
        (Some(_), _) => Ok(()),
        (None, Some(0)) => Err(format!("container has runAsNonRoot and image will run as root {who}")),
        (None, Some(_)) => Ok(()),
        (None, None) if image_user.is_empty() || image_user == "root" => Err(format!(
            "container has runAsNonRoot and image will run as root {who}"
        )),
        (None, None) => Err(format!(
            "container has runAsNonRoot and image has non-numeric user ({image_user}), cannot verify user is non-root {who}"
        )),
    }
}

/// The largest user or group ID the API server accepts (`IsValidUserID`/`IsValidGroupID`:
/// 0 to 2^31-1).
pub const MAX_ID: i64 = i32::MAX as i64;

/// Refuses an ID outside 0..=[`MAX_ID`] as the API server's `ValidateSecurityContext` does (a
/// larger one would be cut to 32 bits on its way to the runtime, a negative one fails in runc
/// with no field named). Errors: `(field, reason)`.
fn id_ok(field: String, id: Option<i64>) -> Result<(), (String, String)> {
    match id {
        Some(id) if !(0..=MAX_ID).contains(&id) => Err((
            field,
            format!("{id}: must be between 0 and {MAX_ID}, inclusive"),
        )),
        _ => Ok(()),
    }
}

/// Refuses the security settings nodelet does not enforce yet, naming the field: SELinux
/// options, `procMount: Unmasked`, user namespaces (`hostUsers: false`),
/// `supplementalGroupsPolicy: Strict` (nodelet does not pass the policy to the runtime yet, so
/// the groups of the image's `/etc/group` would be added), and a Localhost seccomp profile
/// without its path; and user and group
/// IDs (`runAsUser`, `runAsGroup`, `fsGroup`, `supplementalGroups`) outside 0..=[`MAX_ID`], as
/// the API server refuses them. (AppArmor: [`crate::admission::apparmor`].)
///
/// Errors: `(field, reason)`.
pub fn validate(spec: &PodSpec) -> Result<(), (String, String)> {
    let no = |field: String, what: &str| {
        Err((field, format!("{what} is not supported by nodelet yet; the pod is refused rather than run with weaker isolation")))
    };
    if let Some(psc) = &spec.security_context {
        let at = "spec.securityContext";
        if psc.se_linux_options.is_some() {
            return no(format!("{at}.seLinuxOptions"), "SELinux");
        }
        if let Some(p) = &psc.seccomp_profile {
            seccomp_ok(&format!("{at}.seccompProfile"), p)?;
        }
        match psc.supplemental_groups_policy.as_deref() {
            None | Some("Merge") => {}
            Some("Strict") => {
                return no(
                    format!("{at}.supplementalGroupsPolicy"),
                    "supplementalGroupsPolicy Strict",
                )
            }
            Some(other) => {
                return Err((
                    format!("{at}.supplementalGroupsPolicy"),
                    format!("{other:?}: must be Merge or Strict"),
                ))
            }
        }
        id_ok(format!("{at}.runAsUser"), psc.run_as_user)?;
        id_ok(format!("{at}.runAsGroup"), psc.run_as_group)?;
        id_ok(format!("{at}.fsGroup"), psc.fs_group)?;
        for (i, g) in psc.supplemental_groups.iter().flatten().enumerate() {
            id_ok(format!("{at}.supplementalGroups[{i}]"), Some(*g))?;
        }
    }
    if spec.host_users == Some(false) {
        return no("spec.hostUsers".into(), "a user namespace");
    }
    let init = spec.init_containers.as_deref().unwrap_or(&[]);
    for (list, containers) in [
        ("spec.initContainers", init),
        ("spec.containers", &spec.containers[..]),
    ] {
        for (i, c) in containers.iter().enumerate() {
            let Some(sc) = &c.security_context else {
                continue;
            };
            let at = format!("{list}[{i}].securityContext");
            if sc.se_linux_options.is_some() {
                return no(format!("{at}.seLinuxOptions"), "SELinux");
            }
            id_ok(format!("{at}.runAsUser"), sc.run_as_user)?;
            id_ok(format!("{at}.runAsGroup"), sc.run_as_group)?;
            if sc.proc_mount.as_deref().is_some_and(|m| m != "Default") {
                return no(format!("{at}.procMount"), "an unmasked /proc");
            }
            if let Some(p) = &sc.seccomp_profile {
                seccomp_ok(&format!("{at}.seccompProfile"), p)?;
            }
            if sc.privileged == Some(true) && sc.allow_privilege_escalation == Some(false) {
                return Err((
                    format!("{at}.allowPrivilegeEscalation"),
                    "cannot set allowPrivilegeEscalation to false and privileged to true".into(),
                ));
            }
        }
    }
    Ok(())
}

fn seccomp_ok(
    at: &str,
    p: &k8s_openapi::api::core::v1::SeccompProfile,
) -> Result<(), (String, String)> {
    match p.type_.as_str() {
        "RuntimeDefault" | "Unconfined" => Ok(()),
        "Localhost" => match p.localhost_profile.as_deref() {
            Some(l) if crate::volume::mounts::is_safe_sub_path(l) && !l.is_empty() => Ok(()),
            _ => Err((
                format!("{at}.localhostProfile"),
                "must be a relative path without '..'".into(),
            )),
        },
        _ => Err((
            format!("{at}.type"),
            "must be RuntimeDefault, Unconfined or Localhost".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(spec: &str) -> Pod {
        serde_yaml::from_str(&format!(
            "metadata: {{name: p, namespace: d}}\nspec: {spec}"
        ))
        .unwrap()
    }

    #[test]
    fn container_settings_win_over_the_pods_and_reach_cri() {
        let p = pod("{securityContext: {supplementalGroups: [5], fsGroup: 2000, seccompProfile: {type: RuntimeDefault}}, containers: [{name: c, image: b, securityContext: {allowPrivilegeEscalation: false, capabilities: {drop: [NET_RAW], add: [SYS_TIME]}}}]}");
        let c = &p.spec.as_ref().unwrap().containers[0];
        let mut sc = api::LinuxContainerSecurityContext::default();
        apply(
            &p,
            c,
            std::path::Path::new("/var/lib/nodelet/seccomp"),
            &mut sc,
        );
        assert!(sc.no_new_privs);
        assert_eq!(sc.supplemental_groups, vec![5, 2000]);
        let caps = sc.capabilities.unwrap();
        assert_eq!(
            (caps.drop_capabilities, caps.add_capabilities),
            (vec!["NET_RAW".to_owned()], vec!["SYS_TIME".to_owned()])
        );
        assert_eq!(
            sc.seccomp.unwrap().profile_type,
            api::security_profile::ProfileType::RuntimeDefault as i32
        );
    }

    #[test]
    fn run_as_non_root_is_checked_against_the_user_and_the_image() {
        let p = pod("{securityContext: {runAsNonRoot: true}, containers: [{name: c, image: b}]}");
        let c = &p.spec.as_ref().unwrap().containers[0];
        assert!(verify_run_as_non_root(&p, c, Some(1000), None, "").is_ok());
        assert!(verify_run_as_non_root(&p, c, Some(0), None, "")
            .unwrap_err()
            .contains("breaks non-root policy"));
        assert!(verify_run_as_non_root(&p, c, None, Some(0), "")
            .unwrap_err()
            .contains("will run as root"));
        assert!(
            verify_run_as_non_root(&p, c, None, None, "").is_err(),
            "busybox runs as root"
        );
        assert!(verify_run_as_non_root(&p, c, None, None, "app")
            .unwrap_err()
            .contains("non-numeric user (app)"));
        assert!(verify_run_as_non_root(&p, c, None, Some(1000), "").is_ok());
    }

    #[test]
    fn unenforced_settings_refuse_the_pod_naming_the_field() {
        for (spec, field) in [
            ("{securityContext: {seLinuxOptions: {level: 's0'}}, containers: [{name: c, image: b}]}", "spec.securityContext.seLinuxOptions"),
            ("{containers: [{name: c, image: b, securityContext: {procMount: Unmasked}}]}", "spec.containers[0].securityContext.procMount"),
            ("{hostUsers: false, containers: [{name: c, image: b}]}", "spec.hostUsers"),
            ("{containers: [{name: c, image: b, securityContext: {seccompProfile: {type: Localhost, localhostProfile: ../x}}}]}", "spec.containers[0].securityContext.seccompProfile.localhostProfile"),
        ] {
            let p = pod(spec);
            assert_eq!(validate(p.spec.as_ref().unwrap()).unwrap_err().0, field, "{spec}");
        }
        let ok = pod("{securityContext: {runAsUser: 1000, fsGroup: 2000}, containers: [{name: c, image: b, securityContext: {capabilities: {drop: [ALL]}, readOnlyRootFilesystem: true}}]}");
        assert_eq!(validate(ok.spec.as_ref().unwrap()), Ok(()));
    }

    #[test]
    fn the_runtime_gets_the_containers_profile_over_the_annotation_over_the_pods_or_none() {
        use crate::cri::api::security_profile::ProfileType;
        let p: Pod = serde_yaml::from_str("metadata: {name: p, annotations: {container.apparmor.security.beta.kubernetes.io/b: localhost/k8s-b}}\nspec: {securityContext: {appArmorProfile: {type: Unconfined}}, containers: [{name: a, image: x, securityContext: {appArmorProfile: {type: Localhost, localhostProfile: k8s-a}}}, {name: b, image: x}]}").unwrap();
        let spec = p.spec.as_ref().unwrap();
        let a = apparmor_profile(&p, &spec.containers[0], true).unwrap();
        assert_eq!(
            (a.profile_type, a.localhost_ref.as_str()),
            (ProfileType::Localhost as i32, "k8s-a")
        );
        let b = apparmor_profile(&p, &spec.containers[1], true).unwrap();
        assert_eq!(
            (b.profile_type, b.localhost_ref.as_str()),
            (ProfileType::Localhost as i32, "k8s-b"),
            "the annotation over the pod's field"
        );
        let c: Pod = serde_yaml::from_str("metadata: {name: p}\nspec: {securityContext: {appArmorProfile: {type: RuntimeDefault}}, containers: [{name: c, image: x}]}").unwrap();
        let c = apparmor_profile(&c, &c.spec.as_ref().unwrap().containers[0], true).unwrap();
        assert_eq!(
            c.profile_type,
            ProfileType::RuntimeDefault as i32,
            "the pod's field"
        );
        let plain: Pod =
            serde_yaml::from_str("metadata: {name: p}\nspec: {containers: [{name: c, image: x}]}")
                .unwrap();
        // Nothing asked: nothing sent, the runtime decides (as kubelet).
        assert!(
            apparmor_profile(&plain, &plain.spec.as_ref().unwrap().containers[0], true).is_none()
        );
        assert!(
            apparmor_profile(&plain, &plain.spec.as_ref().unwrap().containers[0], false).is_none()
        );
    }
}
