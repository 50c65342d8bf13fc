#!/usr/bin/env bash
# The "ssh" through which Open MPI's mpirun starts its daemons (orted) on the simulated
# hosts of sim_cluster.sh:
#   mpirun --mca plm_rsh_agent "tests/cluster/rsh_agent.sh DIR" ...
# Open MPI calls it as `AGENT [DIR] HOST COMMAND...`, as it would call `ssh HOST
# COMMAND...`: COMMAND is a shell command line (its words joined by spaces, as ssh
# does), run on HOST by /bin/sh in HOST's namespaces. The environment passes as it is
# (an ssh login would give the remote command a fresh one; Open MPI puts what the
# daemon needs on its command line anyway). DIR is the cluster's directory; without
# it, $NCF_CLUSTER_DIR.
#
# Like an ssh client, it stays on the calling host for as long as the remote command
# runs, and mpirun watches it:
#   - the remote command ends: its exit code, or, when a signal ended it (its host was
#     killed), "Connection to HOST closed by remote host." and 255, as ssh says;
#   - it is told to stop (mpirun ending the job): it hangs up the remote command (its
#     process group gets SIGTERM), unless HOST or this host is cut off (sim_cluster.sh
#     link down): then, as over a dead network, the hang-up never arrives and the
#     remote daemon must notice the loss by itself.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
dir=${NCF_CLUSTER_DIR:-}
if [ $# -ge 1 ] && [ -f "$1/cluster.env" ]; then dir="$1"; shift; fi
[ -n "$dir" ] || { echo "rsh_agent.sh: no cluster directory (give it first, or set NCF_CLUSTER_DIR)" >&2; exit 255; }
# ssh options Open MPI may put before the host (e.g. -x) mean nothing here.
while [ $# -gt 0 ] && [[ "$1" == -* ]]; do shift; done
[ $# -ge 2 ] || { echo "rsh_agent.sh: usage: rsh_agent.sh [DIR] HOST COMMAND..." >&2; exit 255; }
host="$1"
shift
self=$(hostname)

# shellcheck disable=SC2317  # run by the trap below
hang_up() {
  # $! too: the hang-up may come between the start and `child=$!`.
  local c=${child:-$!}
  if [ -n "$c" ] && [ ! -e "$dir/host/$host/link.down" ] && [ ! -e "$dir/host/$self/link.down" ]; then
    kill -TERM -- "-$c" 2>/dev/null || true
  fi
  exit 255
}
# Set before the remote command starts: a hang-up that came between its start and
# the trap ended this agent and left the command running.
trap hang_up TERM INT HUP

# Its own process group (setsid does not fork here: a background job of a shell
# without job control is no group leader), so that a hang-up reaches all of it.
setsid "$here/sim_cluster.sh" --dir "$dir" exec "$host" /bin/sh -c "$*" &
child=$!

rc=0
# (bash's own "Killed" report of the child is not ssh's to make)
{ wait "$child"; } 2>/dev/null || rc=$?
if [ "$rc" -gt 128 ]; then
  echo "Connection to $host closed by remote host." >&2
  exit 255
fi
exit "$rc"
