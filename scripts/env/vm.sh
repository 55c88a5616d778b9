#!/usr/bin/env bash
# The modern test node: a Debian 12 guest under QEMU with cgroup v2 alone, systemd as PID 1,
# PSI, and containerd with runc and the CNI plugins, everything from Debian's packages. These
# machines run cgroup v1 without systemd; the cgroup v2 test set runs in this guest
# (scripts/test.sh). As root:
#
#   vm.sh build     build the guest image once per machine (kept in $VM_DIR; rebuilt when this
#                   script or our images change; about 1-1.5 min)
#   vm.sh up        boot a fresh guest (a throw-away overlay on the image), mount the checkout
#                   at its own path inside it (the test binaries and nodelet run from there), and
#                   wait until both containerds answer; prints the boot time
#   vm.sh exec CMD  run CMD (bash -c) in the guest; its output comes back when it exits; exits
#                   with its status (VM_EXEC_TIMEOUT=S gives up after S seconds, status 124)
#   vm.sh exec -    the same, the script read from stdin
#   vm.sh down      power the guest off
#   vm.sh status    is it running?
#   vm.sh accel     which accelerator `up` would use, and why
#
# In the guest: containerd.service with the systemd cgroup driver (SystemdCgroup = true) on
# /run/containerd/containerd.sock, and containerd-cgroupfs.service with the cgroupfs driver on
# /run/containerd-cgroupfs/containerd.sock; both have our pause and busybox images
# (registry.k8s.io/pause:3.9, docker.io/library/busybox:1.36) imported at boot, a CNI bridge on
# 10.88.0.0/16, and no other network: the guest has no network card. No AppArmor userspace (no
# apparmor_parser), as in many minimal installs, though Debian's kernel has AppArmor on.
#
# KVM is used where the host offers a usable one; these machines' /dev/kvm is a PVM device that
# a stock kernel cannot run under (see `vm.sh accel`), so the guest runs under QEMU's software
# emulation (TCG): it boots in 15-45 s and starts a pod in about 4 s.
#
# Knobs: VM_DIR (/var/lib/nodelet-env/vm), VM_MEM (2048 MiB), VM_CPUS (2), VM_ACCEL (auto|kvm|tcg),
# VM_BOOT_TIMEOUT (600 s), VM_NICE (10), VM_EXEC_TIMEOUT (s).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$HERE/common.sh"

export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin${PATH:+:$PATH}

VM_DIR=${VM_DIR:-$NODELET_ENV_LIB/vm}
VM_SUITE=bookworm
VM_MEM=${VM_MEM:-2048}
VM_CPUS=${VM_CPUS:-2}
VM_ACCEL=${VM_ACCEL:-auto}
VM_DISK=8G
VM_BOOT_TIMEOUT=${VM_BOOT_TIMEOUT:-600}
VM_NICE=${VM_NICE:-10}

die() { echo "vm.sh: $*" >&2; exit 1; }
say() { nodelet_say "$@"; }

[[ $(id -u) -eq 0 ]] || die "must run as root (mmdebstrap, 9p, qemu)"

# The guest's packages: PID 1 and logind, the kernel, the runtime stack, the command channel.
GUEST_PKGS=(
    systemd systemd-sysv dbus libpam-systemd udev kmod
    linux-image-amd64 initramfs-tools
    containerd runc containernetworking-plugins iptables
    qemu-guest-agent
    busybox-static iproute2 procps util-linux psmisc
)
HOST_PKGS=(qemu-system-x86 qemu-utils mmdebstrap e2fsprogs python3 skopeo)

host_deps() {
    local missing=() p
    for p in "${HOST_PKGS[@]}"; do
        [[ $(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true) == installed ]] ||
            missing+=("$p")
    done
    ((${#missing[@]} == 0)) && return
    say "vm: installing ${missing[*]}"
    { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
        --no-install-recommends "${missing[@]}"; } >>"$NODELET_ENV_LOG/apt.log" 2>&1 ||
        die "apt-get failed (log: $NODELET_ENV_LOG/apt.log)"
}

# What the image is made of: this script and our two images. The image is rebuilt when it changes.
build_inputs() {
    {
        sha256sum "${BASH_SOURCE[0]}"
        cat "$NODELET_IMAGES_DIR/pause.digest" "$NODELET_IMAGES_DIR/busybox.digest"
    } | sha256sum | cut -d' ' -f1
}

# Runs on the host with the guest's root directory as $1 (an mmdebstrap customize hook).
guest_customize() {
    local R=$1
    echo vmguest >"$R/etc/hostname"
    printf '127.0.0.1 localhost\n127.0.1.1 vmguest\n::1 localhost\n' >"$R/etc/hosts"
    printf '/dev/vda / ext4 rw,relatime,errors=remount-ro 0 0\n' >"$R/etc/fstab"
    chroot "$R" passwd --delete root >/dev/null
    # The serial console logs in as root (debugging only: automation uses the guest agent).
    mkdir -p "$R/etc/systemd/system/serial-getty@ttyS0.service.d"
    printf '[Service]\nExecStart=\nExecStart=-/sbin/agetty --autologin root --keep-baud 115200 %%I $TERM\n' \
        >"$R/etc/systemd/system/serial-getty@ttyS0.service.d/autologin.conf"
    # Nothing periodic, nothing that waits for a network the guest does not have.
    local u
    for u in apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer e2scrub_reap.service \
        fstrim.timer man-db.timer systemd-networkd-wait-online.service getty@tty1.service; do
        ln -sf /dev/null "$R/etc/systemd/system/$u"
    done
    # containerd with the systemd cgroup driver (kubeadm's choice on systemd nodes)...
    mkdir -p "$R/etc/containerd" "$R/etc/cni/net.d"
    chroot "$R" containerd config default >"$R/etc/containerd/config.toml"
    sed -i -e 's/SystemdCgroup = false/SystemdCgroup = true/' \
        -e "s#sandbox_image = .*#sandbox_image = \"$PAUSE_IMAGE\"#" \
        -e 's#bin_dir = "/opt/cni/bin"#bin_dir = "/usr/lib/cni"#' \
        -e 's/stream_server_port = .*/stream_server_port = "0"/' "$R/etc/containerd/config.toml"
    # ...and a second one with the cgroupfs driver, on its own socket, root and state.
    sed -e 's/SystemdCgroup = true/SystemdCgroup = false/' \
        -e 's#"/var/lib/containerd"#"/var/lib/containerd-cgroupfs"#' \
        -e 's#"/run/containerd"#"/run/containerd-cgroupfs"#' \
        -e 's#/run/containerd/containerd.sock#/run/containerd-cgroupfs/containerd.sock#' \
        "$R/etc/containerd/config.toml" >"$R/etc/containerd/cgroupfs.toml"
    cat >"$R/etc/systemd/system/containerd-cgroupfs.service" <<'EOF'
[Unit]
Description=containerd with the cgroupfs driver (nodelet's cgroup v2 tests)
After=network.target local-fs.target
[Service]
ExecStartPre=-/sbin/modprobe overlay
ExecStart=/usr/bin/containerd --config /etc/containerd/cgroupfs.toml
Type=notify
Delegate=yes
KillMode=process
Restart=always
LimitNOFILE=infinity
TasksMax=infinity
[Install]
WantedBy=multi-user.target
EOF
    ln -sf /etc/systemd/system/containerd-cgroupfs.service \
        "$R/etc/systemd/system/multi-user.target.wants/containerd-cgroupfs.service"
    cat >"$R/etc/cni/net.d/10-nodelet.conflist" <<'EOF'
{
  "cniVersion": "1.0.0",
  "name": "nodelet",
  "plugins": [
    { "type": "bridge", "bridge": "nodelet0", "isGateway": true, "ipMasq": false,
      "ipam": { "type": "host-local", "ranges": [[{ "subnet": "10.88.0.0/16", "gateway": "10.88.0.1" }]] } }
  ]
}
EOF
    # Our images, in both containerds, at every boot (a fresh overlay each time).
    cat >"$R/etc/systemd/system/nodelet-images.service" <<'EOF'
[Unit]
Description=Import nodelet's test images into both containerds
After=containerd.service containerd-cgroupfs.service
Requires=containerd.service containerd-cgroupfs.service
[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/sh -c 'for s in /run/containerd/containerd.sock /run/containerd-cgroupfs/containerd.sock; do for t in /opt/images/*.tar; do ctr --address $s -n k8s.io images import "$t" || exit 1; done; done'
[Install]
WantedBy=multi-user.target
EOF
    ln -sf /etc/systemd/system/nodelet-images.service \
        "$R/etc/systemd/system/multi-user.target.wants/nodelet-images.service"
    # Modules a VM never needs (about 300 MB).
    local M
    M=$(echo "$R"/usr/lib/modules/*)
    rm -rf "$M"/kernel/sound "$M"/kernel/drivers/{gpu,media,infiniband,staging,usb,bluetooth,iio,hid,input,isdn,net/wireless,net/ethernet,net/can,net/usb,scsi,ata,mmc,mtd,platform,hwmon,thunderbolt,nfc,misc,edac,firewire,video,leds,power,rtc,spi,i2c,w1,pinctrl,gpio,crypto,memstick,parport,pcmcia,ssb,bcma,atm,comedi,target,mfd,regulator,fpga,soundwire,ntb,rapidio,accel,dma,counter,cxl}
    chroot "$R" depmod -a "$(basename "$M")"
    rm -rf "$R"/var/cache/apt/archives/*.deb "$R"/var/lib/apt/lists/*_Packages
}

cmd_build() {
    host_deps
    [[ -s $NODELET_IMAGES_DIR/pause.digest && -s $NODELET_IMAGES_DIR/busybox.digest ]] ||
        die "our images are not built yet: run scripts/env/up.sh first"
    local inputs
    inputs=$(build_inputs)
    if [[ -f $VM_DIR/base.img && $(cat "$VM_DIR/base.inputs" 2>/dev/null) == "$inputs" ]]; then
        say "vm: image up to date ($VM_DIR/base.img)"
        return
    fi
    mkdir -p "$VM_DIR"
    local R=$VM_DIR/rootfs H=$VM_DIR/hooks t0=$SECONDS
    rm -rf "$R" "$H" "$VM_DIR/base.img" "$VM_DIR/base.inputs"
    mkdir -p "$H"
    # Before the kernel package: a small initrd (virtio and ext4 only), quick to unpack under TCG.
    cat >"$H/essential00.sh" <<'HOOK'
#!/bin/sh
set -e
mkdir -p "$1/etc/initramfs-tools/conf.d" "$1/etc/initramfs-tools/hooks"
printf 'MODULES=list\nCOMPRESS=gzip\n' > "$1/etc/initramfs-tools/conf.d/vm.conf"
cat > "$1/etc/initramfs-tools/hooks/vm" <<'EOT'
#!/bin/sh
[ "$1" = prereqs ] && exit 0
. /usr/share/initramfs-tools/hook-functions
for m in virtio_pci virtio_blk virtio_console ext4 crc32c_generic 9p 9pnet_virtio; do manual_add_modules $m; done
EOT
chmod 755 "$1/etc/initramfs-tools/hooks/vm"
HOOK
    {
        echo '#!/usr/bin/env bash'
        echo 'set -euo pipefail'
        printf 'PAUSE_IMAGE=%q\n' "$PAUSE_IMAGE"
        declare -f guest_customize
        echo 'guest_customize "$1"'
    } >"$H/customize00.sh"
    chmod 755 "$H"/*.sh
    local pkgs
    pkgs=$(IFS=,; echo "${GUEST_PKGS[*]}")
    say "vm: building the guest image (mmdebstrap $VM_SUITE; about a minute)"
    nice -n "$VM_NICE" mmdebstrap --variant=minbase --include="$pkgs" \
        --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
        --dpkgopt='path-include=/usr/share/doc/*/copyright' \
        --dpkgopt='path-exclude=/usr/share/locale/*' \
        --hook-directory="$H" "$VM_SUITE" "$R" >>"$NODELET_ENV_LOG/vm-build.log" 2>&1 ||
        die "mmdebstrap failed (log: $NODELET_ENV_LOG/vm-build.log)"
    # Our images as OCI archives carrying their names, for `ctr images import`.
    mkdir -p "$R/opt/images"
    skopeo copy --quiet "oci:$NODELET_IMAGES_DIR/pause:3.9" "oci-archive:$R/opt/images/pause.tar:$PAUSE_IMAGE"
    skopeo copy --quiet "oci:$NODELET_IMAGES_DIR/busybox:1.36" \
        "oci-archive:$R/opt/images/busybox.tar:$BUSYBOX_IMAGE"
    cp -L "$R"/boot/vmlinuz-* "$VM_DIR/vmlinuz"
    cp -L "$R"/boot/initrd.img-* "$VM_DIR/initrd.img"
    rm -f "$R"/boot/vmlinuz-* "$R"/boot/initrd.img-* "$R"/boot/System.map-* "$R"/vmlinuz* "$R"/initrd.img*
    nice -n "$VM_NICE" mke2fs -q -t ext4 -L vmroot -d "$R" -E root_owner=0:0 "$VM_DIR/base.img" "$VM_DISK"
    rm -rf "$R" "$H"
    echo "$inputs" >"$VM_DIR/base.inputs"
    say "vm: image built in $((SECONDS - t0)) s ($(du -h "$VM_DIR/base.img" | cut -f1) on disk)"
}

qemu_pid() { [[ -f $VM_DIR/qemu.pid ]] && kill -0 "$(cat "$VM_DIR/qemu.pid")" 2>/dev/null && cat "$VM_DIR/qemu.pid"; }

# KVM needs vmx or svm in the CPU. Where /dev/kvm is PVM's (kvm_pvm loaded, no vmx: these
# machines), a stock Debian kernel stalls in its decompressor or dies on emulating cmpxchg16b
# and xrstor, so TCG is used.
pick_accel() {
    case $VM_ACCEL in kvm | tcg) echo "$VM_ACCEL forced by VM_ACCEL"; return ;; esac
    if [[ -w /dev/kvm ]] && grep -qwE 'vmx|svm' /proc/cpuinfo && [[ ! -d /sys/module/kvm_pvm ]]; then
        echo "kvm"
    elif [[ -d /sys/module/kvm_pvm ]]; then
        echo "tcg (/dev/kvm is PVM's, which a stock kernel cannot run under)"
    else
        echo "tcg (no usable /dev/kvm)"
    fi
}

# The guest agent's client: ping, shutdown, exec (guest-exec and guest-exec-status over the
# virtio-serial socket, JSON lines).
QGA_PY='
import base64, fcntl, json, os, random, socket, sys, time
sock_path, lock_path, op = sys.argv[1], sys.argv[2], sys.argv[3]
def call(cmd, args=None, timeout=10.0, reply=True):
    with open(lock_path, "w") as lk:
        fcntl.flock(lk, fcntl.LOCK_EX)
        s = socket.socket(socket.AF_UNIX); s.settimeout(timeout); s.connect(sock_path)
        f = s.makefile("rb")
        sid = random.randint(1, 2**31)
        s.sendall(b"\xff" + json.dumps({"execute": "guest-sync", "arguments": {"id": sid}}).encode() + b"\n")
        while True:
            line = f.readline()
            if not line: raise EOFError("guest agent closed the channel")
            try: r = json.loads(line.lstrip(b"\xff"))
            except ValueError: continue
            if r.get("return") == sid: break
        req = {"execute": cmd}
        if args is not None: req["arguments"] = args
        s.sendall(json.dumps(req).encode() + b"\n")
        if not reply:
            time.sleep(0.5); s.close(); return None
        while True:
            line = f.readline()
            if not line: raise EOFError("guest agent closed the channel")
            r = json.loads(line)
            if "error" in r: raise RuntimeError(r["error"])
            if "return" in r:
                s.close(); return r["return"]
if op == "ping":
    deadline = time.time() + float(sys.argv[4])
    while time.time() < deadline:
        try:
            call("guest-ping", timeout=3); sys.exit(0)
        except Exception:
            time.sleep(1)
    sys.exit(1)
elif op == "shutdown":
    call("guest-shutdown", {"mode": "powerdown"}, reply=False)
elif op == "exec":
    script = sys.argv[4]
    if script == "-": script = sys.stdin.read()
    args = {"path": "/bin/bash", "arg": ["-c", script], "capture-output": True,
            "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root",
                    "LANG=C.UTF-8"] + [e for e in os.environ.get("VM_EXEC_ENV", "").split("\n") if e]}
    pid = call("guest-exec", args)["pid"]
    delay, limit = 0.05, float(os.environ.get("VM_EXEC_TIMEOUT") or 0)
    t_end = time.time() + limit if limit > 0 else None
    while True:
        st = call("guest-exec-status", {"pid": pid}, timeout=30)
        if st.get("exited"): break
        if t_end and time.time() > t_end:
            print(f"vm.sh: exec timed out after {limit:g} s (guest pid {pid} left running)", file=sys.stderr)
            sys.exit(124)
        time.sleep(delay); delay = min(delay * 2, 1.0)
    sys.stdout.buffer.write(base64.b64decode(st.get("out-data", ""))); sys.stdout.flush()
    sys.stderr.buffer.write(base64.b64decode(st.get("err-data", ""))); sys.stderr.flush()
    if st.get("out-truncated") or st.get("err-truncated"): print("vm.sh: output truncated by the guest agent", file=sys.stderr)
    sys.exit(st["exitcode"] if "exitcode" in st else 128 + st.get("signal", 0))
'
qga() { python3 -c "$QGA_PY" "$VM_DIR/qga.sock" "$VM_DIR/qga.lock" "$@"; }

cmd_up() {
    [[ -f $VM_DIR/base.img ]] || die "no guest image: run '$0 build' first"
    qemu_pid >/dev/null && die "already running (qemu pid $(qemu_pid)); '$0 down' first"
    host_deps
    local accel
    accel=$(pick_accel)
    rm -f "$VM_DIR"/{run.qcow2,serial.log,qga.sock,serial.sock,qemu.pid}
    qemu-img create -q -f qcow2 -b "$VM_DIR/base.img" -F raw "$VM_DIR/run.qcow2"
    local cpu=(-cpu max) acc=(-accel tcg,thread=multi,tb-size=256)
    [[ $accel == kvm* ]] && { cpu=(-cpu host); acc=(-accel kvm); }
    say "vm: booting ($accel; $VM_CPUS vCPU, $VM_MEM MiB)"
    local t0=$SECONDS
    nice -n "$VM_NICE" qemu-system-x86_64 -name nodelet-vm -machine q35 "${acc[@]}" "${cpu[@]}" \
        -smp "$VM_CPUS" -m "$VM_MEM" -no-reboot -display none -vga none -nodefaults \
        -kernel "$VM_DIR/vmlinuz" -initrd "$VM_DIR/initrd.img" \
        -append "console=ttyS0 root=/dev/vda rw systemd.unified_cgroup_hierarchy=1 psi=1 panic=-1 quiet loglevel=4" \
        -drive "file=$VM_DIR/run.qcow2,if=virtio,format=qcow2,cache=unsafe,discard=unmap" \
        -device virtio-rng-pci -device virtio-serial-pci \
        -chardev "socket,id=qga0,path=$VM_DIR/qga.sock,server=on,wait=off" \
        -device virtserialport,chardev=qga0,name=org.qemu.guest_agent.0 \
        -chardev "socket,id=ser0,path=$VM_DIR/serial.sock,server=on,wait=off,logfile=$VM_DIR/serial.log" \
        -serial chardev:ser0 \
        -virtfs "local,path=$REPO,mount_tag=repo,security_model=none,id=repo" \
        -nic none -daemonize -pidfile "$VM_DIR/qemu.pid"
    if ! qga ping "$VM_BOOT_TIMEOUT"; then
        tail -20 "$VM_DIR/serial.log" >&2 || true
        die "the guest agent did not answer within ${VM_BOOT_TIMEOUT}s"
    fi
    # The checkout at its own path, so that the test binaries find nodelet where cargo put it.
    qga exec "mkdir -p '$REPO' && mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 repo '$REPO'" ||
        die "cannot mount the checkout in the guest"
    VM_EXEC_TIMEOUT=$VM_BOOT_TIMEOUT qga exec 'systemctl is-system-running --wait >/dev/null 2>&1; systemctl is-active --quiet nodelet-images containerd containerd-cgroupfs' ||
        { qga exec 'systemctl --failed --no-pager; journalctl -b --no-pager -n 40' >&2 || true; die "the guest's containerds did not come up"; }
    say "vm: up in $((SECONDS - t0)) s ($(qga exec 'systemd-analyze | head -1'))"
}

cmd_down() {
    local pid
    pid=$(qemu_pid) || { rm -f "$VM_DIR/qemu.pid"; say "vm: not running"; return 0; }
    qga shutdown 2>/dev/null || true
    local i
    for ((i = 0; i < 60; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    if kill -0 "$pid" 2>/dev/null; then
        kill "$pid"; sleep 2
        kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
    fi
    rm -f "$VM_DIR/qemu.pid" "$VM_DIR/run.qcow2"
    say "vm: stopped"
}

case ${1:-} in
build) cmd_build ;;
up) cmd_up ;;
exec)
    shift
    qemu_pid >/dev/null || die "the guest is not running ('$0 up')"
    [[ $# -ge 1 ]] || die "usage: $0 exec CMD... | exec -"
    if [[ $1 == - ]]; then qga exec -; else qga exec "$*"; fi
    ;;
down) cmd_down ;;
status) if p=$(qemu_pid); then echo "running, qemu pid $p"; else echo "not running"; exit 1; fi ;;
accel) pick_accel ;;
*)
    sed -n '2,/^set -euo/{/^#/p}' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
