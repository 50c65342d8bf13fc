#!/usr/bin/env bash
# A one-node Slurm cluster on localhost (munged, slurmctld, slurmd), for tests:
#   tests/slurm/cluster.sh start DIR   writes DIR/slurm.conf, starts the daemons, waits
#                                      until the node is idle; prints SLURM_CONF=...
#   tests/slurm/cluster.sh stop DIR    stops them and removes their state
# Everything lives under DIR; the commands find the cluster through SLURM_CONF.
# Needs root and Debian's slurmctld, slurmd, slurm-client and munge
# (tests/slurm/setup.sh installs them).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cmd=${1:-}
dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || { echo "usage: $0 start|stop DIR" >&2; exit 2; }
mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"
conf="$dir/slurm.conf"
export SLURM_CONF="$conf"

stop_slurm() {
  for d in slurmd slurmctld; do
    if [ -f "$dir/$d.pid" ]; then
      kill "$(cat "$dir/$d.pid")" 2>/dev/null || true
    fi
  done
  for _ in $(seq 50); do
    pgrep -f "slurm(ctld|d) -f $conf" >/dev/null || break
    sleep 0.2
  done
  pkill -9 -f "slurm(ctld|d) -f $conf" 2>/dev/null || true
}

stop() {
  stop_slurm
  if [ -f "$dir/munged.pid" ]; then
    kill "$(cat "$dir/munged.pid")" 2>/dev/null || true
  fi
  rm -rf "$dir/state" "$dir/spool"
}

case "$cmd" in
  start)
    stop
    for p in munged slurmctld slurmd sinfo; do
      command -v "$p" >/dev/null || { echo "cluster.sh: $p is not installed (run tests/slurm/setup.sh)" >&2; exit 1; }
    done
    mkdir -p "$dir/state" "$dir/spool" "$dir/munge"
    # munge: a key of our own, a socket of our own.
    key="$dir/munge/munge.key"
    [ -f "$key" ] || { dd if=/dev/urandom of="$key" bs=1024 count=1 status=none; chmod 400 "$key"; }
    chmod 700 "$dir/munge"
    munged --force --key-file="$key" --socket="$dir/munge/socket" \
      --pid-file="$dir/munged.pid" --log-file="$dir/munge/munged.log" \
      --seed-file="$dir/munge/seed"
    # The node as slurmd sees it; two free ports for the daemons. A port is free when
    # it is asked for, not for sure when the daemon binds it (another test's daemon
    # may take it in between): a daemon that could not bind ends, and the start is
    # tried again with other ports.
    cpus=$(nproc)
    mem=$(( $(awk '/MemTotal/{print $2}' /proc/meminfo) / 1024 - 512 ))
    state=""
    for _ in 1 2 3 4 5; do
      read -r p1 p2 < <(python3 -c 'import socket
s=[socket.socket() for _ in range(2)]
[x.bind(("127.0.0.1",0)) for x in s]
print(*[x.getsockname()[1] for x in s])')
      sed -e "s|@DIR@|$dir|g" -e "s|@CPUS@|$cpus|g" -e "s|@MEM@|$mem|g" \
        -e "s|@CTLD_PORT@|$p1|g" -e "s|@SLURMD_PORT@|$p2|g" "$here/slurm.conf.in" >"$conf"
      # Slurm's munge plugin reaches munged through its default socket path unless
      # told otherwise: AuthInfo names ours.
      printf 'AuthInfo=socket=%s\n' "$dir/munge/socket" >>"$conf"
      : >"$dir/slurmctld.log"
      : >"$dir/slurmd.log"
      slurmctld -f "$conf"
      slurmd -f "$conf"
      # Until the node is idle, or a daemon has ended; how long registering takes
      # on a loaded machine is no condition (the limit is a safety net).
      t0=$SECONDS ended=""
      while [ $((SECONDS - t0)) -lt 180 ]; do
        state=$(sinfo -h -o %t 2>/dev/null || true)
        [ "$state" = "idle" ] && break
        for d in slurmctld slurmd; do
          pgrep -f "$d -f $conf" >/dev/null || ended+=" $d"
        done
        [ -z "$ended" ] || break
        sleep 0.2
      done
      [ "$state" = "idle" ] && break
      if [ -n "$ended" ] && grep -qi "address already in use" "$dir/slurmctld.log" "$dir/slurmd.log"; then
        echo "cluster.sh: a port was taken (ports $p1, $p2); trying others" >&2
        stop_slurm
        rm -rf "$dir/state" "$dir/spool"
        mkdir -p "$dir/state" "$dir/spool"
        continue
      fi
      break
    done
    if [ "$state" != "idle" ]; then
      echo "cluster.sh: the node did not come up (state '$state'${ended:+;$ended ended}); logs:" >&2
      tail -n 20 "$dir/slurmctld.log" "$dir/slurmd.log" >&2 || true
      exit 1
    fi
    echo "SLURM_CONF=$conf"
    ;;
  stop)
    stop
    ;;
  *)
    echo "usage: $0 start|stop DIR" >&2
    exit 2
    ;;
esac
