//! The node API (port 10250's server) on the real containerd: HTTPS with kubelet's
//! authentication (a client certificate of the configured CA; none, or one of another CA, is
//! 401), `/pods`, `/containerLogs` with kubelet's parameters (tail, timestamps, byte limit,
//! follow), 404 and 400 naming what is wrong, a client that sends nothing cut off without
//! holding anyone else up, and followers that leave giving back every descriptor they held;
//! exec relayed for SPDY and WebSocket clients alike; `/run`; the stats (cgroups, network,
//! volumes, logs, ephemeral storage) and the read-only port, which serves them and nothing
//! that reaches into a container.
// Test code reads the machine's clocks and casts measurements freely.
#![allow(clippy::disallowed_methods, clippy::cast_possible_truncation)]

mod common;

use std::io::{Read, Write};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{wait_until, Nodelet};

/// A CA, and a client certificate it signed (CN `alice`, O `team`), written as PEM files in
/// `dir`: `ca.crt`, `client.crt`, `client.key`.
fn pki(dir: &Path, name: &str) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, format!("{name}-ca"));
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let mut client = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    client
        .distinguished_name
        .push(rcgen::DnType::CommonName, "alice");
    client
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, "team");
    client.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let cert = client.signed_by(&key, &ca_cert, &ca_key).unwrap();
    std::fs::write(dir.join(format!("{name}-ca.crt")), ca_cert.pem()).unwrap();
    std::fs::write(dir.join(format!("{name}-client.crt")), cert.pem()).unwrap();
    std::fs::write(dir.join(format!("{name}-client.key")), key.serialize_pem()).unwrap();
}

/// A client of the node API, with the client certificate `name` of `dir` (none: anonymous).
fn client(dir: &Path, name: Option<&str>) -> reqwest::blocking::Client {
    let mut b = reqwest::blocking::Client::builder()
        .danger_accept_invalid_certs(true)
        .timeout(Duration::from_secs(20));
    if let Some(n) = name {
        let mut pem = std::fs::read(dir.join(format!("{n}-client.crt"))).unwrap();
        pem.extend(std::fs::read(dir.join(format!("{n}-client.key"))).unwrap());
        b = b.identity(reqwest::Identity::from_pem(&pem).unwrap());
    }
    b.build().unwrap()
}

const TALKER: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: talker}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    image: busybox:1.36\n    command: [sh, -c, 'i=0; while true; do echo line $i; i=$((i+1)); sleep 0.2; done']\n";

/// A started nodelet for `test` whose node API trusts the CA `good` made in `certs` and allows
/// whoever it authenticates.
fn agent(test: &str, certs: &Path) -> Nodelet {
    agent_with(test, certs, "")
}

/// [`agent`] with more configuration `extra`.
fn agent_with(test: &str, certs: &Path, extra: &str) -> Nodelet {
    pki(certs, "good");
    let mut n = Nodelet::with_config(
        test,
        &format!(
            "authentication: {{x509: {{clientCAFile: {}}}}}\nauthorization: {{mode: AlwaysAllow}}\n{extra}",
            certs.join("good-ca.crt").display()
        ),
    );
    n.start();
    n
}

/// The talker pod on `n`, running: its UID.
fn run_talker(n: &Nodelet) -> String {
    n.write_manifest("talker.yaml", TALKER);
    let uid = n.uid("talker");
    n.wait_running(&uid, &["c"], Duration::from_secs(30));
    uid
}

/// An SPDY exec upgrade request to `url` by curl as client `good` of `certs`, given at most
/// `secs`: the status code and the body.
fn curl_exec(certs: &Path, url: &str, secs: u32) -> (String, String) {
    let body = certs.join("body");
    let _ = std::fs::remove_file(&body);
    let out = std::process::Command::new("curl")
        .args(["-sk", "-o"])
        .arg(&body)
        .args([
            "-w",
            "%{http_code}",
            "--max-time",
            &secs.to_string(),
            "-X",
            "POST",
        ])
        .args(["-H", "Connection: Upgrade", "-H", "Upgrade: SPDY/3.1"])
        .args(["-H", "X-Stream-Protocol-Version: v4.channel.k8s.io"])
        .arg("--cert")
        .arg(certs.join("good-client.crt"))
        .arg("--key")
        .arg(certs.join("good-client.key"))
        .arg(url)
        .output()
        .unwrap();
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        std::fs::read_to_string(&body).unwrap_or_default(),
    )
}

/// nodelet's open descriptors.
fn fds(n: &Nodelet) -> usize {
    let pid = n.child.as_ref().unwrap().id();
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

#[test]
fn logs_over_https_with_kubelets_authentication_and_parameters() {
    let certs = tempfile::tempdir().unwrap();
    pki(certs.path(), "other");
    let n = agent("nodeapi", certs.path());
    let uid = run_talker(&n);
    let base = format!("https://127.0.0.1:{}", n.api_port);
    let good = client(certs.path(), Some("good"));
    let pod = format!("talker-{}", n.node);

    // Authentication: none, or another CA's certificate, is 401 on every path.
    for c in [
        client(certs.path(), None),
        client(certs.path(), Some("other")),
    ] {
        for path in [
            "/pods",
            "/healthz",
            &format!("/containerLogs/default/{pod}/c"),
        ] {
            let r = c.get(format!("{base}{path}")).send().unwrap();
            assert_eq!(r.status(), 401, "{path}");
            assert_eq!(r.text().unwrap(), "Unauthorized");
        }
    }
    let pods: serde_json::Value = good
        .get(format!("{base}/pods"))
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert!(pods["items"]
        .as_array()
        .unwrap()
        .iter()
        .any(|p| p["metadata"]["uid"] == uid.as_str()));

    // Logs: the last lines, with times, within a byte limit.
    let logs = |q: &str| {
        let r = good
            .get(format!("{base}/containerLogs/default/{pod}/c{q}"))
            .send()
            .unwrap();
        (r.status().as_u16(), r.text().unwrap())
    };
    wait_until(Duration::from_secs(10), "three lines logged", || {
        logs("").1.lines().count() >= 3
    });
    let (code, all) = logs("");
    assert_eq!(code, 200);
    assert!(all.starts_with("line 0\nline 1\n"), "{all}");
    let (_, tail) = logs("?tailLines=2");
    assert_eq!(tail.lines().count(), 2, "{tail}");
    assert!(tail.lines().all(|l| l.starts_with("line ")), "{tail}");
    let (_, stamped) = logs("?tailLines=1&timestamps=true");
    let (time, text) = stamped.trim_end().split_once(' ').unwrap();
    assert!(
        time.parse::<k8s_openapi::jiff::Timestamp>().is_ok() && text.starts_with("line "),
        "{stamped}"
    );
    assert_eq!(logs("?limitBytes=5"), (200, "line ".to_string()));
    // What is wrong is named.
    let (code, msg) = logs("?tailLines=-3");
    assert_eq!(code, 400);
    assert!(msg.contains("tailLines"), "{msg}");
    let r = good
        .get(format!("{base}/containerLogs/default/{pod}/nope"))
        .send()
        .unwrap();
    assert_eq!(r.status(), 404);
    assert!(r.text().unwrap().contains("\"nope\""));
    let r = good
        .get(format!("{base}/containerLogs/default/ghost/c"))
        .send()
        .unwrap();
    assert_eq!(r.status(), 404);
    assert!(r.text().unwrap().contains("ghost"));
    let (code, msg) = logs("?previous=true");
    assert_eq!(code, 400, "{msg}");
    // A time before 1677 (outside i64 nanoseconds) is before every line.
    let (code, early) = logs("?sinceTime=1600-01-01T00:00:00Z&tailLines=1");
    assert_eq!((code, early.lines().count()), (200, 1), "{early}");
    // A WebSocket port-forward names its ports in the query: none is a 400, as kubelet's.
    let r = good
        .get(format!("{base}/portForward/default/{pod}"))
        .header("Connection", "Upgrade")
        .header("Upgrade", "websocket")
        .header("Sec-WebSocket-Version", "13")
        .header("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
        .header("Sec-WebSocket-Protocol", "v4.channel.k8s.io")
        .send()
        .unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(
        r.text().unwrap().trim(),
        "query parameter \"port\" is required"
    );

    // follow: new lines keep coming.
    let mut follow = good
        .get(format!(
            "{base}/containerLogs/default/{pod}/c?follow=true&tailLines=0"
        ))
        .send()
        .unwrap();
    let mut got = String::new();
    let mut buf = [0u8; 256];
    let deadline = Instant::now() + Duration::from_secs(10);
    while got.lines().count() < 3 {
        assert!(Instant::now() < deadline, "follow brought {got:?}");
        let k = follow.read(&mut buf).unwrap();
        assert!(k > 0, "the follow ended: {got:?}");
        got.push_str(std::str::from_utf8(&buf[..k]).unwrap());
    }
    drop(follow);

    // 100 followers that leave: every descriptor given back.
    let before = fds(&n);
    for _ in 0..100 {
        let r = good
            .get(format!("{base}/containerLogs/default/{pod}/c?follow=true"))
            .send()
            .unwrap();
        assert_eq!(r.status(), 200);
        drop(r);
    }
    wait_until(Duration::from_secs(20), "descriptors given back", || {
        fds(&n) <= before + 2
    });
}

#[test]
fn a_client_that_sends_nothing_is_cut_off_and_holds_no_one_up() {
    let certs = tempfile::tempdir().unwrap();
    let ro = common::free_port();
    let n = agent_with("slowclient", certs.path(), &format!("readOnlyPort: {ro}\n"));
    // On the node API, the healthz port and the read-only port alike (the last two need no
    // credentials): connections that send nothing.
    let ports = [n.api_port, n.port, ro];
    let mut idle: Vec<std::net::TcpStream> = ports
        .iter()
        .map(|p| std::net::TcpStream::connect(("127.0.0.1", *p)).unwrap())
        .collect();
    let opened = Instant::now();
    // Others are served meanwhile.
    let r = client(certs.path(), Some("good"))
        .get(format!("https://127.0.0.1:{}/healthz", n.api_port))
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
    for (port, idle) in ports.iter().zip(&mut idle) {
        idle.set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let mut buf = [0u8; 16];
        let k = idle.read(&mut buf).unwrap_or(0);
        assert_eq!(k, 0, "port {port}: closed without an answer");
        let waited = opened.elapsed();
        assert!(
            waited >= Duration::from_secs(9) && waited < Duration::from_secs(25),
            "port {port}: cut off after {waited:?}"
        );
        let _ = idle.write_all(b"late");
    }
    // More connections than a listener serves at once: the ones over the limit are closed at
    // once, and the agent answers when they are gone.
    let many: Vec<std::net::TcpStream> = (0..nodelet::server::MAX_CONNECTIONS + 50)
        .filter_map(|_| std::net::TcpStream::connect(("127.0.0.1", ro)).ok())
        .collect();
    let closed = many
        .iter()
        .skip(nodelet::server::MAX_CONNECTIONS)
        .filter(|c| {
            let mut c: &std::net::TcpStream = c;
            c.set_read_timeout(Some(Duration::from_millis(500)))
                .unwrap();
            let mut buf = [0u8; 1];
            matches!(c.read(&mut buf), Ok(0))
        })
        .count();
    assert!(
        closed >= 45,
        "{closed} of the 50 over the limit closed at once"
    );
    drop(many);
    wait_until(
        Duration::from_secs(10),
        "the read-only port to answer",
        || {
            reqwest::blocking::get(format!("http://127.0.0.1:{ro}/healthz"))
                .is_ok_and(|r| r.status() == 200)
        },
    );
}

#[test]
fn stats_summary_and_resource_metrics_read_the_cgroups_and_the_runtime() {
    let certs = tempfile::tempdir().unwrap();
    let n = agent("nodestats", certs.path());
    let uid = run_talker(&n);
    let pod = format!("talker-{}", n.node);
    let base = format!("https://127.0.0.1:{}", n.api_port);
    let good = client(certs.path(), Some("good"));
    let summary = || -> serde_json::Value {
        good.get(format!("{base}/stats/summary"))
            .send()
            .unwrap()
            .json()
            .unwrap()
    };
    let ours = |s: &serde_json::Value| {
        s["pods"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["podRef"]["uid"] == uid.as_str())
            .cloned()
            .unwrap_or_default()
    };
    wait_until(Duration::from_secs(20), "the container's usage", || {
        let p = ours(&summary());
        p["containers"][0]["cpu"]["usageCoreNanoSeconds"]
            .as_u64()
            .unwrap_or(0)
            > 0
            && p["containers"][0]["memory"]["workingSetBytes"]
                .as_u64()
                .unwrap_or(0)
                > 0
    });
    let s = summary();
    assert!(s["node"]["cpu"]["usageCoreNanoSeconds"].as_u64().unwrap() > 0);
    assert!(s["node"]["memory"]["workingSetBytes"].as_u64().unwrap() > 0);
    assert!(
        s["node"]["cpu"]["usageNanoCores"].as_u64().is_some(),
        "a rate from the second summary on"
    );
    let p = ours(&s);
    assert_eq!(p["podRef"]["name"], pod.as_str());
    assert_eq!(p["containers"][0]["name"], "c");
    // The pod's memory is its pod cgroup's working set (usage less inactive_file), read then.
    let memcg = common::pod_cgroup_dirs(&n.cgroup_root, &uid)
        .into_iter()
        .find(|d| d.join("memory.usage_in_bytes").exists() || d.join("memory.current").exists())
        .unwrap();
    let file_ws = nodelet::eviction::signals::working_set_any(&memcg).unwrap();
    let reported = p["memory"]["workingSetBytes"].as_i64().unwrap();
    assert!(
        (reported - file_ws).abs() < 4 << 20,
        "reported {reported}, the cgroup's {file_ws}"
    );
    assert!(p["cpu"]["usageCoreNanoSeconds"].as_u64().unwrap() > 0);

    // metrics-server's series, with kubelet's labels and sample times, no zero.
    let text = good
        .get(format!("{base}/metrics/resource"))
        .send()
        .unwrap()
        .text()
        .unwrap();
    let labels = format!("{{container=\"c\",namespace=\"default\",pod=\"{pod}\"}}");
    for series in [
        "container_cpu_usage_seconds_total",
        "container_memory_working_set_bytes",
        "container_start_time_seconds",
    ] {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("{series}{labels} ")))
            .unwrap_or_else(|| panic!("{series} in {text}"));
        let mut f = line.rsplit(' ');
        let ms: i64 = f.next().unwrap().parse().unwrap();
        let value: f64 = f.next().unwrap().parse().unwrap();
        assert!(value > 0.0, "{line}");
        assert!(ms > 1_700_000_000_000, "a sample time in ms: {line}");
    }
    for series in [
        "node_cpu_usage_seconds_total ",
        "node_memory_working_set_bytes ",
    ] {
        assert!(text.lines().any(|l| l.starts_with(series)), "{series}");
    }
    assert!(text.contains(&format!(
        "pod_memory_working_set_bytes{{namespace=\"default\",pod=\"{pod}\"}}"
    )));

    // cAdvisor's container series, from the container's own cgroup.
    let text = good
        .get(format!("{base}/metrics/cadvisor"))
        .send()
        .unwrap()
        .text()
        .unwrap();
    let id = n.wait_running(&uid, &["c"], Duration::from_secs(5))["c"]
        .id
        .clone();
    let sample = |series: &str| -> f64 {
        let line = text
            .lines()
            .find(|l| {
                l.starts_with(&format!("{series}{{container=\"c\","))
                    && l.contains(&format!("name=\"{id}\""))
                    && l.contains(&format!("pod=\"{pod}\""))
            })
            .unwrap_or_else(|| panic!("{series} in {text}"));
        line.rsplit(' ').nth(1).unwrap().parse().unwrap()
    };
    assert!(sample("container_cpu_usage_seconds_total") > 0.0);
    assert!(sample("container_memory_working_set_bytes") > 0.0);
    assert!(sample("container_memory_usage_bytes") >= sample("container_memory_working_set_bytes"));
    assert_eq!(sample("container_spec_memory_limit_bytes"), 0.0, "no limit");
    assert_eq!(sample("container_oom_events_total"), 0.0);
    assert!(text.contains("machine_cpu_cores "));
}

/// A pod that writes 4 MiB into an emptyDir and a line to its log, then waits.
const FILLER: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: filler}\nspec:\n  terminationGracePeriodSeconds: 1\n  volumes: [{name: scratch, emptyDir: {}}]\n  containers:\n  - name: c\n    image: busybox:1.36\n    volumeMounts: [{name: scratch, mountPath: /scratch}]\n    command: [sh, -c, 'dd if=/dev/zero of=/scratch/f bs=1M count=4 && echo filled; sleep 3600']\n";

/// The summary's network and storage figures: the pod's `eth0` counts what reaches its
/// namespace, its emptyDir holds what the container wrote, its log directory and ephemeral
/// storage add up, and the node's and the runtime's filesystems are there; `/metrics/cadvisor`
/// carries the same interface.
#[test]
fn summary_reports_network_volumes_logs_and_ephemeral_storage() {
    let certs = tempfile::tempdir().unwrap();
    let n = agent("nodestorage", certs.path());
    n.write_manifest("filler.yaml", FILLER);
    let uid = n.uid("filler");
    n.wait_running(&uid, &["c"], Duration::from_secs(30));
    let base = format!("https://127.0.0.1:{}", n.api_port);
    let good = client(certs.path(), Some("good"));
    // The summary (with `query`) and our pod in it.
    let summary_of = |query: &str| -> (serde_json::Value, serde_json::Value) {
        let s: serde_json::Value = good
            .get(format!("{base}/stats/summary{query}"))
            .send()
            .unwrap()
            .json()
            .unwrap();
        let p = s["pods"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["podRef"]["uid"] == uid.as_str())
            .cloned()
            .unwrap_or_default();
        (s, p)
    };
    let ours = || summary_of("");
    let used = |v: &serde_json::Value| v["usedBytes"].as_i64().unwrap_or(0);
    wait_until(Duration::from_secs(20), "the emptyDir's 4 MiB", || {
        let (_, p) = ours();
        p["volume"]
            .as_array()
            .and_then(|v| v.iter().find(|v| v["name"] == "scratch"))
            .is_some_and(|v| used(v) >= 4 << 20)
    });
    let (s, p) = ours();
    let vol = p["volume"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "scratch")
        .unwrap()
        .clone();
    assert!(used(&vol) < 5 << 20, "{vol}");
    assert_eq!(vol["inodesUsed"], 2, "the directory and f: {vol}");
    assert!(vol["capacityBytes"].as_i64().unwrap() >= vol["availableBytes"].as_i64().unwrap());
    let logs = &p["containers"][0]["logs"];
    assert!(used(logs) > 0, "the container's log: {p}");
    let eph = &p["ephemeral-storage"];
    assert!(
        used(eph) >= used(&vol) + used(logs),
        "ephemeral storage counts the volume and the log: {p}"
    );
    assert!(s["node"]["fs"]["capacityBytes"].as_i64().unwrap() > 0);
    assert!(used(&s["node"]["fs"]) > 0);
    assert!(
        used(&s["node"]["runtime"]["imageFs"]) > 0,
        "the runtime's images: {}",
        s["node"]
    );
    assert!(
        !s["node"]["network"]["interfaces"]
            .as_array()
            .unwrap()
            .is_empty(),
        "{}",
        s["node"]["network"]
    );

    // What reaches the pod's namespace shows on its eth0: connections to a closed port of the
    // pod's address (each a SYN in, a RST out).
    let pod_ip = || {
        n.pod("filler")
            .and_then(|p| p["status"]["podIP"].as_str().map(str::to_owned))
    };
    // The status follows the runtime by up to a relist.
    wait_until(
        Duration::from_secs(10),
        "the pod's IP in its status",
        || pod_ip().is_some(),
    );
    let ip = pod_ip().unwrap();
    let rx = |p: &serde_json::Value| p["network"]["rxBytes"].as_u64().unwrap();
    assert_eq!(p["network"]["name"], "eth0", "{p}");
    let before = rx(&p);
    for _ in 0..20 {
        let _ = std::net::TcpStream::connect_timeout(
            &format!("{ip}:9").parse().unwrap(),
            Duration::from_millis(200),
        );
    }
    wait_until(
        Duration::from_secs(10),
        "the pod's eth0 to count them",
        || rx(&ours().1) >= before + 20 * 40,
    );
    let text = good
        .get(format!("{base}/metrics/cadvisor"))
        .send()
        .unwrap()
        .text()
        .unwrap();
    let line = text
        .lines()
        .find(|l| {
            l.starts_with("container_network_receive_bytes_total{")
                && l.contains("interface=\"eth0\"")
                && l.contains(&format!("pod=\"filler-{}\"", n.node))
        })
        .unwrap_or_else(|| panic!("the pod's eth0 in {text}"));
    let value: u64 = line.rsplit(' ').nth(1).unwrap().parse().unwrap();
    assert!(value >= before + 20 * 40, "{line}");

    // What older metrics-server asks: cpu and memory alone.
    let (s, p) = summary_of("?only_cpu_and_memory=true");
    assert!(p["memory"]["workingSetBytes"].as_u64().unwrap() > 0, "{p}");
    assert!(p["containers"][0]["cpu"]["usageCoreNanoSeconds"]
        .as_u64()
        .is_some());
    for absent in ["volume", "network", "ephemeral-storage"] {
        assert!(p.get(absent).is_none(), "{absent} in {p}");
    }
    assert!(p["containers"][0].get("logs").is_none(), "{p}");
    assert!(s["node"].get("fs").is_none(), "{}", s["node"]);
}

/// `/run` answers with a command's output (kubelet's `handleRun`), and the read-only port
/// serves the stats paths without authentication but nothing that reaches into a container.
#[test]
fn run_gives_a_commands_output_and_the_read_only_port_serves_stats_alone() {
    let certs = tempfile::tempdir().unwrap();
    let ro = common::free_port();
    let n = agent_with("noderun", certs.path(), &format!("readOnlyPort: {ro}\n"));
    let uid = run_talker(&n);
    let pod = format!("talker-{}", n.node);
    let base = format!("https://127.0.0.1:{}", n.api_port);
    let good = client(certs.path(), Some("good"));
    let run = |path: &str| {
        let r = good.post(format!("{base}{path}")).send().unwrap();
        (r.status().as_u16(), r.text().unwrap())
    };
    assert_eq!(
        run(&format!("/run/default/{pod}/c?cmd=echo%20hi%20there")),
        (200, "hi there\n".to_owned())
    );
    assert_eq!(
        run(&format!(
            "/run/default/{pod}/{uid}/c?cmd=cat%20/proc/1/comm"
        ))
        .1,
        "sh\n",
        "the container's own processes"
    );
    let (code, body) = run(&format!("/run/default/{pod}/c?cmd=false"));
    assert_eq!(code, 500, "{body}");
    assert!(body.contains("command 'false' exited with 1"), "{body}");
    let (code, body) = run(&format!("/run/default/{pod}/c"));
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("cmd"), "{body}");
    let (code, body) = run(&format!("/run/default/{pod}/nope?cmd=true"));
    assert_eq!(code, 404, "{body}");
    assert!(body.contains("nope"), "{body}");
    let (code, _) = run("/run/default/nobody/c?cmd=true");
    assert_eq!(code, 404);

    // What an operator types on a standalone node: curl with a certificate of clientCAFile.
    let curl = |path: &str| {
        let out = std::process::Command::new("curl")
            .args(["-sfk", "--max-time", "20", "--cert"])
            .arg(certs.path().join("good-client.crt"))
            .arg("--key")
            .arg(certs.path().join("good-client.key"))
            .arg(format!("{base}{path}"))
            .output()
            .unwrap();
        assert!(out.status.success(), "curl {path}: {out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let line = curl(&format!("/containerLogs/default/{pod}/c?tailLines=1"));
    assert!(
        line.starts_with("line ") && line.lines().count() == 1,
        "{line:?}"
    );
    let s: serde_json::Value = serde_json::from_str(&curl("/stats/summary")).unwrap();
    assert_eq!(s["node"]["nodeName"], n.node.as_str());
    assert!(curl("/metrics/resource").contains("pod_memory_working_set_bytes{"));

    // The read-only port: plain HTTP, no credentials.
    let plain_http = reqwest::blocking::Client::new();
    let ro_get = |path: &str| {
        let r = plain_http
            .get(format!("http://127.0.0.1:{ro}{path}"))
            .send()
            .unwrap();
        (r.status().as_u16(), r.text().unwrap())
    };
    let (code, body) = ro_get("/stats/summary");
    assert_eq!(code, 200, "{body}");
    let s: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(
        s["pods"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["podRef"]["uid"] == uid.as_str()),
        "{s}"
    );
    for path in [
        "/metrics/resource",
        "/metrics/cadvisor",
        "/pods",
        "/healthz",
    ] {
        assert_eq!(ro_get(path).0, 200, "{path}");
    }
    for path in [
        format!("/containerLogs/default/{pod}/c"),
        format!("/exec/default/{pod}/c?command=id&output=1"),
        "/configz".to_owned(),
        "/runningpods/".to_owned(),
    ] {
        assert_eq!(ro_get(&path).0, 404, "{path} is not on the read-only port");
    }
}

/// Accepts any server certificate: the node's is self-signed (the tests check the client side).
#[derive(Debug)]
struct AnyServer(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyServer {
    fn verify_server_cert(
        &self,
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &[rustls::pki_types::CertificateDer<'_>],
        _: &rustls::pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        m: &[u8],
        c: &rustls::pki_types::CertificateDer<'_>,
        d: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(m, c, d, &self.0.signature_verification_algorithms)
    }
    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &rustls::pki_types::CertificateDer<'_>,
        d: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(m, c, d, &self.0.signature_verification_algorithms)
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// An exec over WebSocket (`v4.channel.k8s.io`, what client-go's WebSocket executor and most
/// libraries speak) on `n`'s node API as client `good` of `certs`: what arrived on stdout
/// (channel 1) and the status (channel 3).
fn websocket_exec(n: &Nodelet, certs: &Path, path: &str) -> (String, serde_json::Value) {
    use rustls::pki_types::pem::PemObject;
    use tungstenite::client::IntoClientRequest;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = rustls::pki_types::CertificateDer::pem_file_iter(certs.join("good-client.crt"))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let key =
        rustls::pki_types::PrivateKeyDer::from_pem_file(certs.join("good-client.key")).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyServer(provider)))
        .with_client_auth_cert(chain, key)
        .unwrap();
    let tcp = std::net::TcpStream::connect(("127.0.0.1", n.api_port)).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let conn =
        rustls::ClientConnection::new(Arc::new(config), "localhost".try_into().unwrap()).unwrap();
    let tls = rustls::StreamOwned::new(conn, tcp);
    let mut req = format!("wss://127.0.0.1:{}{path}", n.api_port)
        .into_client_request()
        .unwrap();
    req.headers_mut().insert(
        "Sec-WebSocket-Protocol",
        "v4.channel.k8s.io".parse().unwrap(),
    );
    let (mut ws, resp) = tungstenite::client(req, tls).expect("the WebSocket upgrade");
    assert_eq!(
        resp.headers()
            .get("Sec-WebSocket-Protocol")
            .map(|v| v.to_str().unwrap()),
        Some("v4.channel.k8s.io"),
        "the runtime's answer, relayed"
    );
    let (mut stdout, mut status) = (Vec::new(), serde_json::Value::Null);
    loop {
        match ws.read() {
            Ok(tungstenite::Message::Binary(b)) if !b.is_empty() => match b[0] {
                1 => stdout.extend_from_slice(&b[1..]),
                3 if b.len() > 1 => status = serde_json::from_slice(&b[1..]).unwrap(),
                _ => {}
            },
            Ok(tungstenite::Message::Close(_)) | Err(_) => break,
            Ok(_) => {}
        }
    }
    (String::from_utf8(stdout).unwrap(), status)
}

/// exec over WebSocket works through the byte relay as SPDY does: output, the exit status.
#[test]
fn exec_over_websocket_is_relayed_like_spdy() {
    let certs = tempfile::tempdir().unwrap();
    let n = agent("nodews", certs.path());
    run_talker(&n);
    let pod = format!("talker-{}", n.node);
    let (out, status) = websocket_exec(
        &n,
        certs.path(),
        &format!("/exec/default/{pod}/c?command=echo&command=hello&output=1&error=1"),
    );
    assert_eq!(out, "hello\n");
    assert_eq!(status["status"], "Success", "{status}");
    let (_, status) = websocket_exec(
        &n,
        certs.path(),
        &format!("/exec/default/{pod}/c?command=sh&command=-c&command=exit%207&output=1&error=1"),
    );
    assert_eq!(status["status"], "Failure", "{status}");
    let causes = status["details"]["causes"].as_array().unwrap();
    assert!(
        causes
            .iter()
            .any(|c| c["reason"] == "ExitCode" && c["message"] == "7"),
        "{status}"
    );
}

/// 100 exec sessions that the client abandons right after the upgrade: the relay ends with
/// them and nodelet gives back every descriptor it held.
#[test]
fn abandoned_exec_sessions_give_back_every_descriptor() {
    let certs = tempfile::tempdir().unwrap();
    let n = agent("execleak", certs.path());
    run_talker(&n);
    let url = format!(
        "https://127.0.0.1:{}/exec/default/talker-{}/c?command=sleep&command=30&output=1",
        n.api_port, n.node
    );
    // The container's status (its ID) reaches /pods a moment after it runs.
    let exec_once = || curl_exec(certs.path(), &url, 2).0;
    wait_until(Duration::from_secs(20), "an exec upgraded", || {
        exec_once() == "101"
    });
    let before = fds(&n);
    let sh = format!(
        "seq 100 | xargs -P 20 -I{{}} curl -sk -o /dev/null --max-time 2 -X POST -H 'Connection: Upgrade' -H 'Upgrade: SPDY/3.1' -H 'X-Stream-Protocol-Version: v4.channel.k8s.io' --cert {c} --key {k} '{url}'",
        c = certs.path().join("good-client.crt").display(),
        k = certs.path().join("good-client.key").display(),
    );
    std::process::Command::new("sh")
        .args(["-c", &sh])
        .status()
        .unwrap();
    wait_until(Duration::from_secs(30), "descriptors given back", || {
        fds(&n) <= before + 2
    });
    // The runtime's refusal (a protocol it does not speak) is relayed whole as soon as it comes,
    // not after waiting for the runtime to close its side.
    let out = std::process::Command::new("curl")
        .args([
            "-sk",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--max-time",
            "3",
        ])
        .args([
            "-X",
            "POST",
            "-H",
            "Connection: Upgrade",
            "-H",
            "Upgrade: SPDY/3.1",
        ])
        .args(["-H", "X-Stream-Protocol-Version: nonsense"])
        .arg("--cert")
        .arg(certs.path().join("good-client.crt"))
        .arg("--key")
        .arg(certs.path().join("good-client.key"))
        .arg(&url)
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "403", "{out:?}");
}

/// Exec into a pod while it is being deleted: every answer comes at once and says what is
/// wrong (the pod gone: 404 naming it; its container stopped: the runtime's refusal), never a
/// hang; once it is gone nothing of it is left in the runtime.
#[test]
fn exec_into_a_pod_being_deleted_is_refused_clearly() {
    let certs = tempfile::tempdir().unwrap();
    let n = agent("execgone", certs.path());
    let uid = run_talker(&n);
    let url = format!(
        "https://127.0.0.1:{}/exec/default/talker-{}/c?command=true&output=1",
        n.api_port, n.node
    );
    let exec_once = || curl_exec(certs.path(), &url, 5);
    // Right after it runs, the runtime's listing finds the container (the status may lag).
    assert_eq!(exec_once().0, "101");
    std::fs::remove_file(n.manifests().join("talker.yaml")).unwrap();
    let mut seen = Vec::new();
    wait_until(
        Duration::from_secs(30),
        "the pod gone from the node API",
        || {
            let (code, body) = exec_once();
            assert!(
                ["101", "400", "404", "500"].contains(&code.as_str()),
                "{code}: {body}"
            );
            if code != "101" {
                assert!(!body.trim().is_empty(), "{code} without a message");
            }
            seen.push(format!("{code} {}", body.trim()));
            code == "404" && body.contains("does not exist")
        },
    );
    eprintln!("answers while the pod went: {seen:?}");
    wait_until(
        Duration::from_secs(20),
        "nothing of the pod in the runtime",
        || n.runtime.sandboxes(&uid).is_empty() && n.runtime.containers(&uid).is_empty(),
    );
}
