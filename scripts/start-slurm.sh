#!/usr/bin/env bash
# Starts a single-node Slurm on this Debian machine, without systemd: munged for authentication,
# slurmctld and slurmd as plain daemons, one node (this machine) in one default partition. It is
# what tests/slurm.rs submits its `reproduce slurm` array to; `.ci/run` calls it first.
#
#   scripts/start-slurm.sh          install (apt) what is missing, configure, start, wait until
#                                   the node is idle; says so and does nothing when it already is
#   scripts/start-slurm.sh --stop   cancel every job and stop the daemons this script started
#
# Needs root. It writes /etc/slurm/slurm.conf and /etc/slurm/cgroup.conf only when they are
# absent or carry the marker line below (written by this script); a configuration of someone
# else's is left alone, and then this script stops with an error instead.
set -euo pipefail

MARK="# Written by benign-attention scripts/start-slurm.sh; it rewrites files carrying this line."
CONF_DIR=/etc/slurm
CONF="$CONF_DIR/slurm.conf"
CGROUP_CONF="$CONF_DIR/cgroup.conf"
STATE_DIR=/var/spool/slurmctld
SPOOL_DIR=/var/spool/slurmd
LOG_DIR=/var/log/slurm
RUN_DIR=/run/slurm # pid files, and a note of the daemons this script started
MUNGE_KEY=/etc/munge/munge.key
MUNGE_PID=/run/munge/munged.pid
WAIT_S=60
export PATH="$PATH:/usr/sbin:/sbin"

say() { echo "start-slurm: $*"; }
die() {
  echo "start-slurm: $*" >&2
  exit 1
}

# Whether the process of pid file $1 is alive.
alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

# Stops the process of pid file $1 (TERM, then KILL after 10 s).
stop_pid() {
  local file=$1 name=$2 pid
  if ! alive "$file"; then
    rm -f "$file"
    return 0
  fi
  pid=$(cat "$file")
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 50); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.2
  done
  if kill -0 "$pid" 2>/dev/null; then
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$file"
  say "stopped $name (pid $pid)"
}

ours() { [ -f "$1" ] && grep -qxF "$MARK" "$1"; }

# The node's state as sinfo reports it (idle, mixed, down*, ...), empty when slurmctld does not
# answer.
node_state() { timeout 10 sinfo -h -o %T 2>/dev/null | head -n1 || true; }

healthy() {
  case "$(node_state)" in
  idle | mixed | allocated | completing) return 0 ;;
  *) return 1 ;;
  esac
}

logs() {
  local f
  for f in "$LOG_DIR/slurmctld.log" "$LOG_DIR/slurmd.log" /var/log/munge/munged.log; do
    [ -f "$f" ] || continue
    echo "---- tail of $f" >&2
    tail -n 25 "$f" >&2
  done
}

[ "$(id -u)" -eq 0 ] || die "needs root (it installs packages and starts daemons)"

if [ "${1:-}" = "--stop" ]; then
  if command -v squeue >/dev/null && healthy; then
    mapfile -t jobs < <(squeue -h -o %A 2>/dev/null || true)
    if [ ${#jobs[@]} -gt 0 ]; then
      scancel "${jobs[@]}" || true
      say "cancelled jobs ${jobs[*]}"
    fi
  fi
  # Only daemons whose pid files this script's configuration names, and munged only when this
  # script started it.
  if ours "$CONF"; then
    stop_pid "$RUN_DIR/slurmd.pid" slurmd
    stop_pid "$RUN_DIR/slurmctld.pid" slurmctld
  fi
  if [ -f "$RUN_DIR/started-munged" ]; then
    stop_pid "$MUNGE_PID" munged
    rm -f "$RUN_DIR/started-munged"
  fi
  say "stopped"
  exit 0
elif [ $# -gt 0 ]; then
  die "usage: $0 [--stop]"
fi

# A Slurm of the machine's own, already up: nothing to do. (One of this script's is checked below,
# after its configuration, which may have changed since it was started.)
if command -v sinfo >/dev/null && [ -e "$CONF" ] && ! ours "$CONF" && healthy; then
  say "already running: node $(timeout 10 sinfo -h -o '%N %T' | head -n1)"
  exit 0
fi

# 1. Packages.
missing=()
for daemon in slurmctld slurmd munged; do
  command -v "$daemon" >/dev/null || missing+=("$daemon")
done
if [ ${#missing[@]} -gt 0 ]; then
  command -v apt-get >/dev/null || die "${missing[*]} missing and no apt-get to install them"
  started=$SECONDS
  say "installing slurm-wlm munge (missing: ${missing[*]})"
  # The packages' postinst would start the daemons through invoke-rc.d, which fails without an
  # init system (and without a configuration); a policy-rc.d of 101 forbids it during the install.
  policy=/usr/sbin/policy-rc.d
  made_policy=
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod +x "$policy"
    made_policy=1
  fi
  unpolicy() { if [ -n "$made_policy" ]; then rm -f "$policy"; fi; }
  apt_install() {
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      slurm-wlm munge >/tmp/start-slurm-apt.log 2>&1
  }
  # apt-get update only when the package lists lack the packages or are stale (install fails).
  if ! apt-cache show slurm-wlm munge >/dev/null 2>&1 || ! apt_install; then
    say "apt-get update"
    apt-get update -q >/tmp/start-slurm-apt.log 2>&1 || {
      tail -n 20 /tmp/start-slurm-apt.log >&2
      unpolicy
      die "apt-get update failed"
    }
    apt_install || {
      tail -n 20 /tmp/start-slurm-apt.log >&2
      unpolicy
      die "apt-get install slurm-wlm munge failed"
    }
  fi
  unpolicy
  say "installed in $((SECONDS - started)) s"
fi
say "$(slurmctld -V)"

# 2. Munge: a key, then munged (as the munge user when it can; as root otherwise).
if [ ! -s "$MUNGE_KEY" ]; then
  mkdir -p "$(dirname "$MUNGE_KEY")"
  if command -v mungekey >/dev/null; then
    mungekey --create --keyfile="$MUNGE_KEY" >/dev/null
  else
    dd if=/dev/urandom of="$MUNGE_KEY" bs=1024 count=1 status=none
  fi
  say "created $MUNGE_KEY"
fi
munge_user=root
id munge >/dev/null 2>&1 && munge_user=munge
mkdir -p /run/munge /var/lib/munge /var/log/munge "$RUN_DIR"
chown "$munge_user": "$MUNGE_KEY" /run/munge /var/lib/munge /var/log/munge
chmod 0400 "$MUNGE_KEY"
chmod 0755 /run/munge
chmod 0700 /var/lib/munge /var/log/munge
if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  say "munged already running"
else
  rm -f /run/munge/munge.socket.2 /run/munge/munge.socket.2.lock "$MUNGE_PID"
  if [ "$munge_user" = munge ] && runuser -u munge -- munged 2>/dev/null; then
    :
  else
    # Where the munge user cannot run it (or there is none), root runs it, which munged only
    # allows with --force.
    chown root: "$MUNGE_KEY" /run/munge /var/lib/munge /var/log/munge
    munged --force
  fi
  for _ in $(seq 50); do
    munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break
    sleep 0.2
  done
  munge -n | unmunge >/dev/null || {
    logs
    die "munged does not answer"
  }
  touch "$RUN_DIR/started-munged"
  say "started munged (pid $(cat "$MUNGE_PID" 2>/dev/null || echo '?'))"
fi

# 3. The configuration: this machine as the one node, its CPUs and memory as slurmd sees them.
host=$(hostname -s)
node=$(slurmd -C 2>/dev/null | grep '^NodeName=' | head -n1 || true)
if [ -n "$node" ]; then
  node="${node/#NodeName=* CPUs=/NodeName=$host CPUs=}"
else
  node="NodeName=$host CPUs=$(nproc) RealMemory=$(free -m | awk '/^Mem:/ {print $2}')"
fi
slurm_conf="$MARK
ClusterName=benign
# 127.0.0.1: the one machine need not resolve its own name.
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$STATE_DIR
SlurmdSpoolDir=$SPOOL_DIR
SlurmctldPidFile=$RUN_DIR/slurmctld.pid
SlurmdPidFile=$RUN_DIR/slurmd.pid
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd.log
MpiDefault=none
# No mail: without it slurmctld logs an error for the missing mail program.
MailProg=/bin/true
# No cgroups (no systemd to delegate them): processes tracked through /proc, tasks not confined.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
# Cores are the consumable resource: array tasks of one core each run side by side.
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# A node that was down (the machine restarted) is returned to service when it registers.
ReturnToService=2
SlurmdTimeout=300
$node NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
# No cgroup plugin is used (proctrack/linuxproc, task/none). Versions that know
# CgroupPlugin=disabled (24.05 does) are told so, so that slurmd probes no cgroup hierarchy, which
# a machine without systemd may lack; older ones have no such value and need no cgroup settings
# with these plugins (checked with 22.05, Debian 12's).
cgroup_conf="$MARK"
if slurmd -V 2>/dev/null | awk '{split($2, v, "."); exit !(v[1] * 100 + v[2] >= 2405)}'; then
  cgroup_conf="$cgroup_conf
CgroupPlugin=disabled"
fi

changed=
write_conf() { # path content
  if [ -e "$1" ] && ! ours "$1"; then
    die "$1 exists and was not written by this script; leaving it (and Slurm) alone"
  fi
  if [ "$(cat "$1" 2>/dev/null)" != "$2" ]; then
    printf '%s\n' "$2" >"$1"
    changed=1
    say "wrote $1"
  fi
}
mkdir -p "$CONF_DIR" "$STATE_DIR" "$SPOOL_DIR" "$LOG_DIR" "$RUN_DIR"
write_conf "$CONF" "$slurm_conf"
write_conf "$CGROUP_CONF" "$cgroup_conf"

# 4. The daemons. A changed configuration restarts those already running.
if [ -z "$changed" ] && alive "$RUN_DIR/slurmctld.pid" && alive "$RUN_DIR/slurmd.pid" && healthy; then
  say "already running: node $(timeout 10 sinfo -h -o '%N %T' | head -n1)"
  exit 0
fi
if [ -n "$changed" ]; then
  stop_pid "$RUN_DIR/slurmd.pid" slurmd
  stop_pid "$RUN_DIR/slurmctld.pid" slurmctld
fi
started=$SECONDS
if alive "$RUN_DIR/slurmctld.pid"; then
  say "slurmctld already running"
else
  slurmctld || {
    logs
    die "slurmctld did not start"
  }
  say "started slurmctld"
fi
if alive "$RUN_DIR/slurmd.pid"; then
  say "slurmd already running"
else
  slurmd || {
    logs
    die "slurmd did not start"
  }
  say "started slurmd"
fi

# 5. Until the node is idle (bounded); a node left down or drained is resumed once.
resumed=
for _ in $(seq "$WAIT_S"); do
  state=$(node_state)
  case "$state" in
  idle | mixed | allocated | completing)
    say "node $host is $state ($((SECONDS - started)) s)"
    exit 0
    ;;
  down* | drain* | fail*)
    if [ -z "$resumed" ]; then
      scontrol update NodeName="$host" State=RESUME 2>/dev/null || true
      resumed=1
    fi
    ;;
  esac
  sleep 1
done
echo "start-slurm: node $host not idle after $WAIT_S s (sinfo: '$(node_state)')" >&2
timeout 10 scontrol show node "$host" >&2 || true
logs
exit 1
