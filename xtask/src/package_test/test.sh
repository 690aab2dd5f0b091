#!/bin/sh
# The package test, run by systemd at boot in the systemd Debian guest
# (railscope-package-test.service) from the payload disk mounted at /payload, which holds
# railscope.deb. What an operator does and checks, in order; one line per check:
#   PKGTEST: ok <check>            PKGTEST-FAIL: <check>: <what was seen>
# and last `PKGTEST-RESULT pass|fail`. The host (xtask/src/package_test.rs) reads them.
set -u
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
export SYSTEMD_PAGER= SYSTEMD_COLORS=0
failed=0
ok() { echo "PKGTEST: ok $*"; }
fail() {
    echo "PKGTEST-FAIL: $*"
    failed=1
}
AGENT=railscope-agent.service
COLLECTOR=railscope-collector.service
prop() { systemctl show -P "$2" "$1"; }
state() { echo "$(prop "$1" ActiveState)/$(prop "$1" SubState) NRestarts=$(prop "$1" NRestarts) MainPID=$(prop "$1" MainPID)"; }
# wait_for SECONDS COMMAND...: retries COMMAND every second until it succeeds.
wait_for() {
    t=$1
    shift
    while [ "$t" -gt 0 ]; do
        "$@" >/dev/null 2>&1 && return 0
        sleep 1
        t=$((t - 1))
    done
    return 1
}
running() { [ "$(prop "$1" ActiveState)/$(prop "$1" SubState)" = active/running ]; }
running_as_new() { running "$1" && [ "$(prop "$1" MainPID)" != "$2" ] && [ "$(prop "$1" MainPID)" != 0 ]; }
finish() {
    if [ $failed = 0 ]; then echo "PKGTEST-RESULT pass"; else echo "PKGTEST-RESULT fail"; fi
    exit 0
}

echo "PKGTEST: kernel $(uname -r), $(systemctl --version | head -n1)"

# Soft-RoCE devices on a veth pair, as on an RDMA node: ib_core, ib_uverbs and rdma_cm are
# loaded before the agent starts.
modprobe veth && modprobe rdma_rxe && modprobe ib_uverbs && modprobe rdma_ucm \
    || fail "modules: modprobe rdma_rxe ib_uverbs rdma_ucm"
ip link add vethA type veth peer name vethB && ip link set vethA up && ip link set vethB up
rdma link add rxe0 type rxe netdev vethA && rdma link add rxe1 type rxe netdev vethB
if [ -e /sys/class/infiniband/rxe0 ] && [ -e /sys/class/infiniband/rxe1 ]; then
    ok "rxe devices rxe0 rxe1"
else
    fail "rxe devices: /sys/class/infiniband holds '$(ls /sys/class/infiniband 2>&1)'"
fi

# 1. Install. No key yet: the agent starts (it prints events locally), the collector is
# left stopped with a message naming the missing key.
dpkg -i /payload/railscope.deb >/tmp/dpkg-i.log 2>&1
rc=$?
sed 's/^/PKGTEST:   dpkg: /' /tmp/dpkg-i.log
[ $rc = 0 ] && ok "dpkg -i" || fail "dpkg -i exited $rc"
[ "$(dpkg-query -W -f='${Status}' railscope 2>&1)" = "install ok installed" ] \
    && ok "dpkg status installed" || fail "dpkg status: $(dpkg-query -W -f='${Status}' railscope 2>&1)"
for f in /usr/bin/railscope /usr/bin/railscope-collector /usr/sbin/railscope-gen-wire-key \
    /etc/railscope/agent.toml /etc/railscope/collector.toml \
    /usr/share/doc/railscope/deployment.md /usr/share/doc/railscope/copyright; do
    [ -e $f ] || fail "installed files: $f missing"
done
for u in $AGENT $COLLECTOR; do
    [ "$(prop $u UnitFileState)" = enabled ] && ok "$u enabled" || fail "$u: UnitFileState=$(prop $u UnitFileState)"
done
grep -q "railscope-collector.service not started: /etc/railscope/wire.key is missing" /tmp/dpkg-i.log \
    && ok "postinst names the missing key" || fail "postinst did not say the collector waits for its key"
wait_for 60 running $AGENT && ok "agent started by dpkg -i: $(state $AGENT)" \
    || fail "agent after dpkg -i: $(state $AGENT)"

# 2. Configure as an operator does: a key, the agent pointed at the collector, check, start.
railscope-gen-wire-key && [ "$(stat -c %a /etc/railscope/wire.key)" = 600 ] \
    && ok "railscope-gen-wire-key (mode 600)" || fail "railscope-gen-wire-key"
# Per-node keys as a provisioning host makes them: a fleet secret, one node's key from it.
railscope-gen-wire-key /root/fleet.secret 2>/dev/null \
    && nodekey=$(railscope-gen-wire-key --node gpu-001 --secret /root/fleet.secret) \
    && [ "${#nodekey}" = 64 ] && [ "$(stat -c %a /root/fleet.secret)" = 600 ] \
    && [ "$nodekey" != "$(railscope-gen-wire-key --node gpu-002 --secret /root/fleet.secret)" ] \
    && ok "railscope-gen-wire-key --node (a node's own key)" || fail "railscope-gen-wire-key --node"
sed -i -e 's|^#collector = .*|collector = "127.0.0.1:7670"|' \
    -e 's|^#key = .*|key = "/etc/railscope/wire.key"|' \
    -e 's|^#interval = .*|interval = 0.5|' \
    -e 's|^#nvml-lib = .*|nvml-lib = "/payload/nvml/libnvidia-ml.so.1"|' /etc/railscope/agent.toml
railscope agent --check-config >/tmp/check.txt 2>&1 && grep -q '127.0.0.1:7670' /tmp/check.txt \
    && ok "railscope agent --check-config" || fail "agent --check-config: $(tail -n 3 /tmp/check.txt)"
railscope-collector --check-config >/tmp/check.txt 2>&1 \
    && ok "railscope-collector --check-config" || fail "collector --check-config: $(tail -n 3 /tmp/check.txt)"
systemctl start $COLLECTOR || fail "systemctl start $COLLECTOR"
systemctl restart $AGENT || fail "systemctl restart $AGENT"
# Type=notify: `systemctl start` returns once the daemon said READY=1; active/running then.
for u in $COLLECTOR $AGENT; do
    running $u && ok "$u ready: $(state $u)" || fail "$u not ready: $(state $u)"
done
uid=$(ps -o uid= -p "$(prop $COLLECTOR MainPID)" | tr -d ' ')
[ "$(prop $COLLECTOR DynamicUser)" = yes ] && [ -n "$uid" ] && [ "$uid" != 0 ] \
    && ok "collector as a dynamic user (uid $uid)" \
    || fail "collector: DynamicUser=$(prop $COLLECTOR DynamicUser), uid '$uid'"

# 3. The agent's probes attached (its log, in the journal), and the collector has its frames.
attached_now() {
    journalctl -b --no-pager -u $AGENT _PID="$(prop $AGENT MainPID)" | grep -c ' attached$'
}
wait_for 60 sh -c "[ \$(journalctl -b --no-pager -u $AGENT _PID=$(prop $AGENT MainPID) | grep -c ' attached\$') -ge 10 ]"
n=$(attached_now)
unavailable=$(journalctl -b --no-pager -o cat -u $AGENT _PID="$(prop $AGENT MainPID)" | grep 'unavailable' | cut -c1-160)
[ "$n" -ge 10 ] && [ -z "$unavailable" ] && ok "agent attached $n probes, none unavailable" \
    || fail "agent probes: $n attached; unavailable: $(echo "$unavailable" | tr '\n' '|')"
nodes() { railscope query nodes --start -10m 2>&1; }
wait_for 60 sh -c 'railscope query nodes --start -10m 2>/dev/null | grep -qx railscope-node' \
    && ok "collector archived the agent's frames (railscope query nodes: $(nodes | tr '\n' ' '))" \
    || fail "collector has no frames from railscope-node: $(nodes | tr '\n' ' ')"
# The GPU source through NVML: here the stand-in (payload/nvml: 8 scripted H100s, GPU 7 falls
# off the bus at its 8th sample), no GPU. Each GPU's power is a series of railscope-node.
gpus() { railscope query series railscope_gpu_power_watts --start -10m 2>/dev/null | grep -c '^railscope_gpu_power_watts.*railscope-node'; }
wait_for 60 sh -c "[ \$(railscope query series railscope_gpu_power_watts --start -10m 2>/dev/null | grep -c '^railscope_gpu_power_watts.*railscope-node') -ge 7 ]" \
    && ok "GPU series archived through NVML (the stand-in): railscope_gpu_power_watts of $(gpus) GPUs" \
    || fail "GPU series: $(railscope query series railscope_gpu_power_watts --start -10m 2>&1 | head -n 3 | tr '\n' '|')"
# The agent's system-call filter as systemd applied it (docs/deployment.md, "System calls"):
# a seccomp filter on the running agent; the four calls it makes beyond the set allowed, the
# rest of @privileged and @resources (and all outside @system-service) denied with EPERM.
pid=$(prop $AGENT MainPID)
filter=" $(prop $AGENT SystemCallFilter) "
wrong=""
for c in bpf perf_event_open capset open_by_handle_at ioctl; do
    case "$filter" in *" $c "*) ;; *) wrong="$wrong $c-denied" ;; esac
done
for c in setuid chroot init_module mount ptrace setrlimit; do
    case "$filter" in *" $c "*) wrong="$wrong $c-allowed" ;; esac
done
errno=$(prop $AGENT SystemCallErrorNumber)
if grep -Eq '^Seccomp:[[:space:]]+2' /proc/"$pid"/status && [ -z "$wrong" ] \
    && { [ "$errno" = 1 ] || [ "$errno" = EPERM ]; }; then
    ok "agent under its syscall filter (Seccomp 2; bpf perf_event_open capset open_by_handle_at allowed, setuid chroot init_module mount ptrace setrlimit not; errno $errno)"
else
    fail "agent's syscall filter: $(grep Seccomp: /proc/"$pid"/status | head -n1); wrong:$wrong; errno '$errno'"
fi

# A module reload under the unit: rdma_ucm, rdma_rxe and ib_uverbs removed, loaded again and
# the soft-RoCE devices made anew; the same agent process attaches ib_uverbs' family again.
uverbs_attached() {
    journalctl -b --no-pager -u $AGENT _PID="$pid" | grep -c 'ib_uverbs_post_send attached'
}
before=$(uverbs_attached)
rmmod rdma_ucm && rmmod rdma_rxe && rmmod ib_uverbs \
    || fail "rmmod rdma_ucm rdma_rxe ib_uverbs: $(lsmod | grep -E '^(rdma|ib)_' | cut -d' ' -f1 | tr '\n' ' ')"
wait_for 15 sh -c "journalctl -b --no-pager -u $AGENT _PID=$pid | grep -q 'ib_uverbs unloaded'" \
    || fail "the agent did not log 'ib_uverbs unloaded'"
modprobe rdma_rxe && modprobe ib_uverbs && modprobe rdma_ucm \
    && rdma link add rxe0 type rxe netdev vethA && rdma link add rxe1 type rxe netdev vethB \
    || fail "modprobe rdma_rxe ib_uverbs rdma_ucm and rdma link add again"
if wait_for 30 sh -c "[ \$(journalctl -b --no-pager -u $AGENT _PID=$pid | grep -c 'ib_uverbs_post_send attached') -gt $before ]" \
    && [ "$(prop $AGENT MainPID)" = "$pid" ]; then
    ok "rdma_rxe/ib_uverbs reload followed: ib_uverbs_post_send attached again by pid $pid"
else
    fail "after the reload: ib_uverbs_post_send attached $(uverbs_attached) times (before $before), $(state $AGENT)"
fi
# 4. Restarts: systemctl restart; a SIGKILL (Restart=on-failure); a SIGSTOP (the watchdog).
pid=$(prop $AGENT MainPID)
restarts=$(prop $AGENT NRestarts)
systemctl restart $AGENT && running_as_new $AGENT "$pid" \
    && ok "systemctl restart: $(state $AGENT)" || fail "systemctl restart: $(state $AGENT)"
pid=$(prop $AGENT MainPID)
kill -9 "$pid"
if wait_for 30 running_as_new $AGENT "$pid" && [ "$(prop $AGENT NRestarts)" = $((restarts + 1)) ]; then
    ok "kill -9 $pid: restarted, $(state $AGENT)"
else
    fail "kill -9 $pid: $(state $AGENT)"
fi
pid=$(prop $AGENT MainPID)
watchdog_us=$(prop $AGENT WatchdogUSec)
kill -STOP "$pid"
start=$(date +%s)
if wait_for 90 running_as_new $AGENT "$pid" && [ "$(prop $AGENT NRestarts)" = $((restarts + 2)) ]; then
    ok "SIGSTOP $pid: watchdog ($watchdog_us) fired after $(($(date +%s) - start)) s, restarted: $(state $AGENT)"
else
    fail "SIGSTOP $pid: $(state $AGENT) after $(($(date +%s) - start)) s (watchdog $watchdog_us)"
fi
journalctl -b --no-pager -u $AGENT | grep -q 'Watchdog timeout' \
    && ok "journal: Watchdog timeout" || fail "no 'Watchdog timeout' in the agent's journal"
wait_for 60 running $AGENT || true
# The restarted agent sends again: the collector sees the node in the last 20 seconds.
sleep 3
wait_for 60 sh -c 'railscope query nodes --start -20s 2>/dev/null | grep -qx railscope-node' \
    && ok "frames again after the restarts" || fail "no frames after the restarts: $(nodes)"
[ "$(prop $COLLECTOR NRestarts)" = 0 ] && running $COLLECTOR \
    && ok "collector untouched: $(state $COLLECTOR)" || fail "collector: $(state $COLLECTOR)"

# Upgrade path: the package installed again (dpkg runs postinst as for an upgrade): both
# daemons restarted, the edited conffile kept without a question.
pid=$(prop $AGENT MainPID)
cpid=$(prop $COLLECTOR MainPID)
dpkg -i /payload/railscope.deb >/tmp/dpkg-u.log 2>&1 || fail "dpkg -i again: $(tail -n 3 /tmp/dpkg-u.log)"
if wait_for 30 running_as_new $AGENT "$pid" && wait_for 30 running_as_new $COLLECTOR "$cpid" \
    && grep -q '^collector = "127.0.0.1:7670"' /etc/railscope/agent.toml; then
    ok "dpkg -i over the installed package: both restarted, edited agent.toml kept"
else
    fail "dpkg -i over the installed package: $(state $AGENT); $(state $COLLECTOR)"
fi

# No I/O error "Operation not permitted" in either daemon's journal (what a call refused by
# its system-call filter gives file, socket and sysfs operations): after the probes, the GPU
# source, the reload, the restarts and the upgrade's stops (the collector writing its
# archive out). A refused probe call is reported without its errno ("`perf_event_open`
# failed"): the probes' check above catches that.
denied=$(journalctl -b --no-pager -o cat -u $AGENT -u $COLLECTOR | grep -i 'operation not permitted\|EPERM' | cut -c1-160)
[ -z "$denied" ] && ok "no 'Operation not permitted' in the agent's or collector's journal" \
    || fail "refused calls: $(echo "$denied" | tr '\n' '|')"

# 5. Remove: both stopped, units and binaries gone, configuration and key kept.
dpkg -r railscope >/tmp/dpkg-r.log 2>&1 && ok "dpkg -r" || fail "dpkg -r: $(tail -n 3 /tmp/dpkg-r.log)"
for u in $AGENT $COLLECTOR; do
    [ "$(prop $u LoadState)" = not-found ] && [ "$(prop $u ActiveState)" = inactive ] \
        && ok "$u gone after dpkg -r" \
        || fail "$u after dpkg -r: LoadState=$(prop $u LoadState) ActiveState=$(prop $u ActiveState)"
done
pgrep -x railscope >/dev/null && fail "a railscope process is left"
pgrep -x railscope-collector >/dev/null && fail "a railscope-collector process is left"
[ ! -e /usr/bin/railscope ] && [ ! -e /usr/bin/railscope-collector ] && [ ! -e /lib/systemd/system/$AGENT ] \
    && ok "binaries and units removed" || fail "files left after dpkg -r"
[ "$(dpkg-query -W -f='${Status}' railscope 2>&1)" = "deinstall ok config-files" ] \
    && ok "dpkg status config-files" || fail "dpkg status after -r: $(dpkg-query -W -f='${Status}' railscope 2>&1)"
grep -q '^collector = "127.0.0.1:7670"' /etc/railscope/agent.toml && [ -e /etc/railscope/wire.key ] \
    && ok "conffiles (as edited) and key kept" || fail "configuration lost on dpkg -r"

# 6. Purge: configuration, key and archive gone; dpkg forgets the package.
dpkg -P railscope >/tmp/dpkg-p.log 2>&1 && ok "dpkg -P" || fail "dpkg -P: $(tail -n 3 /tmp/dpkg-p.log)"
[ ! -e /etc/railscope ] && [ ! -e /var/lib/railscope ] && [ ! -e /var/lib/private/railscope ] \
    && ok "/etc/railscope and the archive removed" \
    || fail "left after purge: $(ls -d /etc/railscope /var/lib/railscope /var/lib/private/railscope 2>/dev/null | tr '\n' ' ')"
dpkg-query -W railscope >/dev/null 2>&1 && fail "dpkg still knows railscope after purge"
ls /etc/systemd/system/multi-user.target.wants/ | grep -qE 'railscope-(agent|collector)' \
    && fail "enablement links left after purge" || ok "enablement links removed"

finish
