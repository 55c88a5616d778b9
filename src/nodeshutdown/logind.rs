//! systemd-logind's side of graceful node shutdown, over D-Bus (kubelet's
//! `nodeshutdown/systemd`): the *delay* inhibitor lock (`Inhibit("shutdown", who, why,
//! "delay")`, a file descriptor held until nodelet is done), the `PrepareForShutdown(bool)`
//! signal, and `InhibitDelayMaxUSec`, the longest delay logind grants. When that is shorter than
//! the grace period, nodelet does what kubelet does: writes a logind drop-in raising
//! `InhibitDelayMaxSec`, has systemd send logind SIGHUP (`KillUnit("systemd-logind.service",
//! "all", 1)`), and reads the value again.

use std::time::Duration;

use tracing::info;
use zbus::blocking::Connection;
use zbus::zvariant::{OwnedFd, OwnedValue};

const LOGIND: &str = "org.freedesktop.login1";
const LOGIND_PATH: &str = "/org/freedesktop/login1";
const LOGIND_MANAGER: &str = "org.freedesktop.login1.Manager";
/// The drop-in nodelet writes when logind's delay is too short (kubelet writes
/// `99-kubelet.conf` in the same directory).
pub const DROP_IN: &str = "/etc/systemd/logind.conf.d/99-nodelet.conf";

/// How a watch of logind's signals ended.
pub enum Watched {
    /// The agent is stopping.
    Stopped,
    /// The bus connection or the signal stream was lost (to be connected again).
    Lost(String),
}

/// A connection to logind, with the inhibitor lock when held.
pub struct Logind {
    conn: Connection,
    lock: Option<OwnedFd>,
}

impl Logind {
    /// Connects to the system bus.
    ///
    /// Errors: the bus cannot be reached (no systemd or no D-Bus).
    pub fn connect() -> Result<Self, String> {
        let conn = Connection::system().map_err(|e| format!("system bus: {e}"))?;
        Ok(Self { conn, lock: None })
    }

    /// logind's `InhibitDelayMaxUSec`, read afresh.
    ///
    /// Errors: the property cannot be read.
    pub fn delay(&self) -> Result<Duration, String> {
        let reply = self
            .conn
            .call_method(
                Some(LOGIND),
                LOGIND_PATH,
                Some("org.freedesktop.DBus.Properties"),
                "Get",
                &(LOGIND_MANAGER, "InhibitDelayMaxUSec"),
            )
            .map_err(|e| format!("failed reading InhibitDelayMaxUSec property from logind: {e}"))?;
        let value: OwnedValue = reply
            .body()
            .deserialize()
            .map_err(|e| format!("InhibitDelayMaxUSec: {e}"))?;
        let usec = u64::try_from(value).map_err(|_| {
            "InhibitDelayMaxUSec from logind is not a uint64 as expected".to_owned()
        })?;
        Ok(Duration::from_micros(usec))
    }

    /// Makes sure logind lets shutdown wait `needed`: when `InhibitDelayMaxSec` is shorter,
    /// writes [`DROP_IN`] with `needed` and reloads logind, then reads the delay again (5 tries,
    /// 100 ms doubling). Returns the delay in force.
    ///
    /// Errors: the delay is still shorter than `needed` (the message names both and the file),
    /// or logind cannot be reconfigured.
    pub fn ensure_delay(&mut self, needed: Duration) -> Result<Duration, String> {
        let delay = self.delay()?;
        if delay >= needed {
            return Ok(delay);
        }
        info!(
            ?delay,
            ?needed,
            file = DROP_IN,
            "logind's InhibitDelayMaxSec is shorter than the shutdown grace period; raising it"
        );
        let dir = std::path::Path::new(DROP_IN)
            .parent()
            .unwrap_or(std::path::Path::new("/"));
        std::fs::create_dir_all(dir)
            .and_then(|()| {
                std::fs::write(
                    DROP_IN,
                    format!(
                        "# nodelet: graceful node shutdown (shutdownGracePeriod)\n[Login]\nInhibitDelayMaxSec={}\n",
                        needed.as_secs()
                    ),
                )
            })
            .map_err(|e| format!("cannot write {DROP_IN}: {e}"))?;
        self.conn
            .call_method(
                Some("org.freedesktop.systemd1"),
                "/org/freedesktop/systemd1",
                Some("org.freedesktop.systemd1.Manager"),
                "KillUnit",
                &("systemd-logind.service", "all", 1i32),
            )
            .map_err(|e| format!("unable to reload logind conf: {e}"))?;
        let mut wait = Duration::from_millis(100);
        let mut now = delay;
        for _ in 0..5 {
            crate::clock::sleep_blocking(wait);
            now = self.delay()?;
            if now >= needed {
                return Ok(now);
            }
            wait *= 2;
        }
        Err(format!(
            "logind's InhibitDelayMaxSec is {}s, shorter than the shutdown grace period of {}s, even after writing {DROP_IN}: raise InhibitDelayMaxSec in logind's configuration, or shorten shutdownGracePeriod",
            now.as_secs(),
            needed.as_secs()
        ))
    }

    /// Takes a delay inhibitor lock, then lets go of the one held before (kubelet's order).
    ///
    /// Errors: logind refused the lock.
    pub fn inhibit(&mut self) -> Result<(), String> {
        let reply = self
            .conn
            .call_method(
                Some(LOGIND),
                LOGIND_PATH,
                Some(LOGIND_MANAGER),
                "Inhibit",
                &(
                    "shutdown",
                    "nodelet",
                    "nodelet needs time to handle node shutdown",
                    "delay",
                ),
            )
            .map_err(|e| format!("failed creating systemd inhibitor: {e}"))?;
        let fd: OwnedFd = reply
            .body()
            .deserialize()
            .map_err(|e| format!("failed storing inhibit lock file descriptor: {e}"))?;
        self.lock = Some(fd);
        Ok(())
    }

    /// Lets go of the lock: logind goes on with the shutdown.
    pub fn release(&mut self) {
        self.lock = None;
    }

    /// Calls `on_signal` with each `PrepareForShutdown` (true: the shutdown begins; false: it was
    /// cancelled) until `stop` fires or the signals are lost.
    pub fn watch(
        &mut self,
        stop: &crossbeam_channel::Receiver<()>,
        mut on_signal: impl FnMut(bool, &mut Self),
    ) -> Watched {
        let rule = zbus::MatchRule::builder()
            .msg_type(zbus::message::Type::Signal)
            .sender(LOGIND)
            .and_then(|b| b.interface(LOGIND_MANAGER))
            .and_then(|b| b.member("PrepareForShutdown"))
            .and_then(|b| b.path(LOGIND_PATH))
            .map(|b| b.build());
        let rule = match rule {
            Ok(r) => r,
            Err(e) => return Watched::Lost(e.to_string()),
        };
        let messages =
            match zbus::blocking::MessageIterator::for_match_rule(rule, &self.conn, Some(16)) {
                Ok(m) => m,
                Err(e) => return Watched::Lost(format!("subscribing to PrepareForShutdown: {e}")),
            };
        // The blocking iterator gets a thread of its own, so that a stop is seen at once.
        let (tx, rx) = crossbeam_channel::bounded::<Result<bool, String>>(16);
        let spawned = std::thread::Builder::new()
            .name("logind-signals".into())
            .spawn(move || {
                for m in messages {
                    let r = m
                        .map_err(|e| e.to_string())
                        .and_then(|m| m.body().deserialize::<bool>().map_err(|e| e.to_string()));
                    if tx.send(r).is_err() {
                        return;
                    }
                }
                // The stream ended: the channel closes with the thread.
            });
        if let Err(e) = spawned {
            return Watched::Lost(format!("cannot start the signal thread: {e}"));
        }
        loop {
            crossbeam_channel::select! {
                recv(stop) -> _ => return Watched::Stopped,
                recv(rx) -> m => match m {
                    Ok(Ok(start)) => on_signal(start, self),
                    Ok(Err(e)) => {
                        tracing::debug!(error = %e, "a PrepareForShutdown message that is not a bool; skipped");
                    }
                    Err(_) => return Watched::Lost("the signal thread ended".into()),
                },
            }
        }
    }
}
