//! The binary's handling of its configuration: bad values stop it with exit code 2 and a message
//! naming the field and value, before anything starts. No runtime needed.
// Test code reads the machine's clocks and casts measurements freely.
#![allow(clippy::disallowed_methods, clippy::cast_possible_truncation)]

use std::process::Command;

/// `nodelet --config <file with config> --root-dir <tmp>`, or with `args` (a subcommand)
/// `nodelet <args> --config <file>`.
fn run_subcommand(args: &[&str], config: &str) -> std::process::Output {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.yaml");
    std::fs::write(&path, config).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_nodelet"));
    cmd.args(args).args(["--config", path.to_str().unwrap()]);
    if args.is_empty() {
        cmd.arg("--root-dir").arg(dir.path().join("root"));
    }
    cmd.env("NO_COLOR", "1").output().unwrap()
}

const HEAD: &str = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";

#[test]
fn invalid_values_exit_2_naming_field_and_value() {
    for (line, field, value) in [
        ("cgroupDriver: docker", "cgroupDriver", "docker"),
        ("syncFrequency: soon", "syncFrequency", "soon"),
        ("healthzPort: 99999", "healthzPort", "99999"),
        (
            "containerRuntimeEndpoint: tcp://127.0.0.1:1",
            "containerRuntimeEndpoint",
            "tcp://127.0.0.1:1",
        ),
        ("podLogsDir: logs", "podLogsDir", "logs"),
        (
            "syncFrequency: 99999999999999999999999s",
            "syncFrequency",
            "99999999999999999999999s",
        ),
        (
            "runtimeRequestTimeout: 99999999999999h",
            "runtimeRequestTimeout",
            "99999999999999h",
        ),
        ("fileCheckFrequency: 1ns", "fileCheckFrequency", "1ns"),
        (
            "cgroupsPerQOS: false",
            "enforceNodeAllocatable",
            "cgroupsPerQOS",
        ),
        (
            "crashLoopBackOff: {maxContainerRestartPeriod: 10m}",
            "crashLoopBackOff.maxContainerRestartPeriod",
            "10m0s",
        ),
    ] {
        for args in [&[][..], &["check-config"][..]] {
            let out = run_subcommand(args, &format!("{HEAD}{line}\n"));
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{args:?} {line}: {stderr}");
            assert!(
                stderr.contains(field) && stderr.contains(value),
                "{args:?} {line}: {stderr}"
            );
        }
    }
}

#[test]
fn unknown_fields_are_named_in_a_warning() {
    // Valid config whose runtime socket does not exist: the agent warns about unknown fields,
    // then waits for the runtime; we only read the start of its log.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.yaml");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    std::fs::write(
        &path,
        format!("{HEAD}registryPullQPS: 5\nfancyNewThing: true\ncontainerRuntimeEndpoint: unix://{}/none.sock\nhealthzPort: {port}\nport: 0\npodLogsDir: {}\n", dir.path().display(), dir.path().join("logs").display()),
    )
    .unwrap();
    let log = dir.path().join("stderr.log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_nodelet"))
        .args([
            "--config",
            path.to_str().unwrap(),
            "--root-dir",
            dir.path().join("root").to_str().unwrap(),
        ])
        .env("NO_COLOR", "1")
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("waiting for the container runtime")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "never waited for the runtime"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // Unhealthy while no relist has succeeded (kubelet's PLEG check).
    let health = reqwest::blocking::get(format!("http://127.0.0.1:{port}/healthz")).unwrap();
    assert_eq!(health.status().as_u16(), 500);
    assert!(health
        .text()
        .unwrap()
        .contains("pleg has yet to be successful"));
    let socket = dir.path().join("root").join("nodelet.sock");
    assert!(socket.exists(), "the local socket is served while waiting");
    // SIGTERM: the agent stops cleanly while still waiting for the runtime.
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status();
    let status = child.wait().unwrap();
    let stderr = std::fs::read_to_string(&log).unwrap();
    assert!(
        stderr.contains("registryPullQPS") && stderr.contains("fancyNewThing"),
        "{stderr}"
    );
    assert!(
        stderr.contains("waiting for the container runtime"),
        "{stderr}"
    );
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert!(
        !socket.exists(),
        "the stopped agent removed its local socket"
    );
}

#[test]
fn an_invalid_node_name_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.yaml");
    std::fs::write(
        &path,
        format!(
            "{HEAD}podLogsDir: {}\nhealthzPort: 0\n",
            dir.path().join("logs").display()
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_nodelet"))
        .args([
            "--config",
            path.to_str().unwrap(),
            "--hostname-override",
            "Bad_Node/x",
            "--root-dir",
        ])
        .arg(dir.path().join("root"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("bad_node/x"), "{stderr}");
}

#[test]
fn missing_config_file_exits_2() {
    let out = Command::new(env!("CARGO_BIN_EXE_nodelet"))
        .args(["--config", "/nonexistent/nodelet.yaml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/nodelet.yaml"));
}

#[test]
fn plan_prints_what_nodelet_would_do_and_refuses_bad_manifests() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.yaml");
    std::fs::write(&cfg, format!("{HEAD}systemReserved: {{memory: 1Gi}}\n")).unwrap();
    let write = |name: &str, body: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, body).unwrap();
        p
    };
    let g = write("g.yaml", "apiVersion: v1\nkind: Pod\nmetadata: {name: g}\nspec: {containers: [{name: c, image: busybox, resources: {limits: {cpu: 500m, memory: 128Mi}}}]}\n");
    let crit = write("crit.yaml", "apiVersion: v1\nkind: Pod\nmetadata: {name: crit}\nspec: {priorityClassName: system-node-critical, containers: [{name: c, image: busybox}]}\n");
    let bad = write("bad.yaml", "apiVersion: v1\nkind: Pod\nmetadata: {name: bad}\nspec: {containers: [{name: c, image: busybox, resources: {requests: {cpu: lots}}}]}\n");
    let run = |files: &[&std::path::Path]| {
        Command::new(env!("CARGO_BIN_EXE_nodelet"))
            .args([
                "plan",
                "--config",
                cfg.to_str().unwrap(),
                "--hostname-override",
                "n1",
                "--node-memory",
                "8Gi",
                "--node-cpu",
                "4",
            ])
            .args(files)
            .output()
            .unwrap()
    };
    let out = run(&[&g, &crit]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_yaml::Value = serde_yaml::from_slice(&out.stdout).unwrap();
    // 8Gi - systemReserved 1Gi - the default evictionHard memory.available 100Mi.
    assert_eq!(
        v["allocatable"]["memoryBytes"].as_i64(),
        Some((7 << 30) - (100 << 20))
    );
    assert_eq!(v["kubepods"]["cpuShares"].as_u64(), Some(4096));
    let g = &v["pods"][0];
    assert_eq!(g["qosClass"].as_str(), Some("Guaranteed"));
    assert!(g["podCgroup"]["path"]
        .as_str()
        .unwrap()
        .starts_with("/kubepods/pod"));
    assert_eq!(g["podCgroup"]["cpuQuota"].as_i64(), Some(50_000));
    assert_eq!(g["podCgroup"]["memoryLimit"].as_i64(), Some(128 << 20));
    assert_eq!(g["containers"][0]["oomScoreAdj"].as_i64(), Some(-997));
    let c = &v["pods"][1];
    assert_eq!(c["qosClass"].as_str(), Some("BestEffort"));
    assert_eq!(
        c["containers"][0]["oomScoreAdj"].as_i64(),
        Some(-997),
        "node-critical static pod"
    );

    assert_eq!(g["admission"]["admitted"].as_bool(), Some(true));

    // Admission: the manifests before each count as running; refusals carry kubelet's reason
    // and message, and are not counted for the next.
    let big = write("big.yaml", "apiVersion: v1\nkind: Pod\nmetadata: {name: big}\nspec: {containers: [{name: c, image: busybox, resources: {requests: {cpu: '3'}}}]}\n");
    let more = write("more.yaml", "apiVersion: v1\nkind: Pod\nmetadata: {name: more}\nspec: {containers: [{name: c, image: busybox, resources: {requests: {cpu: '2'}}}]}\n");
    let ssd = write("ssd.yaml", "apiVersion: v1\nkind: Pod\nmetadata: {name: ssd}\nspec: {nodeSelector: {disktype: ssd}, containers: [{name: c, image: busybox}]}\n");
    let small = write("small.yaml", "apiVersion: v1\nkind: Pod\nmetadata: {name: small}\nspec: {containers: [{name: c, image: busybox, resources: {requests: {cpu: '1'}}}]}\n");
    let out = run(&[&big, &more, &ssd, &small]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "a refusal is a planned outcome, not an error"
    );
    let v: serde_yaml::Value = serde_yaml::from_slice(&out.stdout).unwrap();
    let admission = |i: usize| {
        let a = &v["pods"][i]["admission"];
        (
            a["admitted"].as_bool().unwrap(),
            a["reason"].as_str().map(str::to_owned),
            a["message"].as_str().map(str::to_owned),
        )
    };
    assert_eq!(admission(0), (true, None, None));
    assert_eq!(
        admission(1),
        (
            false,
            Some("OutOfcpu".into()),
            Some("Pod was rejected: Node didn't have enough resource: cpu, requested: 2000, used: 3000, capacity: 4000".into())
        )
    );
    assert_eq!(admission(2).1.as_deref(), Some("NodeAffinity"));
    assert_eq!(
        admission(3),
        (true, None, None),
        "1 cpu still fits beside 3"
    );

    let out = run(&[&bad]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("bad.yaml") && stderr.contains("spec.containers[0].resources.requests.cpu"),
        "{stderr}"
    );
}

/// Runs `nodelet [subcommand] --config <file with HEAD + config>` plus `extra` arguments.
fn run_command(subcommand: &[&str], config: &str, extra: &[&str]) -> std::process::Output {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.yaml");
    std::fs::write(&path, format!("{HEAD}{config}")).unwrap();
    let manifest = dir.path().join("p.yaml");
    std::fs::write(
        &manifest,
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: c, image: busybox}]}\n",
    )
    .unwrap();
    Command::new(env!("CARGO_BIN_EXE_nodelet"))
        .arg("--root-dir")
        .arg(dir.path().join("root"))
        .args(subcommand)
        .args(["--config", path.to_str().unwrap()])
        .args(["--hostname-override", "n1"])
        .args(extra)
        .args(if subcommand == ["plan"] {
            vec![manifest.to_str().unwrap().to_owned()]
        } else {
            vec![]
        })
        .env("NO_COLOR", "1")
        .output()
        .unwrap()
}

#[test]
fn reservations_that_overflow_exit_2_on_run_check_config_and_plan() {
    for (config, field, value) in [
        (
            "kubeReserved: {cpu: \"1e16\"}\n",
            "kubeReserved",
            "cpu=1e16",
        ),
        (
            "systemReserved: {memory: 7Ei}\nkubeReserved: {memory: 7Ei}\n",
            "systemReserved + kubeReserved",
            "memory=7Ei + memory=7Ei",
        ),
    ] {
        for subcommand in [&[][..], &["check-config"], &["plan"]] {
            let out = run_command(subcommand, config, &[]);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(
                out.status.code(),
                Some(2),
                "{subcommand:?} {config}: {stderr}"
            );
            assert!(
                stderr.contains(&format!("for field {field}:")) && stderr.contains(value),
                "{subcommand:?} {config}: {stderr}"
            );
            assert!(out.stdout.is_empty(), "{subcommand:?}: nothing printed");
        }
    }
}

#[test]
fn plan_refuses_capacities_that_do_not_fit_naming_the_flag() {
    for (flag, value, reason) in [
        ("--node-cpu", "1e17", "at most 9223372036854775807m"),
        ("--node-memory", "8Ei", "too large"),
        ("--node-memory", "1e19", "too large"),
    ] {
        let out = run_command(&["plan"], "", &[flag, value]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag} {value}: {stderr}");
        assert!(
            stderr.contains(flag) && stderr.contains(value) && stderr.contains(reason),
            "{flag} {value}: {stderr}"
        );
    }
}

#[test]
fn check_config_prints_the_file_in_kubelets_spelling() {
    let out = run_command(
        &["check-config"],
        "kubeReserved: {cpu: 500m}\nevictionHard: {memory.available: 200Mi}\n",
        &[],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_yaml::Value = serde_yaml::from_slice(&out.stdout).unwrap();
    assert_eq!(v["kubeReserved"]["cpu"].as_str(), Some("500m"));
    assert_eq!(
        v["evictionHard"]["memory.available"].as_str(),
        Some("200Mi")
    );
    assert_eq!(v["syncFrequency"].as_str(), Some("1m0s"));
    assert_eq!(v["containerLogMaxSize"].as_str(), Some("10Mi"));
    assert_eq!(v["cgroupsPerQOS"].as_bool(), Some(true));
}

#[test]
fn check_config_reads_the_kubeconfig_and_never_prints_its_content() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.kubeconfig");
    let out = run_command(
        &["check-config"],
        "",
        &["--kubeconfig", missing.to_str().unwrap()],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("missing.kubeconfig"), "{stderr}");
    let broken = dir.path().join("broken.kubeconfig");
    std::fs::write(
        &broken,
        "apiVersion: v1\nkind: Config\nusers:\n- name: n\n  user:\n    token: SUPERSECRETTOKEN123\n    client-key-data: \"LS0tLS1CRUdJTi\n",
    )
    .unwrap();
    let out = run_command(
        &["check-config"],
        "",
        &["--kubeconfig", broken.to_str().unwrap()],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("broken.kubeconfig") && stderr.contains("line 7"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("SUPERSECRET") && !stderr.contains("LS0t"),
        "{stderr}"
    );
}

#[test]
fn logs_refuses_a_tail_below_minus_one_before_asking_the_agent() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_nodelet"))
        .arg("--root-dir")
        .arg(dir.path())
        .args(["logs", "web", "--tail=-5"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--tail") && stderr.contains("-5"),
        "{stderr}"
    );
    // -1 (all lines) is accepted: the command goes on to find no agent.
    let out = Command::new(env!("CARGO_BIN_EXE_nodelet"))
        .arg("--root-dir")
        .arg(dir.path())
        .args(["logs", "web", "--tail", "-1"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("nodelet is not running"), "{stderr}");
}
