#!/bin/sh
# The package test, run by systemd at boot in the systemd Debian guest
# (railscope-package-test.service) from the payload disk mounted at /payload, which holds
# railscope.deb (the node agent), railscope-collector.deb and collector/railscope-collector
# (the release collector, run from outside the packages while only the agent's package is
# installed). What an operator does and checks, in order; one line per check:
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
# running_as UNIT PID: running, still as PID (untouched).
running_as() { running "$1" && [ "$(prop "$1" MainPID)" = "$2" ]; }
status() { dpkg-query -W -f='${Status}' "$1" 2>&1; }
# A collector process, whatever its path (pgrep -x sees only the 15 characters of the
# process name, "railscope-colle").
collector_process() { pgrep -f '^[^ ]*/railscope-collector( |$)' >/dev/null; }
links() { ls /etc/systemd/system/multi-user.target.wants/ | grep -E "$1"; }
# forgotten PACKAGE: dpkg holds no record of it. dpkg-query still lists a package that an
# installed one names (railscope-collector's Suggests, Breaks and Replaces name railscope),
# as "unknown ok not-installed": no record either.
forgotten() {
    st=$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null) || return 0
    [ "$st" = "unknown ok not-installed" ]
}
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

# 1. The node agent's package alone, as on a compute node: the agent starts (no collector
# configured yet: it prints events locally); no collector is installed.
dpkg -i /payload/railscope.deb >/tmp/dpkg-i.log 2>&1
rc=$?
sed 's/^/PKGTEST:   dpkg: /' /tmp/dpkg-i.log
[ $rc = 0 ] && ok "dpkg -i railscope" || fail "dpkg -i railscope exited $rc"
[ "$(status railscope)" = "install ok installed" ] \
    && ok "dpkg status railscope installed" || fail "dpkg status railscope: $(status railscope)"
missing=""
for f in /usr/bin/railscope /lib/systemd/system/$AGENT /etc/railscope/agent.toml \
    /usr/share/doc/railscope/deployment.md /usr/share/doc/railscope/copyright \
    /usr/share/doc/railscope/examples/railscope-agent.service.d/lldp.conf; do
    [ -e $f ] || missing="$missing $f"
done
[ -z "$missing" ] && ok "railscope's files installed" || fail "installed files of railscope: missing$missing"
if [ ! -e /usr/bin/railscope-collector ] && ! command -v railscope-collector >/dev/null \
    && ! command -v railscope-gen-wire-key >/dev/null && [ ! -e /etc/railscope/collector.toml ] \
    && [ "$(prop $COLLECTOR LoadState)" = not-found ] && ! dpkg -L railscope | grep -q railscope-collector; then
    ok "no collector installed: no /usr/bin/railscope-collector, none on PATH, no $COLLECTOR"
else
    fail "the agent's package brought a collector: $(command -v railscope-collector railscope-gen-wire-key | tr '\n' ' ')$(dpkg -L railscope | grep railscope-collector | tr '\n' ' ') $COLLECTOR LoadState=$(prop $COLLECTOR LoadState)"
fi
[ "$(prop $AGENT UnitFileState)" = enabled ] && ok "$AGENT enabled" || fail "$AGENT: UnitFileState=$(prop $AGENT UnitFileState)"
wait_for 60 running $AGENT && ok "agent started by dpkg -i: $(state $AGENT)" \
    || fail "agent after dpkg -i: $(state $AGENT)"

# The collector's clients in railscope, with no collector installed: the release collector
# run from outside the packages and PATH (/opt/railscope-test: its binary, a key, a data
# directory, [actions] as a dry run) on loopback, the agent pointed at it.
T=/opt/railscope-test
mkdir -p $T && cp /payload/collector/railscope-collector $T/ && chmod 755 $T/railscope-collector
(umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >$T/wire.key && echo >>$T/wire.key)
cat >$T/collector.toml <<EOF
listen = "127.0.0.1:7670"
http = "127.0.0.1:7671"
key = "$T/wire.key"
data = "$T/data"

[actions]
dry-run = true

[[actions.rule]]
rule = "*"
action = "command"
command = ["/bin/true"]
EOF
$T/railscope-collector run --config $T/collector.toml >/tmp/test-collector.log 2>&1 &
tpid=$!
URL=http://127.0.0.1:7671
# Before any frame: the node has no finding.
if wait_for 30 sh -c "railscope findings --collector $URL"; then
    h=$(railscope health --collector $URL --unreachable-exit 3 2>&1)
    rc=$?
    [ $rc = 0 ] && echo "$h" | grep -q '^railscope health: railscope-node healthy' \
        && ok "railscope health --collector $URL (no collector installed): exit 0, $h" \
        || fail "railscope health --collector $URL: exit $rc, $h"
else
    fail "the test collector did not answer: $(tail -n 3 /tmp/test-collector.log | tr '\n' '|')"
fi
sed -i -e 's|^#collector = .*|collector = "127.0.0.1:7670"|' \
    -e "s|^#key = .*|key = \"$T/wire.key\"|" \
    -e 's|^#interval = .*|interval = 0.5|' \
    -e 's|^#nvml-lib = .*|nvml-lib = "/payload/nvml/libnvidia-ml.so.1"|' /etc/railscope/agent.toml
systemctl restart $AGENT || fail "systemctl restart $AGENT (pointed at the test collector)"
nodes() { railscope query nodes --start -10m 2>&1; }
wait_for 60 sh -c 'railscope query nodes --start -10m 2>/dev/null | grep -qx railscope-node' \
    && ok "railscope query nodes (no collector installed): $(nodes | tr '\n' ' ')" \
    || fail "railscope query nodes (no collector installed): $(nodes | tr '\n' ' ')"
railscope findings >/tmp/findings.txt 2>&1 \
    && ok "railscope findings (no collector installed): $(head -n 1 /tmp/findings.txt)" \
    || fail "railscope findings: $(tail -n 3 /tmp/findings.txt | tr '\n' '|')"
railscope actions >/tmp/actions.txt 2>&1 && grep -q '^mode: dry run' /tmp/actions.txt \
    && ok "railscope actions (no collector installed): $(head -n 1 /tmp/actions.txt)" \
    || fail "railscope actions: $(tail -n 3 /tmp/actions.txt | tr '\n' '|')"
# With the agent's frames: a verdict either way (the stand-in's GPU 7 falls off the bus), not
# "cannot ask" (exit 3).
h=$(railscope health --collector $URL --unreachable-exit 3 2>&1)
rc=$?
{ [ $rc = 0 ] || [ $rc = 1 ]; } && echo "$h" | grep -Eq '^railscope health: railscope-node (healthy|unhealthy)' \
    && ok "railscope health with the agent's frames: exit $rc, $h" \
    || fail "railscope health with the agent's frames: exit $rc, $h"
kill $tpid && wait $tpid
rc=$?
wait_for 10 sh -c "! pgrep -f '^[^ ]*/railscope-collector( |\$)'" && [ $rc = 0 ] \
    && ok "the test collector stopped (exit $rc)" \
    || fail "the test collector: exit $rc; $(tail -n 3 /tmp/test-collector.log | tr '\n' '|')"

# 2. The collector's package. No key yet: the collector is left stopped with a message naming
# the missing key; the agent is not touched.
pid=$(prop $AGENT MainPID)
dpkg -i /payload/railscope-collector.deb >/tmp/dpkg-ic.log 2>&1
rc=$?
sed 's/^/PKGTEST:   dpkg: /' /tmp/dpkg-ic.log
[ $rc = 0 ] && ok "dpkg -i railscope-collector" || fail "dpkg -i railscope-collector exited $rc"
[ "$(status railscope-collector)" = "install ok installed" ] \
    && ok "dpkg status railscope-collector installed" \
    || fail "dpkg status railscope-collector: $(status railscope-collector)"
missing=""
for f in /usr/bin/railscope-collector /usr/sbin/railscope-gen-wire-key /lib/systemd/system/$COLLECTOR \
    /etc/railscope/collector.toml /usr/share/doc/railscope-collector/deployment.md \
    /usr/share/doc/railscope-collector/copyright \
    /usr/share/doc/railscope-collector/examples/railscope-collector.service.d/slurm-actions.conf; do
    [ -e $f ] || missing="$missing $f"
done
[ -z "$missing" ] && ok "railscope-collector's files installed" \
    || fail "installed files of railscope-collector: missing$missing"
for u in $AGENT $COLLECTOR; do
    [ "$(prop $u UnitFileState)" = enabled ] && ok "$u enabled" || fail "$u: UnitFileState=$(prop $u UnitFileState)"
done
grep -q "railscope-collector.service not started: /etc/railscope/wire.key is missing" /tmp/dpkg-ic.log \
    && ok "postinst names the missing key" || fail "postinst did not say the collector waits for its key"
running_as $AGENT "$pid" && ok "agent untouched by dpkg -i railscope-collector: $(state $AGENT)" \
    || fail "agent after dpkg -i railscope-collector: $(state $AGENT) (was pid $pid)"

# 3. Configure as an operator does: a key, the agent pointed at the collector, check, start.
railscope-gen-wire-key && [ "$(stat -c %a /etc/railscope/wire.key)" = 600 ] \
    && ok "railscope-gen-wire-key (mode 600)" || fail "railscope-gen-wire-key"
# Per-node keys as a provisioning host makes them: a fleet secret, one node's key from it.
railscope-gen-wire-key /root/fleet.secret 2>/dev/null \
    && nodekey=$(railscope-gen-wire-key --node gpu-001 --secret /root/fleet.secret) \
    && [ "${#nodekey}" = 64 ] && [ "$(stat -c %a /root/fleet.secret)" = 600 ] \
    && [ "$nodekey" != "$(railscope-gen-wire-key --node gpu-002 --secret /root/fleet.secret)" ] \
    && ok "railscope-gen-wire-key --node (a node's own key)" || fail "railscope-gen-wire-key --node"
# The agent already sends to 127.0.0.1:7670 (above); now with the collector's key.
sed -i -e 's|^key = .*|key = "/etc/railscope/wire.key"|' /etc/railscope/agent.toml
# An edit of the collector's conffile (its default made explicit), kept across the upgrade.
sed -i -e 's|^#listen = .*|listen = "0.0.0.0:7670"|' /etc/railscope/collector.toml
railscope agent --check-config >/tmp/check.txt 2>&1 && grep -q '127.0.0.1:7670' /tmp/check.txt \
    && grep -q '/etc/railscope/wire.key' /tmp/check.txt && ok "railscope agent --check-config" || fail "agent --check-config: $(tail -n 3 /tmp/check.txt)"
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

# 4. The agent's probes attached (its log, in the journal), and the collector has its frames.
attached_now() {
    journalctl -b --no-pager -u $AGENT _PID="$(prop $AGENT MainPID)" | grep -c ' attached$'
}
wait_for 60 sh -c "[ \$(journalctl -b --no-pager -u $AGENT _PID=$(prop $AGENT MainPID) | grep -c ' attached\$') -ge 10 ]"
n=$(attached_now)
unavailable=$(journalctl -b --no-pager -o cat -u $AGENT _PID="$(prop $AGENT MainPID)" | grep 'unavailable' | cut -c1-160)
[ "$n" -ge 10 ] && [ -z "$unavailable" ] && ok "agent attached $n probes, none unavailable" \
    || fail "agent probes: $n attached; unavailable: $(echo "$unavailable" | tr '\n' '|')"
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
# 5. Restarts: systemctl restart; a SIGKILL (Restart=on-failure); a SIGSTOP (the watchdog).
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

# Upgrade path: each package installed again (dpkg runs postinst as for an upgrade): its
# daemon restarted, the other's untouched, the edited conffile kept without a question.
pid=$(prop $AGENT MainPID)
cpid=$(prop $COLLECTOR MainPID)
dpkg -i /payload/railscope.deb >/tmp/dpkg-u.log 2>&1 || fail "dpkg -i railscope again: $(tail -n 3 /tmp/dpkg-u.log)"
if wait_for 30 running_as_new $AGENT "$pid" && running_as $COLLECTOR "$cpid" \
    && grep -q '^collector = "127.0.0.1:7670"' /etc/railscope/agent.toml; then
    ok "dpkg -i railscope over the installed package: agent restarted, collector untouched, edited agent.toml kept"
else
    fail "dpkg -i railscope over the installed package: $(state $AGENT); $(state $COLLECTOR) (was $cpid)"
fi
pid=$(prop $AGENT MainPID)
dpkg -i /payload/railscope-collector.deb >/tmp/dpkg-uc.log 2>&1 \
    || fail "dpkg -i railscope-collector again: $(tail -n 3 /tmp/dpkg-uc.log)"
if wait_for 30 running_as_new $COLLECTOR "$cpid" && running_as $AGENT "$pid" \
    && grep -q '^listen = "0.0.0.0:7670"' /etc/railscope/collector.toml; then
    ok "dpkg -i railscope-collector over the installed package: collector restarted, agent untouched, edited collector.toml kept"
else
    fail "dpkg -i railscope-collector over the installed package: $(state $COLLECTOR); $(state $AGENT) (was $pid)"
fi
wait_for 60 sh -c 'railscope query nodes --start -20s 2>/dev/null | grep -qx railscope-node' \
    && ok "frames again after the upgrades" || fail "no frames after the upgrades: $(nodes)"

# No I/O error "Operation not permitted" in either daemon's journal (what a call refused by
# its system-call filter gives file, socket and sysfs operations): after the probes, the GPU
# source, the reload, the restarts and the upgrade's stops (the collector writing its
# archive out). A refused probe call is reported without its errno ("`perf_event_open`
# failed"): the probes' check above catches that.
denied=$(journalctl -b --no-pager -o cat -u $AGENT -u $COLLECTOR | grep -i 'operation not permitted\|EPERM' | cut -c1-160)
[ -z "$denied" ] && ok "no 'Operation not permitted' in the agent's or collector's journal" \
    || fail "refused calls: $(echo "$denied" | tr '\n' '|')"

# 6. Remove and purge each package while the other is installed: what the other needs stays.
# The agent's package removed: the agent stopped, its unit and binary gone, its configuration
# and the key kept; the collector untouched.
cpid=$(prop $COLLECTOR MainPID)
dpkg -r railscope >/tmp/dpkg-r.log 2>&1 && ok "dpkg -r railscope" || fail "dpkg -r railscope: $(tail -n 3 /tmp/dpkg-r.log)"
[ "$(prop $AGENT LoadState)" = not-found ] && [ "$(prop $AGENT ActiveState)" = inactive ] \
    && ok "$AGENT gone after dpkg -r railscope" \
    || fail "$AGENT after dpkg -r railscope: LoadState=$(prop $AGENT LoadState) ActiveState=$(prop $AGENT ActiveState)"
pgrep -x railscope >/dev/null && fail "a railscope process is left"
[ ! -e /usr/bin/railscope ] && [ ! -e /lib/systemd/system/$AGENT ] \
    && ok "railscope's binary and unit removed" || fail "railscope's files left after dpkg -r"
[ "$(status railscope)" = "deinstall ok config-files" ] \
    && ok "dpkg status railscope config-files" || fail "dpkg status railscope after -r: $(status railscope)"
grep -q '^collector = "127.0.0.1:7670"' /etc/railscope/agent.toml && [ -e /etc/railscope/wire.key ] \
    && ok "agent.toml (as edited) and key kept" || fail "configuration lost on dpkg -r railscope"
running_as $COLLECTOR "$cpid" && [ -x /usr/bin/railscope-collector ] \
    && ok "collector untouched by dpkg -r railscope: $(state $COLLECTOR)" \
    || fail "collector after dpkg -r railscope: $(state $COLLECTOR) (was $cpid)"

# The agent's package purged: agent.toml, the spool and the agent's enablement gone; the key,
# collector.toml, the archive and the collector's enablement kept, the collector untouched.
dpkg -P railscope >/tmp/dpkg-p.log 2>&1 && ok "dpkg -P railscope" || fail "dpkg -P railscope: $(tail -n 3 /tmp/dpkg-p.log)"
forgotten railscope || fail "dpkg still knows railscope after purge: $(status railscope)"
[ ! -e /etc/railscope/agent.toml ] && [ ! -e /var/lib/railscope-agent ] && ! links railscope-agent >/dev/null \
    && ok "agent.toml, the agent's spool and enablement removed" \
    || fail "left after dpkg -P railscope: $(ls -d /etc/railscope/agent.toml /var/lib/railscope-agent 2>/dev/null | tr '\n' ' ')$(links railscope-agent)"
[ -e /etc/railscope/wire.key ] && grep -q '^listen = "0.0.0.0:7670"' /etc/railscope/collector.toml \
    && [ -d /var/lib/private/railscope ] && links railscope-collector >/dev/null && running_as $COLLECTOR "$cpid" \
    && ok "the collector's key, collector.toml, archive and enablement kept, collector untouched" \
    || fail "dpkg -P railscope took the collector's: $(ls /etc/railscope 2>&1 | tr '\n' ' '); $(state $COLLECTOR)"

# The agent's package again: a fresh agent.toml, the agent enabled and started.
dpkg -i /payload/railscope.deb >/tmp/dpkg-i2.log 2>&1 || fail "dpkg -i railscope after its purge: $(tail -n 3 /tmp/dpkg-i2.log)"
[ -e /etc/railscope/agent.toml ] && [ "$(prop $AGENT UnitFileState)" = enabled ] && wait_for 60 running $AGENT \
    && ok "dpkg -i railscope after its purge: agent.toml back, $AGENT enabled and started" \
    || fail "dpkg -i railscope after its purge: $(state $AGENT), UnitFileState=$(prop $AGENT UnitFileState)"

# The collector's package removed: the collector stopped, its unit, binary and key tool gone,
# its configuration and the key kept; the agent untouched.
pid=$(prop $AGENT MainPID)
dpkg -r railscope-collector >/tmp/dpkg-rc.log 2>&1 && ok "dpkg -r railscope-collector" \
    || fail "dpkg -r railscope-collector: $(tail -n 3 /tmp/dpkg-rc.log)"
[ "$(prop $COLLECTOR LoadState)" = not-found ] && [ "$(prop $COLLECTOR ActiveState)" = inactive ] \
    && ok "$COLLECTOR gone after dpkg -r railscope-collector" \
    || fail "$COLLECTOR after dpkg -r railscope-collector: LoadState=$(prop $COLLECTOR LoadState) ActiveState=$(prop $COLLECTOR ActiveState)"
collector_process && fail "a railscope-collector process is left"
[ ! -e /usr/bin/railscope-collector ] && [ ! -e /usr/sbin/railscope-gen-wire-key ] && [ ! -e /lib/systemd/system/$COLLECTOR ] \
    && ok "railscope-collector's binaries and unit removed" || fail "railscope-collector's files left after dpkg -r"
[ "$(status railscope-collector)" = "deinstall ok config-files" ] \
    && ok "dpkg status railscope-collector config-files" \
    || fail "dpkg status railscope-collector after -r: $(status railscope-collector)"
grep -q '^listen = "0.0.0.0:7670"' /etc/railscope/collector.toml && [ -e /etc/railscope/wire.key ] \
    && ok "collector.toml (as edited) and key kept" || fail "configuration lost on dpkg -r railscope-collector"
running_as $AGENT "$pid" && ok "agent untouched by dpkg -r railscope-collector: $(state $AGENT)" \
    || fail "agent after dpkg -r railscope-collector: $(state $AGENT) (was $pid)"

# The collector's package purged: collector.toml, the archive and the collector's enablement
# gone; the key and agent.toml kept (the agent reads them), the agent untouched.
dpkg -P railscope-collector >/tmp/dpkg-pc.log 2>&1 && ok "dpkg -P railscope-collector" \
    || fail "dpkg -P railscope-collector: $(tail -n 3 /tmp/dpkg-pc.log)"
dpkg-query -W railscope-collector >/dev/null 2>&1 && fail "dpkg still knows railscope-collector after purge"
[ ! -e /etc/railscope/collector.toml ] && [ ! -e /var/lib/railscope ] && [ ! -e /var/lib/private/railscope ] \
    && ! links railscope-collector >/dev/null \
    && ok "collector.toml, the archive and the collector's enablement removed" \
    || fail "left after dpkg -P railscope-collector: $(ls -d /etc/railscope/collector.toml /var/lib/railscope /var/lib/private/railscope 2>/dev/null | tr '\n' ' ')$(links railscope-collector)"
[ -e /etc/railscope/wire.key ] && [ -e /etc/railscope/agent.toml ] && links railscope-agent >/dev/null \
    && running_as $AGENT "$pid" \
    && ok "the agent's key, agent.toml and enablement kept, agent untouched" \
    || fail "dpkg -P railscope-collector took the agent's: $(ls /etc/railscope 2>&1 | tr '\n' ' '); $(state $AGENT)"

# The last package removed, then purged: the agent stopped, its unit and binary gone; then
# configuration, key, spool and enablement; dpkg forgets both packages.
dpkg -r railscope >/tmp/dpkg-r2.log 2>&1 && ok "dpkg -r railscope (the last package)" \
    || fail "dpkg -r railscope (the last package): $(tail -n 3 /tmp/dpkg-r2.log)"
[ "$(prop $AGENT LoadState)" = not-found ] && [ "$(prop $AGENT ActiveState)" = inactive ] \
    && ! pgrep -x railscope >/dev/null && [ ! -e /usr/bin/railscope ] \
    && ok "$AGENT gone, no railscope process, binary removed" \
    || fail "$AGENT after dpkg -r: LoadState=$(prop $AGENT LoadState) ActiveState=$(prop $AGENT ActiveState)"
dpkg -P railscope >/tmp/dpkg-p2.log 2>&1 && ok "dpkg -P railscope (the last package)" \
    || fail "dpkg -P railscope (the last package): $(tail -n 3 /tmp/dpkg-p2.log)"
[ ! -e /etc/railscope ] && [ ! -e /var/lib/railscope ] && [ ! -e /var/lib/private/railscope ] \
    && [ ! -e /var/lib/railscope-agent ] \
    && ok "/etc/railscope, the archive and the spool removed" \
    || fail "left after purge: $(ls -d /etc/railscope /var/lib/railscope /var/lib/private/railscope /var/lib/railscope-agent 2>/dev/null | tr '\n' ' ')"
dpkg-query -W railscope >/dev/null 2>&1 && fail "dpkg still knows railscope after purge"
dpkg-query -W railscope-collector >/dev/null 2>&1 && fail "dpkg still knows railscope-collector after purge"
links 'railscope-(agent|collector)' >/dev/null \
    && fail "enablement links left after purge" || ok "enablement links removed"

finish
