#!/usr/bin/env bash
# A cluster of N hosts on this one machine, for tests that run ranks "across nodes".
#
#   sim_cluster.sh [--dir DIR] [--hosts N] [--rate RATE] [--slurm] [--share PATH]... start
#   sim_cluster.sh [--dir DIR] stop
#   sim_cluster.sh [--dir DIR] exec HOST CMD...      run CMD on HOST (stdin/stdout pass through)
#   sim_cluster.sh [--dir DIR] kill HOST             kill every process of HOST (a crashed node)
#   sim_cluster.sh [--dir DIR] link HOST up|down     take HOST's network link down or up
#   sim_cluster.sh [--dir DIR] info                  print the cluster's variables (sourceable)
#   sim_cluster.sh gc                                stop every cluster whose DIR was deleted
#   sim_cluster.sh check                             exit 0 when a cluster can be built here,
#                                                    else print why and exit 77
#
# Options may also come from the environment: NCF_CLUSTER_DIR, HOSTS (2), RATE (1gbit;
# "none" leaves the links unshaped), SLURM=1. NCF_CLUSTER_OWNER, when set, is written
# into the cluster's registration (CLUSTER_OWNER=...), so that whoever set it can tell
# its clusters from those of others running at the same time (run_all.sh does).
#
# DIR (default /var/tmp/ncf-cluster) is the cluster's "shared file system": its own
# configuration and state live there, and so must data and checkpoints that several hosts
# read. Each host has its own /tmp, so DIR may not be under /tmp.
#
# --share PATH (repeatable) shows the machine's PATH to every host at the same path when
# PATH is under /tmp, which a host would otherwise not see (a clone or a build under
# /tmp); a PATH elsewhere is seen anyway. lib.sh shares the repository and the build.
#
# What a host is: a network namespace (ip netns) named <prefix>-nodeK with one interface,
# eth0 = 10.213.ID.K/24, a veth whose other end is on a bridge shared by the cluster's
# hosts; plus one long-lived "anchor" process in that namespace that holds a UTS
# namespace (hostname nodeK) and a mount namespace in which DIR/host/nodeK/tmp is /tmp,
# a private tmpfs is /dev/shm and DIR/hosts is /etc/hosts. `exec` enters the anchor's
# namespaces with nsenter (not `ip netns exec`, which remounts /sys and hides the cgroup
# file systems slurmd looks for). Every host sees the machine's other files, /proc and
# /sys. Both ends of each veth are shaped with tc tbf at RATE, so a host's traffic in
# each direction is limited like a NIC's; ranks on one host talk through shared memory.
#
# ID (1..200) is the first one whose bridge name is free and whose subnet no route of
# this machine covers, so clusters of concurrent tests do not meet. The root namespace
# gets no address on the subnet: only the hosts use it.
#
# --slurm also starts munged (in the root namespace; the hosts reach it through its
# socket in DIR), slurmctld on node1 and one slurmd per host (DIR/slurm). `exec` then
# sets SLURM_CONF, so `exec node1 sbatch ...` talks to this cluster.
#
# stop kills every process in the hosts' namespaces and munged, deletes namespaces,
# veths and the bridge, and removes DIR's runtime files (logs stay in DIR/logs). It is
# idempotent and works after a failed or partial start, and also when DIR was deleted
# while the cluster ran (clusters are registered in /run/ncf-sim-cluster). For tests
# of stop, NCF_SIM_FAIL_AFTER_HOST=K makes start fail once host K is up, and
# NCF_SIM_HOLD_AFTER_HOST=K makes it wait there (DIR/host/held) until it is killed.
#
# Needs root, ip, unshare, nsenter, setsid (and tc for shaping; Debian's slurmctld,
# slurmd, slurm-client and munge for --slurm).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
prog=sim_cluster.sh

die() { echo "$prog: $*" >&2; exit 1; }

dir=${NCF_CLUSTER_DIR:-/var/tmp/ncf-cluster}
nhosts=${HOSTS:-2}
rate=${RATE:-1gbit}
want_slurm=${SLURM:-0}
shares=()
while [ $# -gt 0 ]; do
  case "$1" in
    --dir) dir="$2"; shift 2 ;;
    --dir=*) dir="${1#*=}"; shift ;;
    --hosts) nhosts="$2"; shift 2 ;;
    --hosts=*) nhosts="${1#*=}"; shift ;;
    --rate) rate="$2"; shift 2 ;;
    --rate=*) rate="${1#*=}"; shift ;;
    --slurm) want_slurm=1; shift ;;
    --share) shares+=("$2"); shift 2 ;;
    --share=*) shares+=("${1#*=}"); shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) die "unknown option '$1'" ;;
    *) break ;;
  esac
done
cmd=${1:-}
[ -n "$cmd" ] || die "usage: $prog [--dir DIR] [--hosts N] [--rate RATE] [--slurm] [--share PATH]... start|stop|exec|kill|link|info|gc|check"
shift

# check: can this machine build a cluster? Prints the reason and exits 77 when not, so
# that callers can report their tests as skipped rather than failed.
check() {
  local t
  [ "$(id -u)" -eq 0 ] || { echo "needs root (network namespaces, bridges, mounts)"; return 77; }
  for t in ip unshare nsenter; do
    command -v "$t" >/dev/null || { echo "'$t' is not installed"; return 77; }
  done
  unshare --uts --mount --propagation private true 2>/dev/null ||
    { echo "cannot create UTS and mount namespaces (unshare --uts --mount failed)"; return 77; }
  t="ncfchk$$"
  ip netns add "$t" 2>/dev/null || { echo "cannot create network namespaces (ip netns add failed)"; return 77; }
  ip netns del "$t"
  ip link add "$t" type bridge 2>/dev/null || { echo "cannot create a Linux bridge (ip link add type bridge failed)"; return 77; }
  ip link del "$t"
  return 0
}
if [ "$cmd" = check ]; then
  rc=0
  why=$(check) || rc=$?
  [ "$rc" -eq 0 ] || echo "$prog: no cluster on this machine: $why" >&2
  exit "$rc"
fi

[[ "$dir" = /* ]] || dir="$PWD/$dir"
dir="$(realpath -m "$dir")"
env_file="$dir/cluster.env"

# The cluster's variables, written at start and read by every other command.
# Every running cluster is also registered in $registry (this machine's /run), so that
# stop can find its namespaces even when DIR was deleted under it.
registry=/run/ncf-sim-cluster
load() {
  local f
  if [ -f "$env_file" ]; then
    # shellcheck disable=SC1090
    source "$env_file"
    return 0
  fi
  for f in "$registry"/*.env; do
    if [ ! -f "$f" ] || ! grep -qxF "CLUSTER_DIR=$dir" "$f"; then continue; fi
    # shellcheck disable=SC1090
    source "$f"
    return 0
  done
  return 1
}

host_index() {  # nodeK -> K, or fail
  local h="$1"
  [[ "$h" =~ ^node([0-9]+)$ ]] || die "unknown host '$h' (hosts are node1..node$CLUSTER_HOSTS)"
  local k=${BASH_REMATCH[1]}
  if [ "$k" -lt 1 ] || [ "$k" -gt "$CLUSTER_HOSTS" ]; then
    die "unknown host '$h' (hosts are node1..node$CLUSTER_HOSTS)"
  fi
  echo "$k"
}

anchor_pid() {  # the pid whose namespaces are host $1's, or fail
  local f="$dir/host/$1/anchor.pid" pid
  [ -f "$f" ] || die "host $1 is not running (no $f)"
  pid=$(cat "$f")
  # The anchor is gone after `kill HOST`: entering its namespaces is then impossible, as
  # logging in to a crashed node is.
  if [ ! -d "/proc/$pid" ] || [ "$(readlink "/proc/$pid/ns/net")" != "$(cat "$dir/host/$1/netns.id")" ]; then
    die "host $1 is down (its anchor process $pid is gone)"
  fi
  echo "$pid"
}

# Enter host $1 and run the rest. The working directory is kept when the host sees it
# (everything but /tmp is shared).
host_exec() {
  local h="$1" pid wd="/"
  shift
  pid=$(anchor_pid "$h")
  case "$PWD" in
    /tmp|/tmp/*)
      local p
      while IFS= read -r p; do
        case "$PWD/" in "$p"/*) wd="$PWD" ;; esac
      done < <(cat "$dir/shares" 2>/dev/null)
      ;;
    *) wd="$PWD" ;;
  esac
  if [ -f "$dir/slurm/slurm.conf" ]; then export SLURM_CONF="$dir/slurm/slurm.conf"; fi
  exec nsenter -t "$pid" --net --uts --mount --wd="$wd" -- "$@"
}

# --- stop ---------------------------------------------------------------------------------
kill_netns_procs() {  # ns [signal wait]: kill every process in network namespace ns
  local ns="$1" pids
  pids=$(ip netns pids "$ns" 2>/dev/null || true)
  [ -n "$pids" ] || return 0
  # shellcheck disable=SC2086
  kill -TERM $pids 2>/dev/null || true
  for _ in $(seq 30); do
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    [ -n "$pids" ] || return 0
    sleep 0.1
  done
  # Listed again: a pid of the list above whose process ended in the meantime may
  # belong to another process by now (pid_max can be 32768).
  pids=$(ip netns pids "$ns" 2>/dev/null || true)
  # shellcheck disable=SC2086
  [ -z "$pids" ] || kill -KILL $pids 2>/dev/null || true
  for _ in $(seq 50); do
    [ -n "$(ip netns pids "$ns" 2>/dev/null || true)" ] || return 0
    sleep 0.1
  done
  echo "$prog: processes still in $ns: $(ip netns pids "$ns" | tr '\n' ' ')" >&2
  return 1
}

stop() {
  load || { rm -rf "$dir/host" "$dir/slurm" "$dir/munge"; return 0; }
  local ns k rc=0 l
  # Daemons first, gently, so that slurmd does not report its node lost while the
  # controller is going: slurmd and slurmctld save state on SIGTERM.
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${CLUSTER_PREFIX}-node[0-9]+$" || true); do
    kill_netns_procs "$ns" || rc=1
    ip netns del "$ns" 2>/dev/null || { echo "$prog: could not delete namespace $ns" >&2; rc=1; }
  done
  # munged: by its pid file, or (DIR gone) by the socket path on its command line.
  local mp
  for mp in $( { cat "$dir/munge/munged.pid" 2>/dev/null || true
                 pgrep -f -x "munged .*--socket=$dir/munge/socket .*" || true; } | sort -u); do
    if [ -d "/proc/$mp" ] && grep -q munged "/proc/$mp/comm" 2>/dev/null; then
      kill "$mp" 2>/dev/null || true
      for _ in $(seq 30); do [ -d "/proc/$mp" ] || break; sleep 0.1; done
      kill -KILL "$mp" 2>/dev/null || true
    fi
  done
  # A veth whose namespace was deleted goes with it; one left by a start that failed
  # before moving its peer is deleted here.
  for l in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' |
             grep -E "^${CLUSTER_PREFIX}h[0-9]+$|^${CLUSTER_PREFIX}p[0-9]+$" || true); do
    ip link del "$l" 2>/dev/null || true
  done
  if ip link show "$CLUSTER_BRIDGE" >/dev/null 2>&1; then
    ip link del "$CLUSTER_BRIDGE" || { echo "$prog: could not delete bridge $CLUSTER_BRIDGE" >&2; rc=1; }
  fi
  if [ "$rc" -eq 0 ]; then
    rm -rf "$dir/host" "$dir/slurm" "$dir/munge" "$dir/hosts" "$env_file"
    # The registry directory stays: removing it when empty raced with a concurrent
    # start between its mkdir -p and its cp.
    rm -f "$registry/$CLUSTER_PREFIX.env"
  fi
  return "$rc"
}

# --- start --------------------------------------------------------------------------------
start_host() {  # k
  local k="$1" h="node$1" ns="${CLUSTER_PREFIX}-node$1" vh="${CLUSTER_PREFIX}h$1" vp="${CLUSTER_PREFIX}p$1"
  ip netns add "$ns"
  ip link add "$vh" type veth peer name "$vp"
  ip link set "$vh" master "$CLUSTER_BRIDGE" up
  ip link set "$vp" netns "$ns"
  ip -n "$ns" link set "$vp" name eth0
  ip -n "$ns" addr add "$CLUSTER_NET.$k/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
  if [ "$CLUSTER_RATE" != none ]; then
    # tbf needs a bucket of at least one (GSO) packet, and about 10 ms of traffic so that
    # the kernel's timer granularity does not cut the rate.
    local bps burst
    bps=$(tc_rate_bits "$CLUSTER_RATE")
    burst=$(( bps / 8 / 100 ))
    [ "$burst" -ge 131072 ] || burst=131072
    tc -n "$ns" qdisc add dev eth0 root tbf rate "$CLUSTER_RATE" burst "$burst" latency 50ms
    tc qdisc add dev "$vh" root tbf rate "$CLUSTER_RATE" burst "$burst" latency 50ms
  fi
  mkdir -p "$dir/host/$h/tmp"
  chmod 1777 "$dir/host/$h/tmp"
  [ -f "$dir/shares" ] || : >"$dir/shares"
  # The anchor: enters the network namespace, makes its UTS and mount namespaces, sets
  # them up and sleeps; its pid is the handle of the host. Its mounts are private to it
  # and vanish with its namespace.
  rm -f "$dir/host/$h/ready"
  # shellcheck disable=SC2016  # the anchor's shell expands these
  nsenter --net="/run/netns/$ns" -- unshare --uts --mount --propagation private -- \
    /bin/sh -c '
      set -e
      hostname "$1"
      # the shared paths under /tmp first, inside the host'"'"'s /tmp, carried along below
      while IFS= read -r p; do
        mkdir -p "$2/host/$1$p"
        mount --bind "$p" "$2/host/$1$p"
      done <"$2/shares"
      mount --rbind "$2/host/$1/tmp" /tmp
      mount --bind "$2/hosts" /etc/hosts
      mount -t tmpfs -o mode=1777 tmpfs /dev/shm
      touch "$2/host/$1/ready"
      exec sleep infinity' anchor "$h" "$dir" </dev/null >>"$dir/logs/$h.anchor.log" 2>&1 &
  echo $! >"$dir/host/$h/anchor.pid"
  # Until the anchor says it is ready or has died (set -e): how long its mounts take
  # on a loaded machine is not a condition. The limit is only a safety net.
  local t0=$SECONDS
  while [ ! -f "$dir/host/$h/ready" ] && [ $((SECONDS - t0)) -lt 120 ]; do
    kill -0 "$(cat "$dir/host/$h/anchor.pid")" 2>/dev/null || break
    sleep 0.05
  done
  [ -f "$dir/host/$h/ready" ] || { cat "$dir/logs/$h.anchor.log" >&2; die "host $h did not come up"; }
  # Wait until the anchor is the sleep (the exec above), then record its namespace id:
  # a later pid reuse must not pass for the host.
  local pid
  pid=$(cat "$dir/host/$h/anchor.pid")
  while [ "$(cat "/proc/$pid/comm" 2>/dev/null)" != sleep ] && [ $((SECONDS - t0)) -lt 120 ]; do
    kill -0 "$pid" 2>/dev/null || die "host $h: its anchor $pid died after it was ready"
    sleep 0.02
  done
  readlink "/proc/$pid/ns/net" >"$dir/host/$h/netns.id"
  # A connection with unacknowledged data ignores keepalive: the kernel retransmits,
  # 15 times by default (tcp_retries2), about 15 minutes, before it gives up. That is
  # how an Open MPI daemon cut off from mpirun learns it, when it has output of its
  # ranks to forward. 5 retransmits give up after about 13 s, as a cluster tuned for
  # fast failure detection would. Keepalive defaults apply to sockets that ask for
  # keepalive without their own timing (Slurm's).
  nsenter --net="/run/netns/$ns" -- sysctl -q -w net.ipv4.tcp_retries2=5 net.ipv4.tcp_keepalive_time=10 \
    net.ipv4.tcp_keepalive_intvl=3 net.ipv4.tcp_keepalive_probes=3 >/dev/null 2>&1 || true
}

tc_rate_bits() {  # 1gbit, 100mbit, 500kbit, 1000000 -> bits per second
  local r="${1,,}" n u
  [[ "$r" =~ ^([0-9]+)([kmg]?)(bit|bps)?$ ]] || die "rate '$1' is not like 1gbit, 100mbit or 500kbit"
  n=${BASH_REMATCH[1]} u=${BASH_REMATCH[2]}
  case "$u" in k) n=$((n * 1000)) ;; m) n=$((n * 1000000)) ;; g) n=$((n * 1000000000)) ;; esac
  [ "${BASH_REMATCH[3]}" = bps ] && n=$((n * 8))
  echo "$n"
}

start_slurm() {
  local t
  for t in munged slurmctld slurmd sinfo; do
    command -v "$t" >/dev/null || die "$t is not installed (run tests/slurm/setup.sh)"
  done
  local s="$dir/slurm" m="$dir/munge"
  mkdir -p "$s/state" "$s/spool" "$m"
  chmod 700 "$m"
  dd if=/dev/urandom of="$m/munge.key" bs=1024 count=1 status=none
  chmod 400 "$m/munge.key"
  # One munged serves every host: the hosts share the file system, and a Unix socket
  # path reaches across network namespaces.
  munged --force --key-file="$m/munge.key" --socket="$m/socket" --pid-file="$m/munged.pid" \
    --log-file="$dir/logs/munged.log" --seed-file="$m/seed"
  local cpus nodes="" k mem
  # Every host is this machine: each offers all its cores (at least 4, so that 2 to 4
  # ranks per host fit), and slurmd is told to believe the configuration.
  cpus=$(nproc)
  [ "$cpus" -ge 4 ] || cpus=4
  mem=$(( $(awk '/MemTotal/{print $2}' /proc/meminfo) / 1024 / CLUSTER_HOSTS ))
  for k in $(seq "$CLUSTER_HOSTS"); do
    nodes+="NodeName=node$k NodeAddr=$CLUSTER_NET.$k CPUs=$cpus RealMemory=$mem State=UNKNOWN"$'\n'
  done
  sed -e "s|@DIR@|$s|g" -e "s|@LOGS@|$dir/logs|g" -e "s|@CTLD_ADDR@|$CLUSTER_NET.1|g" \
    -e "s|@MUNGE@|$m/socket|g" -e "s|@NODES@|node[1-$CLUSTER_HOSTS]|g" \
    "$here/slurm.conf.in" >"$s/slurm.conf"
  printf '%s' "$nodes" >>"$s/slurm.conf"
  printf 'PartitionName=debug Nodes=node[1-%s] Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4\n' \
    "$CLUSTER_HOSTS" >>"$s/slurm.conf"
  export SLURM_CONF="$s/slurm.conf"
  "$0" --dir "$dir" exec node1 slurmctld -f "$SLURM_CONF"
  for k in $(seq "$CLUSTER_HOSTS"); do
    "$0" --dir "$dir" exec "node$k" slurmd -f "$SLURM_CONF" -N "node$k"
  done
  # Until every node has registered and is idle; slurmd registers after its start,
  # later on a loaded machine. The limit is only a safety net.
  local state="" t0=$SECONDS
  while [ $((SECONDS - t0)) -lt 180 ]; do
    state=$("$0" --dir "$dir" exec node1 sinfo -h -N -o '%N %t' 2>/dev/null | sort | tr '\n' ' ' || true)
    [ "$(grep -o ' idle' <<<" $state" | wc -l)" -eq "$CLUSTER_HOSTS" ] && return 0
    sleep 0.2
  done
  tail -n 20 "$dir/logs/slurmctld.log" "$dir"/logs/slurmd-*.log >&2 || true
  die "the Slurm nodes did not all become idle (sinfo: $state)"
}

start() {
  if ! [[ "$nhosts" =~ ^[0-9]+$ ]] || [ "$nhosts" -lt 1 ] || [ "$nhosts" -gt 32 ]; then
    die "--hosts must be 1..32, got '$nhosts'"
  fi
  case "$dir" in /tmp|/tmp/*) die "DIR $dir is under /tmp, which every host has its own of; use e.g. /var/tmp/..." ;; esac
  local why rc=0
  why=$(check) || rc=$?
  [ "$rc" -eq 0 ] || { echo "$prog: no cluster on this machine: $why" >&2; exit "$rc"; }
  [ "$rate" = none ] || command -v tc >/dev/null || die "tc is not installed (or use --rate none)"
  [ "$rate" = none ] || tc_rate_bits "$rate" >/dev/null
  if load; then
    echo "$prog: $dir holds a cluster already ($CLUSTER_PREFIX); stopping it first" >&2
    stop
  fi
  # Logs of an earlier cluster in DIR would mix with this one's.
  rm -rf "$dir/logs"
  mkdir -p "$dir/logs"
  # The paths under /tmp the hosts are to see (--share), one per line, resolved.
  local p
  : >"$dir/shares"
  for p in ${shares[@]+"${shares[@]}"}; do
    [ -d "$p" ] || die "--share $p: no such directory"
    p=$(realpath "$p")
    case "$p" in /tmp/*) echo "$p" >>"$dir/shares" ;; /tmp) die "--share /tmp: share a folder under it" ;; esac
  done
  # Take the first free id: `ip link add` of the bridge is the atomic claim.
  local id net=""
  for id in $(seq 1 200); do
    net="10.213.$id"
    if ip -4 route show | awk '$1 != "default" {print $1}' | grep -q "^$net\."; then continue; fi
    if ip -4 -o addr show | grep -q " $net\."; then continue; fi
    if ip link add "ncf${id}br" type bridge 2>/dev/null; then break; fi
    net=""
  done
  [ -n "$net" ] || die "no free cluster id (bridges ncf1br..ncf200br all exist)"
  echo "$(date '+%F %T') cluster ncf$id: $nhosts hosts on $net.0/24" >>"$dir/logs/cluster.log"
  cat >"$env_file" <<EOF
CLUSTER_DIR=$dir
CLUSTER_ID=$id
CLUSTER_PREFIX=ncf$id
CLUSTER_BRIDGE=ncf${id}br
CLUSTER_NET=$net
CLUSTER_SUBNET=$net.0/24
CLUSTER_HOSTS=$nhosts
CLUSTER_RATE=$rate
CLUSTER_OWNER=${NCF_CLUSTER_OWNER:-}
EOF
  mkdir -p "$registry"
  cp "$env_file" "$registry/ncf$id.env"
  load
  # From here on a failure (die, or a command failing under set -e) must not leave half
  # a cluster behind.
  trap 'echo "$prog: start failed; tearing down" >&2; stop || true' EXIT
  ip link set "$CLUSTER_BRIDGE" up
  {
    echo "127.0.0.1 localhost"
    echo "::1 localhost ip6-localhost ip6-loopback"
    for k in $(seq "$nhosts"); do echo "$net.$k node$k"; done
  } >"$dir/hosts"
  local k
  for k in $(seq "$nhosts"); do
    start_host "$k"
    # For the tests of stop: a start that fails half way, or that stops half way,
    # as a process (no trap runs), until it is killed: DIR/host/held says it is there.
    [ "${NCF_SIM_FAIL_AFTER_HOST:-0}" != "$k" ] || die "failing after host node$k (NCF_SIM_FAIL_AFTER_HOST)"
    if [ "${NCF_SIM_HOLD_AFTER_HOST:-0}" = "$k" ]; then
      touch "$dir/host/held"
      exec sleep infinity
    fi
  done
  # Every host must reach every other one before anything runs on them: one answer
  # to node1's pings, however late (a loaded machine); the limit is a safety net.
  for k in $(seq 2 "$nhosts"); do
    command -v ping >/dev/null || break
    nsenter --net="/run/netns/${CLUSTER_PREFIX}-node1" -- ping -c 1 -w 60 "$net.$k" >/dev/null ||
      die "node1 cannot reach node$k ($net.$k) over the bridge"
  done
  if [ "$want_slurm" = 1 ]; then start_slurm; fi
  trap - EXIT
  echo "CLUSTER_DIR=$dir"
  echo "CLUSTER_HOSTS=$nhosts"
  echo "CLUSTER_SUBNET=$CLUSTER_SUBNET"
  if [ "$want_slurm" = 1 ]; then echo "SLURM_CONF=$dir/slurm/slurm.conf"; fi
}

case "$cmd" in
  start) start ;;
  stop) stop ;;
  gc)
    # Clusters whose DIR is gone (deleted while they ran): nothing can use them.
    for f in "$registry"/*.env; do
      [ -f "$f" ] || continue
      d=$(sed -n 's/^CLUSTER_DIR=//p' "$f")
      [ ! -e "$d/cluster.env" ] || continue
      echo "$prog: stopping $(basename "$f" .env), whose directory $d is gone" >&2
      "$0" --dir "$d" stop
    done
    ;;
  info)
    load || die "no cluster in $dir"
    cat "$env_file"
    if [ -f "$dir/slurm/slurm.conf" ]; then echo "SLURM_CONF=$dir/slurm/slurm.conf"; fi
    ;;
  exec)
    load || die "no cluster in $dir"
    [ $# -ge 2 ] || die "usage: $prog exec HOST CMD..."
    host_index "$1" >/dev/null
    host_exec "$@"
    ;;
  kill)
    load || die "no cluster in $dir"
    [ $# -eq 1 ] || die "usage: $prog kill HOST"
    k=$(host_index "$1")
    # A crashed node: every process in its namespaces dies at once (SIGKILL, no chance
    # to say goodbye), the anchor with them, so its /tmp and /dev/shm mounts go too.
    pids=$(ip netns pids "${CLUSTER_PREFIX}-node$k" 2>/dev/null || true)
    # shellcheck disable=SC2086
    [ -z "$pids" ] || kill -KILL $pids 2>/dev/null || true
    ;;
  link)
    load || die "no cluster in $dir"
    [ $# -eq 2 ] || die "usage: $prog link HOST up|down"
    k=$(host_index "$1")
    case "$2" in up|down) ;; *) die "link state must be up or down, got '$2'" ;; esac
    # The bridge side of the host's veth: the host keeps its address and its processes,
    # but no frame leaves or reaches it (a pulled cable). The flag file tells
    # rsh_agent.sh that a hang-up cannot reach the host either.
    ip link set "${CLUSTER_PREFIX}h$k" "$2"
    if [ "$2" = down ]; then touch "$dir/host/node$k/link.down"; else rm -f "$dir/host/node$k/link.down"; fi
    ;;
  *) die "unknown command '$cmd' (start, stop, exec, kill, link, info, gc, check)" ;;
esac
