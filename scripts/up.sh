#!/usr/bin/env bash
# Command 1 of the README: bring up everything on a fresh Debian 12 machine, as root, and run
# nodelet with the example manifests of config/manifests.
#   - scripts/env/up.sh: packages, images, local registry, private containerd (idempotent);
#   - cargo build --release, installed as /usr/local/bin/nodelet once it accepts
#     /etc/nodelet/nodelet.yaml (check-config; a bad setting leaves the running agent as it is);
#   - /etc/nodelet/nodelet.yaml (from config/nodelet.yaml) and the example manifests in
#     /etc/nodelet/manifests, each copied only when absent (your edits are kept);
#   - nodelet in the background (pid /run/nodelet/nodelet.pid, log /var/log/nodelet/nodelet.log),
#     restarted if it was running: it adopts the running pods, nothing is restarted.
# Then it waits for the example pods to run and prints them. scripts/down.sh undoes it.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
[[ $(id -u) -eq 0 ]] || { echo "up.sh: must run as root" >&2; exit 1; }

bash "$HERE/env/up.sh"

install -d /etc/nodelet/manifests /run/nodelet /var/log/nodelet
if [[ ! -f /etc/nodelet/nodelet.yaml ]]; then
    install -m 0644 "$REPO/config/nodelet.yaml" /etc/nodelet/nodelet.yaml
    echo "nodelet: wrote /etc/nodelet/nodelet.yaml"
elif ! cmp -s "$REPO/config/nodelet.yaml" /etc/nodelet/nodelet.yaml; then
    echo "nodelet: keeping your /etc/nodelet/nodelet.yaml; it differs from config/nodelet.yaml" \
        "(diff them to see new fields; 'nodelet check-config --config /etc/nodelet/nodelet.yaml' shows the effective values)"
fi
for m in "$REPO"/config/manifests/*.yaml; do
    dest=/etc/nodelet/manifests/$(basename "$m")
    [[ -e $dest ]] || { install -m 0644 "$m" "$dest"; echo "nodelet: manifest $dest"; }
done

echo "nodelet: building (cargo build --release; 5 to 11 minutes from a cold cache, silent meanwhile)"
(cd "$REPO" && cargo build --release --quiet --bin nodelet)
install -m 0755 "$REPO/target/release/nodelet" /usr/local/bin/nodelet.new
# The new build must accept the configuration before the running agent is stopped: a node is
# never left without an agent over a bad setting.
if ! /usr/local/bin/nodelet.new --config /etc/nodelet/nodelet.yaml check-config >/dev/null; then
    echo "nodelet: /etc/nodelet/nodelet.yaml is refused (above); the running agent, if any, is left as it is" >&2
    rm -f /usr/local/bin/nodelet.new
    exit 1
fi
mv -f /usr/local/bin/nodelet.new /usr/local/bin/nodelet

PIDFILE=/run/nodelet/nodelet.pid
if [[ -s $PIDFILE ]] && kill -0 "$(<"$PIDFILE")" 2>/dev/null; then
    echo "nodelet: restarting (running pods are adopted, not restarted)"
    kill -TERM "$(<"$PIDFILE")" || true
    for _ in $(seq 300); do kill -0 "$(<"$PIDFILE")" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$(<"$PIDFILE")" 2>/dev/null; then
        echo "nodelet: pid $(<"$PIDFILE") still runs 30 s after SIGTERM; not starting a second agent" >&2
        exit 1
    fi
fi
setsid /usr/local/bin/nodelet --config /etc/nodelet/nodelet.yaml \
    >>/var/log/nodelet/nodelet.log 2>&1 </dev/null &
echo $! >"$PIDFILE"
echo "nodelet: started, pid $(<"$PIDFILE"), log /var/log/nodelet/nodelet.log"

for _ in $(seq 100); do
    curl -sf http://127.0.0.1:10248/healthz >/dev/null && break
    sleep 0.1
done
curl -sf http://127.0.0.1:10248/healthz >/dev/null || { echo "nodelet: /healthz does not answer; see /var/log/nodelet/nodelet.log" >&2; exit 1; }

summary() {
    curl -sf http://127.0.0.1:10248/pods | python3 -c '
import json, sys
pods = json.load(sys.stdin)["items"]
ok = True
for p in pods:
    s = p.get("status", {})
    cs = s.get("initContainerStatuses", []) + s.get("containerStatuses", [])
    states = ", ".join("%s=%s" % (c["name"], next(iter(c.get("state", {"?": 0})))) for c in cs)
    print("  %-40s %-9s %s" % (p["metadata"]["namespace"] + "/" + p["metadata"]["name"], s.get("phase"), states))
    if s.get("reason"):
        print("    %s: %s" % (s["reason"], s.get("message", "")))
    if s.get("reason") == "Evicted":
        print("    (an evicted pod stays Failed until its manifest changes: free the resource, then edit or re-create the manifest)")
    ok = ok and s.get("phase") == "Running" and all("running" in c.get("state", {}) for c in s.get("containerStatuses", []))
sys.exit(0 if ok and pods else 1)
'
}
for _ in $(seq 60); do
    if summary >/dev/null 2>&1; then break; fi
    sleep 0.5
done
echo "pods (curl -s http://127.0.0.1:10248/pods):"
summary || { echo "nodelet: not every example pod is running yet; see /var/log/nodelet/nodelet.log" >&2; exit 1; }
/usr/local/bin/nodelet get pods -A -o wide || true
echo "look closer: nodelet describe pod NAME, nodelet logs NAME, nodelet exec -it NAME -- sh, nodelet top pods, nodelet events"
echo "logs under /var/log/pods/; metrics: curl -s http://127.0.0.1:10248/metrics"
echo "up.sh: done in $((SECONDS / 60)) min $((SECONDS % 60)) s"
