#!/usr/bin/env bash
# Undo scripts/up.sh: stop nodelet (SIGTERM; pods would keep running), then tear the environment
# down (scripts/env/down.sh stops every container, containerd and the registry). Pass --purge to
# also delete built images and registry storage. /etc/nodelet is kept.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PIDFILE=/run/nodelet/nodelet.pid
if [[ -s $PIDFILE ]] && kill -0 "$(<"$PIDFILE")" 2>/dev/null; then
    kill -TERM "$(<"$PIDFILE")"
    for _ in $(seq 50); do kill -0 "$(<"$PIDFILE")" 2>/dev/null || break; sleep 0.1; done
    echo "nodelet: stopped"
fi
rm -f "$PIDFILE"
bash "$HERE/env/down.sh" "$@"
