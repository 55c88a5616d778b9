//! The systemd cgroup driver (kubelet's `cgroupDriver: systemd`, through libcontainer's systemd
//! cgroup manager): the QoS and pod cgroups are slices that systemd owns, made and changed
//! through its D-Bus API, so that systemd never puts its own defaults back over kubelet's values.
//!
//! - A slice is made with `StartTransientUnit(name, "replace", properties, [])`: `Description`,
//!   `Wants=` its parent slice, `DefaultDependencies=false`, the accounting switches, and the
//!   resources as systemd properties (`slice_properties`). A slice that already exists (made
//!   by an earlier agent, or by runc for a container before its pod's slice) gets the same
//!   properties with `SetUnitProperties(name, runtime = true, properties)`.
//! - The values are then also written to the slice's cgroup files, as libcontainer does after
//!   setting the properties: a value systemd has no property for (hugetlb limits) lands there.
//! - A slice goes with `StopUnit(name, "replace")`.
//! - Reading (does it exist, which pods are below it, which processes) is done on the cgroup
//!   files, as with the cgroupfs driver ([`super::cgroupfs::Cgroupfs`]).
//!
//! D-Bus is connected lazily and again after a failure. A failure is reported once (a warning)
//! until a call succeeds again; the caller's sync fails and is retried, and the pods keep running.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tracing::{info, warn};
use zbus::zvariant::{OwnedValue, Value};

use super::cgroupfs::{shares_to_weight, CgroupError, CgroupManager, Cgroupfs};
use super::hierarchy::Hierarchies;
use super::resources::ResourceConfig;

const DESTINATION: &str = "org.freedesktop.systemd1";
const PATH: &str = "/org/freedesktop/systemd1";
const MANAGER: &str = "org.freedesktop.systemd1.Manager";
/// systemd's `USEC_INFINITY` and "no limit" for byte and task limits.
const INFINITY: u64 = u64::MAX;
/// How long a new slice's cgroup directory is waited for.
const REALIZE_WAIT: Duration = Duration::from_secs(10);

/// The unit name of a slice path as the systemd driver spells it
/// (`/kubepods.slice/kubepods-burstable.slice` → `kubepods-burstable.slice`), and its parent
/// slice (`kubepods.slice`; `-.slice` for a top-level one). `None` for `/` or a path that is not
/// made of slices.
pub fn slice_unit(cgroup: &str) -> Option<(String, String)> {
    let mut parts = cgroup.rsplit('/').filter(|p| !p.is_empty());
    let unit = parts.next()?;
    if !unit.ends_with(".slice") {
        return None;
    }
    let parent = parts.next().unwrap_or("-.slice");
    Some((unit.to_owned(), parent.to_owned()))
}

/// `CPUQuotaPerSecUSec` for a CFS quota of `quota` microseconds per `period` microseconds
/// (libcontainer's `addCpuQuota`): microseconds per second, rounded up to a whole 10 ms (systemd
/// keeps whole percents), `USEC_INFINITY` for no quota (`-1`).
pub fn cpu_quota_per_sec_usec(quota: i64, period: u64) -> u64 {
    if quota <= 0 || period == 0 {
        return INFINITY;
    }
    let per_sec = (quota as u64).saturating_mul(1_000_000) / period;
    per_sec.div_ceil(10_000) * 10_000
}

/// The systemd properties of a slice with `cfg` (libcontainer's `genV2ResourcesProperties` and
/// `genV1ResourcesProperties`): on cgroup v2 `CPUWeight` (from the shares, kubelet's
/// conversion), `MemoryMax`, `MemoryHigh`; on v1 `CPUShares`, `MemoryLimit`; both
/// `CPUQuotaPerSecUSec` with `CPUQuotaPeriodUSec` and `TasksMax`. Only the values `cfg` sets.
pub fn resource_properties(cfg: &ResourceConfig, v2: bool) -> Vec<(&'static str, u64)> {
    let mut p = Vec::new();
    if let Some(shares) = cfg.cpu_shares {
        if v2 {
            p.push(("CPUWeight", shares_to_weight(shares)));
        } else {
            p.push(("CPUShares", shares));
        }
    }
    if let Some(quota) = cfg.cpu_quota {
        let period = cfg
            .cpu_period
            .unwrap_or(super::resources::DEFAULT_CFS_PERIOD_US);
        p.push(("CPUQuotaPeriodUSec", period));
        p.push(("CPUQuotaPerSecUSec", cpu_quota_per_sec_usec(quota, period)));
    }
    if let Some(m) = cfg.memory_limit {
        let bytes = u64::try_from(m).ok().filter(|m| *m > 0).unwrap_or(INFINITY);
        p.push((if v2 { "MemoryMax" } else { "MemoryLimit" }, bytes));
    }
    if let (Some(min), true) = (cfg.memory_min, v2) {
        p.push(("MemoryMin", u64::try_from(min).unwrap_or(0)));
    }
    if let (Some(high), true) = (cfg.memory_high, v2) {
        p.push((
            "MemoryHigh",
            u64::try_from(high)
                .ok()
                .filter(|h| *h > 0)
                .unwrap_or(INFINITY),
        ));
    }
    if let Some(pids) = cfg.pids_limit {
        p.push((
            "TasksMax",
            u64::try_from(pids)
                .ok()
                .filter(|p| *p > 0)
                .unwrap_or(INFINITY),
        ));
    }
    p
}

/// `cfg` with its CFS quota as systemd applies it: rounded up to whole 10 ms per second, as
/// libcontainer writes it to `cpu.max` too, so that the file and the unit agree.
fn as_systemd_applies(cfg: &ResourceConfig) -> ResourceConfig {
    let mut c = cfg.clone();
    if let Some(q) = c.cpu_quota.filter(|q| *q > 0) {
        let period = c
            .cpu_period
            .unwrap_or(super::resources::DEFAULT_CFS_PERIOD_US);
        let per_sec = cpu_quota_per_sec_usec(q, period);
        c.cpu_quota = i64::try_from(per_sec.saturating_mul(period) / 1_000_000).ok();
    }
    c
}

/// Every property a new slice `unit` under `parent` is started with.
fn slice_properties(
    unit: &str,
    parent: &str,
    cfg: &ResourceConfig,
    v2: bool,
) -> Vec<(String, OwnedValue)> {
    let owned = |v: Value<'_>| OwnedValue::try_from(v).expect("plain values convert");
    let mut p = vec![
        (
            "Description".to_owned(),
            owned(Value::from(format!("nodelet {unit}"))),
        ),
        (
            "Wants".to_owned(),
            owned(Value::from(vec![parent.to_owned()])),
        ),
        ("DefaultDependencies".to_owned(), owned(Value::from(false))),
        ("MemoryAccounting".to_owned(), owned(Value::from(true))),
        ("CPUAccounting".to_owned(), owned(Value::from(true))),
        ("IOAccounting".to_owned(), owned(Value::from(true))),
        ("TasksAccounting".to_owned(), owned(Value::from(true))),
    ];
    p.extend(
        resource_properties(cfg, v2)
            .into_iter()
            .map(|(k, v)| (k.to_owned(), owned(Value::from(v)))),
    );
    p
}

/// The systemd cgroup manager.
pub struct SystemdCgroups {
    fs: Cgroupfs,
    v2: bool,
    bus: Mutex<Option<zbus::blocking::Connection>>,
    /// A D-Bus failure was reported and no call has succeeded since.
    failing: AtomicBool,
}

impl SystemdCgroups {
    /// A manager over `h`, connected to the system bus now (to fail at start rather than at the
    /// first pod).
    ///
    /// Errors: [`CgroupError::Systemd`] when the system bus cannot be reached (no systemd, or no
    /// D-Bus socket at `/run/dbus/system_bus_socket`).
    pub fn new(h: Hierarchies) -> Result<Self, CgroupError> {
        let m = Self {
            v2: h.is_v2(),
            fs: Cgroupfs::new(h),
            bus: Mutex::new(None),
            failing: AtomicBool::new(false),
        };
        drop(m.connection()?);
        Ok(m)
    }

    fn connection(&self) -> Result<zbus::blocking::Connection, CgroupError> {
        let mut bus = self.bus.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = bus.as_ref() {
            return Ok(c.clone());
        }
        let c = zbus::blocking::Connection::system().map_err(|e| CgroupError::Systemd {
            unit: String::new(),
            call: "connect to the system bus",
            message: e.to_string(),
        })?;
        *bus = Some(c.clone());
        Ok(c)
    }

    /// Calls `method` of systemd's manager with `body`; drops the connection after a failure
    /// (the next call connects again) and reports a failure once until a call succeeds.
    fn call<B>(&self, unit: &str, method: &'static str, body: &B) -> Result<(), CgroupError>
    where
        B: serde::Serialize + zbus::zvariant::DynamicType,
    {
        let conn = self.connection().inspect_err(|e| self.failed(e))?;
        match conn.call_method(Some(DESTINATION), PATH, Some(MANAGER), method, body) {
            Ok(_) => {
                if self.failing.swap(false, Ordering::Relaxed) {
                    info!(unit, "systemd's D-Bus API answers again");
                }
                Ok(())
            }
            Err(e) => {
                let exists = matches!(&e, zbus::Error::MethodError(name, _, _) if name.as_str() == "org.freedesktop.systemd1.UnitExists");
                let err = CgroupError::Systemd {
                    unit: unit.to_owned(),
                    call: method,
                    message: e.to_string(),
                };
                if !exists && !matches!(e, zbus::Error::MethodError(..)) {
                    // The connection itself failed: connect again next time.
                    *self.bus.lock().unwrap_or_else(|e| e.into_inner()) = None;
                }
                if !exists {
                    self.failed(&err);
                }
                Err(err)
            }
        }
    }

    fn failed(&self, e: &CgroupError) {
        if !self.failing.swap(true, Ordering::Relaxed) {
            warn!(error = %e, "systemd's D-Bus API failed; cgroup changes are retried with the pods' syncs (reported once)");
        }
    }

    fn set_properties(&self, unit: &str, cfg: &ResourceConfig) -> Result<(), CgroupError> {
        let props: Vec<(&str, Value<'_>)> = resource_properties(cfg, self.v2)
            .into_iter()
            .map(|(k, v)| (k, Value::from(v)))
            .collect();
        if props.is_empty() {
            return Ok(());
        }
        self.call(unit, "SetUnitProperties", &(unit, true, props))
    }
}

impl CgroupManager for SystemdCgroups {
    fn create(&self, cgroup: &str, cfg: &ResourceConfig) -> Result<(), CgroupError> {
        let Some((unit, parent)) = slice_unit(cgroup) else {
            return self.fs.create(cgroup, cfg);
        };
        let props = slice_properties(&unit, &parent, cfg, self.v2);
        let aux: Vec<(String, Vec<(String, OwnedValue)>)> = Vec::new();
        match self.call(&unit, "StartTransientUnit", &(&unit, "replace", props, aux)) {
            Ok(()) => {}
            Err(CgroupError::Systemd { message, .. })
                if message.contains("UnitExists") || message.contains("already exists") =>
            {
                self.set_properties(&unit, cfg)?;
            }
            Err(e) => return Err(e),
        }
        // The job runs on: wait for systemd to make the cgroup before anything goes in it.
        let deadline = crate::clock::monotonic_now() + REALIZE_WAIT;
        while !self.fs.exists(cgroup) && crate::clock::monotonic_now() < deadline {
            crate::clock::sleep_blocking(Duration::from_millis(10));
        }
        // As libcontainer: the values to the files too (hugetlb has no systemd property).
        self.fs.update(cgroup, &as_systemd_applies(cfg))
    }

    fn update(&self, cgroup: &str, cfg: &ResourceConfig) -> Result<(), CgroupError> {
        if let Some((unit, _)) = slice_unit(cgroup) {
            self.set_properties(&unit, cfg)?;
        }
        self.fs.update(cgroup, &as_systemd_applies(cfg))
    }

    fn destroy(&self, cgroup: &str) -> Result<(), CgroupError> {
        if let Some((unit, _)) = slice_unit(cgroup) {
            match self.call(&unit, "StopUnit", &(&unit, "replace")) {
                Ok(()) => {}
                // Gone already.
                Err(CgroupError::Systemd { message, .. })
                    if message.contains("NoSuchUnit") || message.contains("not loaded") => {}
                Err(e) => return Err(e),
            }
            let deadline = crate::clock::monotonic_now() + REALIZE_WAIT;
            while self.fs.exists(cgroup) && crate::clock::monotonic_now() < deadline {
                crate::clock::sleep_blocking(Duration::from_millis(10));
            }
        }
        self.fs.destroy(cgroup)
    }

    fn exists(&self, cgroup: &str) -> bool {
        self.fs.exists(cgroup)
    }

    fn pod_uids_under(&self, cgroup: &str) -> Vec<String> {
        self.fs.pod_uids_under(cgroup)
    }

    fn pids(&self, cgroup: &str) -> Vec<u64> {
        self.fs.pids(cgroup)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slice_units_and_parents_from_driver_paths() {
        assert_eq!(
            slice_unit("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1_2.slice"),
            Some((
                "kubepods-burstable-pod1_2.slice".into(),
                "kubepods-burstable.slice".into()
            ))
        );
        assert_eq!(
            slice_unit("/kubepods.slice"),
            Some(("kubepods.slice".into(), "-.slice".into()))
        );
        assert_eq!(slice_unit("/"), None);
        assert_eq!(slice_unit("/kubepods/burstable"), None);
    }

    #[test]
    fn resources_become_systemd_properties_as_libcontainer_sets_them() {
        let cfg = ResourceConfig {
            cpu_shares: Some(512),
            cpu_quota: Some(50_000),
            cpu_period: Some(100_000),
            memory_limit: Some(128 << 20),
            pids_limit: Some(1000),
            ..Default::default()
        };
        assert_eq!(
            resource_properties(&cfg, true),
            vec![
                ("CPUWeight", 20),
                ("CPUQuotaPeriodUSec", 100_000),
                ("CPUQuotaPerSecUSec", 500_000),
                ("MemoryMax", 128 << 20),
                ("TasksMax", 1000),
            ]
        );
        assert_eq!(resource_properties(&cfg, false)[0], ("CPUShares", 512));
        // A fraction of a percent is rounded up to whole 10 ms; no quota is infinity.
        assert_eq!(cpu_quota_per_sec_usec(1_005, 100_000), 20_000);
        assert_eq!(cpu_quota_per_sec_usec(1_000, 100_000), 10_000);
        assert_eq!(cpu_quota_per_sec_usec(-1, 100_000), u64::MAX);
        // 15m of cpu: a quota of 1500 µs is applied as 2000, in the unit and in cpu.max.
        let small = ResourceConfig {
            cpu_quota: Some(1_500),
            cpu_period: Some(100_000),
            ..Default::default()
        };
        assert_eq!(as_systemd_applies(&small).cpu_quota, Some(2_000));
        let unlimited = ResourceConfig {
            cpu_quota: Some(-1),
            memory_limit: Some(0),
            ..Default::default()
        };
        assert_eq!(
            resource_properties(&unlimited, true),
            vec![
                ("CPUQuotaPeriodUSec", 100_000),
                ("CPUQuotaPerSecUSec", u64::MAX),
                ("MemoryMax", u64::MAX)
            ]
        );
    }
}
