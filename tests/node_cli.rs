//! The command line (`nodelet get|describe|logs|exec|top|events|completion`) against a running
//! agent on real containerd, through its local socket: columns and kubectl's statuses for
//! crash-looping, init-waiting, OOM-killed and completed pods, `describe`'s states, probes,
//! cgroup and events, `logs -f` across rotation, `exec`'s exit status and a real terminal
//! (tmux), `top`, `events -w`, completion of pod names, and the errors a user meets.
// Test code reads the machine's clocks and casts measurements freely.
#![allow(clippy::disallowed_methods, clippy::cast_possible_truncation)]

mod common;

use std::io::BufRead;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{wait_until, Nodelet};

/// Polls `f` every 100 ms until it is true or `timeout` passes; whether it became true.
fn poll(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

/// `nodelet <args> --root-dir <the agent's>`.
fn cli(n: &Nodelet, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_nodelet"))
        .arg("--root-dir")
        .arg(n.root())
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The row of pod `name` in a `get pods` table, split on runs of spaces.
fn row(table: &str, name: &str) -> Option<Vec<String>> {
    table
        .lines()
        .find(|l| l.split_whitespace().next() == Some(name))
        .map(|l| {
            let mut cells = Vec::new();
            // RESTARTS may be `2 (10s ago)`: cells are separated by 3 spaces or more.
            for c in l.split("   ") {
                let c = c.trim();
                if !c.is_empty() {
                    cells.push(c.to_owned());
                }
            }
            cells
        })
}

fn pod(name: &str, body: &str) -> String {
    format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 1\n{body}")
}

const BUSY: &str = "busybox:1.36";

#[test]
fn get_pods_prints_kubectls_columns_and_statuses() {
    let mut n = Nodelet::new("cliget");
    n.start();
    let node = n.node.clone();
    n.write_manifest(
        "crash.yaml",
        &pod(
            "crash",
            &format!(
                "  containers:\n  - {{name: c, image: {BUSY}, command: [sh, -c, 'exit 1']}}\n"
            ),
        ),
    );
    n.write_manifest("init.yaml", &pod("init", &format!("  initContainers:\n  - {{name: i, image: {BUSY}, command: [sleep, '3600']}}\n  containers:\n  - {{name: c, image: {BUSY}, command: [sleep, '3600']}}\n")));
    n.write_manifest("oom.yaml", &pod("oom", &format!("  restartPolicy: Never\n  containers:\n  - {{name: c, image: {BUSY}, command: [sh, -c, 'head -c 300m /dev/zero | tail'], resources: {{limits: {{memory: 32Mi}}}}}}\n")));
    n.write_manifest("done.yaml", &pod("done", &format!("  restartPolicy: Never\n  containers:\n  - {{name: c, image: {BUSY}, command: [sh, -c, 'exit 0']}}\n")));
    n.write_manifest(
        "web.yaml",
        &pod(
            "web",
            &format!("  containers:\n  - {{name: c, image: {BUSY}, command: [sh, -c, 'while true; do echo tick; sleep 0.2; done']}}\n"),
        ),
    );
    let want = [
        ("crash", "0/1", "CrashLoopBackOff"),
        ("init", "0/1", "Init:0/1"),
        ("oom", "0/1", "OOMKilled"),
        ("done", "0/1", "Completed"),
        ("web", "1/1", "Running"),
    ];
    let mut table = String::new();
    let five = poll(Duration::from_secs(60), || {
        let o = cli(&n, &["get", "pods"]);
        table = stdout(&o);
        want.iter().all(|(p, ready, status)| {
            row(&table, &format!("{p}-{node}")).is_some_and(|r| r[1] == *ready && r[2] == *status)
        })
    });
    assert!(five, "the five statuses: {want:?}\n{table}");
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        ["NAME", "READY", "STATUS", "RESTARTS", "AGE"],
        "{table}"
    );
    // The crash loop's restarts with the age of the last one, as kubectl ≥ 1.22 prints them.
    let crash = row(&table, &format!("crash-{node}")).unwrap();
    assert!(
        crash[3].starts_with(|c: char| c.is_ascii_digit()) && crash[3].contains(" ago)"),
        "{crash:?}"
    );
    // Columns line up (kubectl's tabwriter): every row's STATUS starts where the header's does.
    let at = table.lines().next().unwrap().find("STATUS").unwrap();
    for l in table.lines().skip(1) {
        assert!(
            l[at..].starts_with(|c: char| c.is_ascii_alphabetic()) && l.as_bytes()[at - 1] == b' ',
            "{table}"
        );
    }

    // -o wide: IP, NODE, QOS; -A: NAMESPACE first.
    let wide = stdout(&cli(&n, &["get", "pods", "-o", "wide", "-A"]));
    let r = wide
        .lines()
        .find(|l| l.contains(&format!("web-{node}")))
        .unwrap()
        .to_owned();
    let cells: Vec<&str> = r.split_whitespace().collect();
    assert_eq!(cells[0], "default");
    assert!(
        cells.contains(&node.as_str()) && cells.contains(&"BestEffort"),
        "{wide}"
    );
    assert!(
        cells.iter().any(|c| c.parse::<std::net::IpAddr>().is_ok()),
        "an IP: {wide}"
    );
    // A name without the static pod's node suffix, as JSON: the pod as the API has it.
    let j: serde_json::Value =
        serde_json::from_slice(&cli(&n, &["get", "pod", "web", "-o", "json"]).stdout).unwrap();
    assert_eq!(j["metadata"]["name"], format!("web-{node}"));
    assert_eq!(j["status"]["phase"], "Running");
    // -A finds a name in any namespace.
    let o = cli(&n, &["get", "pod", "web", "-A"]);
    assert!(
        stdout(&o).contains(&format!("web-{node}")),
        "{}",
        stderr(&o)
    );
    let y = stdout(&cli(&n, &["get", "pods", "-o", "yaml"]));
    assert!(
        y.contains("kind: List") && y.contains(&format!("name: oom-{node}")),
        "{y}"
    );

    // An unknown pod: the names meant, exit 1, one line.
    let o = cli(&n, &["get", "pod", "wbe"]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(stderr(&o).lines().count(), 1, "{}", stderr(&o));
    assert!(
        stderr(&o).contains(&format!("did you mean: web-{node}")),
        "{}",
        stderr(&o)
    );
    let o = cli(&n, &["get", "pods", "-n", "kube-system"]);
    assert!(
        o.status.success() && stderr(&o).contains("No resources found in kube-system namespace"),
        "{}",
        stderr(&o)
    );

    // get -w: a pod added later shows up as a new row.
    let mut w = Command::new(env!("CARGO_BIN_EXE_nodelet"))
        .args(["get", "pods", "-w", "--root-dir"])
        .arg(n.root())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = lines_of(w.stdout.take().unwrap());
    n.write_manifest(
        "late.yaml",
        &pod(
            "late",
            &format!("  containers:\n  - {{name: c, image: {BUSY}, command: [sleep, '3600']}}\n"),
        ),
    );
    let late = format!("late-{node}");
    wait_line(&lines, Duration::from_secs(30), |l| {
        l.starts_with(&late) && l.contains("Running")
    });
    let _ = w.kill();
    let _ = w.wait();

    // A reader that goes away (`| head`) ends a watch and a follow quietly.
    for cmd in [
        "get pods -w | head -1",
        "logs -f web | head -1",
        "events -w | head -1",
    ] {
        let (bin, root) = (env!("CARGO_BIN_EXE_nodelet"), n.root());
        let t = Instant::now();
        let o = Command::new("timeout")
            .args(["20", "sh", "-c"])
            .arg(format!("{bin} --root-dir {} {cmd}", root.display()))
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(0), "{cmd}: {}", stderr(&o));
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "{cmd} took {:?}",
            t.elapsed()
        );
    }

    // A second agent on the same --root-dir stops before it touches the first one's cgroups.
    let kubepods = nodelet::cm::cgroup_mounts()
        .into_iter()
        .map(|m| {
            m.join(n.cgroup_root.trim_start_matches('/'))
                .join("kubepods")
        })
        .find(|d| d.join("cpu.shares").exists() || d.join("cpu.weight").exists())
        .unwrap();
    let shares = |d: &std::path::Path| {
        std::fs::read_to_string(d.join("cpu.shares"))
            .or_else(|_| std::fs::read_to_string(d.join("cpu.weight")))
            .unwrap()
    };
    let before = shares(&kubepods);
    let cfg = n.dir.path().join("second.yaml");
    let text = std::fs::read_to_string(n.config_path()).unwrap();
    let text = text
        .lines()
        .filter(|l| !l.starts_with("healthzPort:") && !l.starts_with("port:"))
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(
        &cfg,
        format!("{text}\nhealthzPort: 0\nport: 0\nsystemReserved: {{cpu: 1500m}}\n"),
    )
    .unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_nodelet"))
        .arg("--config")
        .arg(&cfg)
        .args(["--hostname-override", &node, "--root-dir"])
        .arg(n.root())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("another nodelet answers on it"),
        "{}",
        stderr(&o)
    );
    assert_eq!(
        shares(&kubepods),
        before,
        "the first agent's kubepods cgroup was changed"
    );
    assert!(
        cli(&n, &["get", "pods"]).status.success(),
        "the first agent still answers"
    );
    // With another --root-dir (what that error suggests) and the first one's ports: it stops at
    // the port it cannot have, before any cgroup, and leaves no socket in its root dir.
    let other_root = n.dir.path().join("other-root");
    std::fs::write(
        &cfg,
        format!(
            "{}\nsystemReserved: {{cpu: 1500m}}\n",
            std::fs::read_to_string(n.config_path()).unwrap()
        ),
    )
    .unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_nodelet"))
        .arg("--config")
        .arg(&cfg)
        .args(["--hostname-override", &node, "--root-dir"])
        .arg(&other_root)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("cannot listen on") && stderr(&o).contains("in use"),
        "{}",
        stderr(&o)
    );
    assert_eq!(
        shares(&kubepods),
        before,
        "the first agent's kubepods cgroup was changed by an agent that could not start"
    );
    assert!(
        !other_root.join("nodelet.sock").exists(),
        "the failed agent left its local socket"
    );

    // Another user: refused, whether the socket's mode stops it or the agent's owner check.
    let as_nobody = || {
        Command::new("setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                env!("CARGO_BIN_EXE_nodelet"),
                "--root-dir",
            ])
            .arg(n.root())
            .args(["get", "pods"])
            .output()
            .unwrap()
    };
    let o = as_nobody();
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("serves root only"), "{}", stderr(&o));
    use std::os::unix::fs::PermissionsExt;
    let sock = n.root().join("nodelet.sock");
    for p in [n.dir.path().to_owned(), n.root()] {
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o711)).unwrap();
    }
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o666)).unwrap();
    let o = as_nobody();
    assert_eq!(o.status.code(), Some(1));
    let e = stderr(&o);
    assert!(
        e.contains("closed the connection unanswered") && e.contains("serves root only"),
        "{e}"
    );
    assert!(stdout(&o).is_empty());

    // The agent gone: one line naming the socket and how to start it.
    n.kill9();
    let o = cli(&n, &["get", "pods"]);
    assert_eq!(o.status.code(), Some(1));
    let e = stderr(&o);
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(
        e.contains("nodelet is not running")
            && e.contains("nodelet.sock")
            && e.contains(nodelet::cli::client::start_hint(std::path::Path::new(
                "/run/systemd/system"
            ))),
        "{e}"
    );
}

/// The lines a child prints, as they come.
fn lines_of(out: impl std::io::Read + Send + 'static) -> std::sync::mpsc::Receiver<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// Waits for a line `f` accepts; returns the lines seen up to it.
fn wait_line(
    rx: &std::sync::mpsc::Receiver<String>,
    timeout: Duration,
    f: impl Fn(&str) -> bool,
) -> Vec<String> {
    let deadline = Instant::now() + timeout;
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(l) => {
                let hit = f(&l);
                seen.push(l);
                if hit {
                    return seen;
                }
            }
            Err(_) => panic!("no such line within {timeout:?}; saw {seen:?}"),
        }
    }
}

#[test]
fn describe_shows_states_probes_cgroup_and_events() {
    let mut n = Nodelet::new("clidescribe");
    n.start();
    let node = n.node.clone();
    n.write_manifest(
        "two.yaml",
        &pod(
            "two",
            &format!("  volumes: [{{name: scratch, emptyDir: {{}}}}]\n  containers:\n  - name: a\n    image: {BUSY}\n    command: [sh, -c, 'echo dying; exit 3']\n    resources: {{limits: {{memory: 64Mi}}, requests: {{memory: 32Mi}}}}\n  - name: b\n    image: {BUSY}\n    command: [sleep, '3600']\n    env: [{{name: POD_NAME, valueFrom: {{fieldRef: {{fieldPath: metadata.name}}}}}}]\n    livenessProbe: {{exec: {{command: ['true']}}, periodSeconds: 7}}\n    volumeMounts: [{{name: scratch, mountPath: /data}}]\n"),
        ),
    );
    let name = format!("two-{node}");
    let mut text = String::new();
    wait_until(Duration::from_secs(60), "a restart of a", || {
        text = stdout(&cli(&n, &["describe", "pod", "two"]));
        text.contains("Last State:     Terminated") && text.contains("BackOff")
    });
    for want in [
        &format!("Name:         {name}") as &str,
        "Namespace:    default",
        "Status:       Running",
        "Exit Code:    3",
        "Liveness:       exec [true] delay=0s timeout=1s period=7s #success=1 #failure=3",
        "/data from scratch (rw)",
        "QoS Class:",
        "Burstable",
        "EmptyDir (a temporary directory that shares a pod's lifetime)",
        "Type     Reason",
    ] {
        assert!(text.contains(want), "{want:?} missing:\n{text}");
    }
    // Restart Count of a is at least 1; kubectl's events block with a count.
    assert!(
        text.lines()
            .any(|l| l.trim_start().starts_with("Restart Count:")
                && l.trim().ends_with(|c: char| c != '0')),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.contains("Warning") && l.contains("BackOff") && l.contains("nodelet")),
        "{text}"
    );
    // An environment variable from a field: its value and the field, as kubectl shows it.
    assert!(
        text.lines().any(|l| l.trim_start().starts_with("POD_NAME:")
            && l.trim_end()
                .ends_with(&format!("two-{node} (v1:metadata.name)"))),
        "{text}"
    );
    // The cgroup it names is the pod's, in the memory hierarchy, with a's limit under it.
    let cgroup = text
        .lines()
        .find_map(|l| l.strip_prefix("Cgroup:"))
        .unwrap()
        .trim()
        .to_owned();
    let uid = n.uid("two");
    assert!(cgroup.ends_with(&format!("pod{uid}")), "{cgroup}");
    let dir = nodelet::cm::cgroup_mounts()
        .into_iter()
        .map(|m| m.join(cgroup.trim_start_matches('/')))
        .find(|d| d.join("memory.limit_in_bytes").exists() || d.join("memory.max").exists());
    assert!(dir.is_some(), "no memory cgroup at {cgroup}");
    // Several containers and no -c: the first, as kubectl (1.21 on) picks it, said on stderr,
    // for logs and exec alike (a crash-loops: exec may find it stopped, logs reads it anyway).
    for args in [&["logs", "two"][..], &["exec", "two", "--", "true"][..]] {
        let o = cli(&n, args);
        assert!(
            stderr(&o).starts_with("Defaulted container \"a\" out of: a, b\n"),
            "{args:?}: {}",
            stderr(&o)
        );
        if args[0] == "logs" {
            assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        }
    }
    let o = cli(&n, &["logs", "two", "-c", "z"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("choose one of: [a b]"),
        "{}",
        stderr(&o)
    );
    // logs -p: the instance before the restart.
    let o = cli(&n, &["logs", "two", "-c", "a", "-p"]);
    assert_eq!(stdout(&o), "dying\n", "{}", stderr(&o));
}

#[test]
fn logs_follow_goes_on_across_rotation() {
    let mut n = Nodelet::with_config(
        "clilogs",
        "containerLogMaxSize: 2Ki\ncontainerLogMonitorInterval: 300ms\n",
    );
    n.start();
    n.write_manifest("chatty.yaml", &pod("chatty", &format!("  containers:\n  - {{name: c, image: {BUSY}, command: [sh, -c, 'sleep 3; i=0; while [ $i -lt 300 ]; do echo line $i; i=$((i+1)); sleep 0.02; done; echo done; sleep 3; echo last; sleep 3600']}}\n")));
    let name = format!("chatty-{}", n.node);
    let uid = wait_uid(&n, "chatty");
    n.wait_running(&uid, &["c"], Duration::from_secs(30));
    let mut follow = Command::new(env!("CARGO_BIN_EXE_nodelet"))
        .args(["logs", "-f", "chatty", "--root-dir"])
        .arg(n.root())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let rx = lines_of(follow.stdout.take().unwrap());
    let lines = wait_line(&rx, Duration::from_secs(60), |l| l == "done");
    let _ = follow.kill();
    let _ = follow.wait();
    let want: Vec<String> = (0..300)
        .map(|i| format!("line {i}"))
        .chain(["done".to_string()])
        .collect();
    assert_eq!(lines, want, "every line once, in order");
    let dir = n.logs().join(format!("default_{name}_{uid}")).join("c");
    let rotated = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("0.log."))
        .count();
    assert!(rotated >= 1, "no rotation in {}", dir.display());
    // --tail and --timestamps, on the line written 3 s after the burst: a rotation that came
    // after "done" (the file over 2 KiB when the monitor looked) leaves the current file empty
    // until then, and `logs` reads the current file only, as kubelet's.
    let mut t = String::new();
    poll(Duration::from_secs(30), || {
        t = stdout(&cli(&n, &["logs", "chatty", "--tail", "1", "--timestamps"]));
        t.ends_with(" last\n")
    });
    assert_eq!(t.lines().count(), 1, "{t}");
    let (ts, rest) = t.trim_end().split_once(' ').unwrap();
    assert_eq!(rest, "last");
    assert!(ts.parse::<jiff::Timestamp>().is_ok(), "{ts}");
}

fn wait_uid(n: &Nodelet, name: &str) -> String {
    wait_until(Duration::from_secs(20), "the pod listed", || {
        n.pod(name).is_some()
    });
    n.uid(name)
}

#[test]
fn exec_passes_the_exit_status_and_drives_a_terminal() {
    let mut n = Nodelet::new("cliexec");
    n.start();
    n.write_manifest(
        "sh.yaml",
        &pod(
            "sh",
            &format!("  containers:\n  - {{name: c, image: {BUSY}, command: [sleep, '3600']}}\n"),
        ),
    );
    let uid = wait_uid(&n, "sh");
    n.wait_running(&uid, &["c"], Duration::from_secs(30));
    let o = cli(
        &n,
        &[
            "exec",
            "sh",
            "--",
            "sh",
            "-c",
            "echo out; echo err >&2; exit 7",
        ],
    );
    assert_eq!(o.status.code(), Some(7));
    assert_eq!(
        (stdout(&o).as_str(), stderr(&o).as_str()),
        ("out\n", "err\n")
    );
    assert_eq!(
        cli(&n, &["exec", "sh", "--", "true"]).status.code(),
        Some(0)
    );
    // -i: input reaches the command.
    let mut child = Command::new(env!("CARGO_BIN_EXE_nodelet"))
        .args(["exec", "-i", "sh", "--root-dir"])
        .arg(n.root())
        .args(["--", "head", "-c", "12"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), b"twelve bytes").unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).as_ref()
        ),
        (Some(0), "twelve bytes")
    );

    // A client killed while the runtime does not read its input (a command that does not
    // read stdin, more input than the pipes hold): the agent lets both connections go.
    let pid = n.child.as_ref().unwrap().id();
    let fds = || {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .count()
    };
    let before = fds();
    let input = n.dir.path().join("input.bin");
    std::fs::write(&input, vec![b'x'; 50 << 20]).unwrap();
    for _ in 0..2 {
        let o = Command::new("timeout")
            .args(["3", env!("CARGO_BIN_EXE_nodelet"), "--root-dir"])
            .arg(n.root())
            .args(["exec", "-i", "sh", "--", "sleep", "1"])
            .stdin(std::fs::File::open(&input).unwrap())
            .output()
            .unwrap();
        assert!(o.status.code().is_some());
    }
    let mut now = fds();
    let back = poll(Duration::from_secs(15), || {
        now = fds();
        now <= before
    });
    assert!(
        back,
        "the agent holds {now} descriptors, {before} before the abandoned execs"
    );

    // -it in a real terminal (tmux): the window's size, a resize, a command typed and its
    // output, the shell's exit status.
    let session = format!("nodelet-{}", n.node);
    let tmux = |args: &[&str]| Command::new("tmux").args(args).output().unwrap();
    let cmd = format!(
        "{} exec -it sh --root-dir {} -- sh; echo EXIT=$?; sleep 60",
        env!("CARGO_BIN_EXE_nodelet"),
        n.root().display()
    );
    assert!(tmux(&[
        "new-session",
        "-d",
        "-s",
        &session,
        "-x",
        "120",
        "-y",
        "40",
        &cmd
    ])
    .status
    .success());
    let pane = |want: &str| {
        let mut text = String::new();
        wait_until(Duration::from_secs(20), want, || {
            text = String::from_utf8_lossy(&tmux(&["capture-pane", "-p", "-t", &session]).stdout)
                .into_owned();
            text.contains(want)
        });
        text
    };
    pane("/ #");
    tmux(&[
        "send-keys",
        "-t",
        &session,
        "stty size; echo $((6*7))",
        "Enter",
    ]);
    let t = pane("\n42");
    assert!(t.contains("40 120"), "{t}");
    tmux(&["resize-window", "-t", &session, "-x", "100", "-y", "30"]);
    tmux(&["send-keys", "-t", &session, "stty size", "Enter"]);
    pane("30 100");
    tmux(&["send-keys", "-t", &session, "exit 5", "Enter"]);
    pane("EXIT=5");
    tmux(&["kill-session", "-t", &session]);

    // Not running: the agent's message.
    n.write_manifest("sh.yaml", &pod("sh", &format!("  restartPolicy: Never\n  containers:\n  - {{name: c, image: {BUSY}, command: [sh, -c, 'exit 0']}}\n")));
    wait_until(Duration::from_secs(30), "sh completed", || {
        stdout(&cli(&n, &["get", "pods"])).contains("Completed")
    });
    let o = cli(&n, &["exec", "sh", "--", "true"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("is not running"), "{}", stderr(&o));
}

#[test]
fn top_events_and_completion() {
    let mut n = Nodelet::new("clitop");
    n.start();
    let node = n.node.clone();
    n.write_manifest("busy.yaml", &pod("busy", &format!("  containers:\n  - {{name: c, image: {BUSY}, command: [sh, -c, 'head -c 20m /dev/zero > /dev/shm/x; while true; do :; done']}}\n")));
    let uid = wait_uid(&n, "busy");
    n.wait_running(&uid, &["c"], Duration::from_secs(30));
    // top pods: a busy loop near a core, 20 MiB of shm in its working set.
    let mut t = String::new();
    wait_until(
        Duration::from_secs(30),
        "top with the busy pod's usage",
        || {
            t = stdout(&cli(&n, &["top", "pods"]));
            row(&t, &format!("busy-{node}")).is_some_and(|r| {
                let cpu: u64 = r[1].trim_end_matches('m').parse().unwrap_or(0);
                let mem: u64 = r[2].trim_end_matches("Mi").parse().unwrap_or(0);
                cpu >= 300 && mem >= 20
            })
        },
    );
    assert_eq!(
        t.lines()
            .next()
            .unwrap()
            .split_whitespace()
            .collect::<Vec<_>>(),
        ["NAME", "CPU(cores)", "MEMORY(bytes)"]
    );
    let t = stdout(&cli(&n, &["top", "node"]));
    let r = row(&t, &node).unwrap_or_else(|| panic!("{t}"));
    assert!(
        r[1].ends_with('m') && r[2].ends_with('%') && r[3].ends_with("Mi") && r[4].ends_with('%'),
        "{t}"
    );

    // events: the pod's Started; -w prints a new one as it comes.
    let e = stdout(&cli(&n, &["events"]));
    assert!(
        e.lines()
            .any(|l| l.contains("Started") && l.contains(&format!("pod/busy-{node}"))),
        "{e}"
    );
    let mut w = Command::new(env!("CARGO_BIN_EXE_nodelet"))
        .args(["events", "-w", "--root-dir"])
        .arg(n.root())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let rx = lines_of(w.stdout.take().unwrap());
    wait_line(&rx, Duration::from_secs(10), |l| l.contains("LAST SEEN"));
    n.write_manifest(
        "other.yaml",
        &pod(
            "other",
            &format!("  containers:\n  - {{name: c, image: {BUSY}, command: [sleep, '3600']}}\n"),
        ),
    );
    wait_line(&rx, Duration::from_secs(30), |l| {
        l.contains(&format!("pod/other-{node}")) && l.contains("Started")
    });
    let _ = w.kill();
    let _ = w.wait();

    // Completion: the script names the binary; the binary completes pod names from the agent.
    let script = stdout(&cli(&n, &["completion", "bash"]));
    assert!(
        script.contains("complete -o nospace") && script.contains("COMPLETE=\"bash\""),
        "{script}"
    );
    let o = Command::new(env!("CARGO_BIN_EXE_nodelet"))
        .args(["--", "nodelet", "logs", "bu"])
        .env("COMPLETE", "bash")
        .env("_CLAP_COMPLETE_INDEX", "2")
        .env("_CLAP_IFS", "\n")
        .env("NODELET_ROOT_DIR", n.root())
        .output()
        .unwrap();
    assert_eq!(stdout(&o).trim(), format!("busy-{node}"), "{}", stderr(&o));
}
