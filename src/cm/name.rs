//! Cgroup names and their spelling by driver (kubelet's `CgroupName`, `ToCgroupfs`,
//! `ToSystemd`).
//!
//! A name is a list of components (`["kubepods", "burstable", "pod<uid>"]`). The cgroupfs driver
//! joins them as a path (`/kubepods/burstable/pod<uid>`); the systemd driver turns each prefix into
//! a slice (`/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_>.slice`, with
//! `-` in components escaped to `_`).

/// A cgroup name as components below the root.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CgroupName(pub Vec<String>);

impl CgroupName {
    /// `root` (a cgroupfs path like `/` or `/nodelet-test`) followed by `components`.
    pub fn new(root: &str, components: &[&str]) -> Self {
        let mut v: Vec<String> = root
            .split('/')
            .filter(|c| !c.is_empty())
            .map(str::to_owned)
            .collect();
        v.extend(components.iter().map(|c| (*c).to_owned()));
        Self(v)
    }

    /// The cgroupfs path (`/a/b/c`).
    pub fn to_cgroupfs(&self) -> String {
        format!("/{}", self.0.join("/"))
    }

    /// The systemd slice path: each component becomes `<prefix>-<component>.slice` nested under
    /// the previous one; `-` inside a component is escaped to `_`.
    pub fn to_systemd(&self) -> String {
        if self.0.is_empty() {
            return "/".into();
        }
        let mut path = String::new();
        let mut prefix = String::new();
        for c in &self.0 {
            let escaped = c.replace('-', "_");
            prefix = if prefix.is_empty() {
                escaped
            } else {
                format!("{prefix}-{escaped}")
            };
            path.push('/');
            path.push_str(&prefix);
            path.push_str(".slice");
        }
        path
    }

    /// The name as the given driver spells it (`systemd` true → slices).
    pub fn for_driver(&self, systemd: bool) -> String {
        if systemd {
            self.to_systemd()
        } else {
            self.to_cgroupfs()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drivers_spell_names_as_kubelet() {
        let n = CgroupName::new("/", &["kubepods", "burstable", "pod1234-5678"]);
        assert_eq!(n.to_cgroupfs(), "/kubepods/burstable/pod1234-5678");
        assert_eq!(
            n.to_systemd(),
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1234_5678.slice"
        );
        let g = CgroupName::new("/", &["kubepods", "podab-cd"]);
        assert_eq!(g.to_systemd(), "/kubepods.slice/kubepods-podab_cd.slice");
        let r = CgroupName::new("/test-root", &["kubepods"]);
        assert_eq!(r.to_cgroupfs(), "/test-root/kubepods");
        assert_eq!(r.to_systemd(), "/test_root.slice/test_root-kubepods.slice");
        assert_eq!(CgroupName::new("/", &[]).to_systemd(), "/");
    }
}
