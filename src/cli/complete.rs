//! Shell completion (clap's dynamic completer, `clap_complete::env`): `nodelet completion
//! bash|zsh` prints the script a shell sources; the shell then asks the binary itself
//! (`COMPLETE=bash nodelet -- …`), which completes flags and subcommands from its definition
//! and pod names from the running agent (at `$NODELET_ROOT_DIR`, else `/var/lib/nodelet`).

use std::ffi::OsStr;

use clap_complete::engine::CompletionCandidate;
use clap_complete::env::EnvCompleter;

use super::Shell;

/// The environment variable naming the agent's `--root-dir` (read by `--root-dir` too).
pub const ROOT_DIR_ENV: &str = "NODELET_ROOT_DIR";

/// The variable that switches the binary into completion (clap_complete's default).
pub const COMPLETE_ENV: &str = "COMPLETE";

/// The names of the agent's pods that start with `current` (none when no agent answers: a
/// completer prints nothing rather than an error).
pub fn pod_names(current: &OsStr) -> Vec<CompletionCandidate> {
    let prefix = current.to_string_lossy();
    let root = std::env::var_os(ROOT_DIR_ENV).unwrap_or_else(|| "/var/lib/nodelet".into());
    // A shell waits for this at a keystroke: an agent that does not answer gets a second.
    let client = super::Client::new(std::path::Path::new(&root))
        .with_timeout(std::time::Duration::from_secs(1));
    let Ok(rt) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return Vec::new();
    };
    let pods = rt.block_on(super::pods(&client)).unwrap_or_default();
    pods.iter()
        .filter_map(|p| p.metadata.name.clone())
        .filter(|n| n.starts_with(prefix.as_ref()))
        .map(CompletionCandidate::new)
        .collect()
}

/// Writes the registration script of `shell` to `out`: completion of the command `nodelet`
/// (as typed), answered by the binary at `bin`.
///
/// Errors: writing failed.
pub fn write_script(shell: Shell, bin: &str, out: &mut dyn std::io::Write) -> std::io::Result<()> {
    let completer: &dyn EnvCompleter = match shell {
        Shell::Bash => &clap_complete::env::Bash,
        Shell::Zsh => &clap_complete::env::Zsh,
    };
    completer.write_registration(COMPLETE_ENV, "nodelet", "nodelet", bin, out)
}
