#!/usr/bin/env bash
# One job per checkpoint directory across hosts, on the shared directory:
#   1. job A (node1, 2 ranks, --checkpoint_every_steps) runs; its lock
#      ncf_dist.lock names node1 and its rank 0's pid;
#   2. job B on node2 (2 ranks), on the same --checkpoint_dir, is refused at start,
#      naming node1 and that pid, with a non-zero exit; it writes nothing, and A runs on;
#   3. node1 is killed (a crashed host: nothing releases the lock). node2 cannot
#      check a pid of node1, so the lock is taken over once its heartbeat is older
#      than the stale age (--checkpoint_lock_stale_seconds 10 here, against 300 by
#      default). The test waits until the lock's modification time (the heartbeat,
#      on the shared file system's clock) is surely older than that, then
#   4. job C on node2 (2 ranks, --resume auto) takes the directory over with a note
#      naming node1 and the pid, resumes from A's newest committed checkpoint, ends
#      the epoch it was in, and releases the lock.
# Nothing waits on a race: A's ranks write their output (with --step_log, more than a
# pipe holds) into a FIFO that hold_output.py reads only up to A's first checkpoint line,
# so A is stuck in a write from then on, its threads (the lock's heartbeat among them)
# running, and cannot end before node1 is killed; C starts only once the age has passed
# (its outcome is then decided).
#   bash tests/cluster/test_checkpoint_lock.sh BUILD_DIR   (exit 77: skipped, with the reason)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
build="$(cd "${1:?usage: $0 BUILD_DIR}" && pwd)"
# shellcheck source=tests/cluster/lib.sh
source "$here/lib.sh"
name=test_checkpoint_lock
why=$(cluster_check) || { echo "$name: skipped: $why"; exit 77; }

fail() {
  echo "$name: FAIL: $*" >&2
  for f in "$CLUSTER_SHARED"/*.out "$CLUSTER_SHARED"/*.err; do [ -f "$f" ] && { echo "---- $f" >&2; cat "$f" >&2; }; done
  cluster_logs >&2 || true
  exit 1
}

stale=10
cluster_start 2
cluster_small_data "$build" "$CLUSTER_SHARED/data"
ck="$CLUSTER_SHARED/ck"
lock="$ck/ncf_dist.lock"
# A runs long (100 epochs) and is killed; C ends the epoch A was in.
args=(--device cpu --data_dir "$CLUSTER_SHARED/data" --preset ncf-paper --batch_size 2560 --seed 3
      --threads 1 --progress off --checkpoint_dir "$ck" --checkpoint_lock_stale_seconds "$stale")
lock_field() {  # FIELD: from the lock file
  "$cluster_python3" -c 'import json, sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$lock" "$1"
}

# 1. A on node1, held by its output after its first checkpoint (a.out has what came
# before, a.err its standard error).
cluster_hold_output "$build/src/ncf_dist" "$CLUSTER_SHARED/ncf_dist_a" "$CLUSTER_SHARED/a" \
  '^ncf_dist: checkpoint /'
cluster_mpirun_on node1:2 -- "$CLUSTER_SHARED/ncf_dist_a" "${args[@]}" --train_epochs 100 \
  --checkpoint_every_steps 20 --step_log >"$CLUSTER_SHARED/a.launcher.out" 2>&1 &
apid=$!
while [ ! -e "$CLUSTER_SHARED/a.held" ]; do
  kill -0 "$apid" 2>/dev/null || fail "job A ended before its first checkpoint"
  sleep 0.1
done
[ -f "$lock" ] || fail "job A holds no lock in $ck"
[ "$(lock_field host)" = node1 ] || fail "the lock names host $(lock_field host), not node1"
holder=$(lock_field pid)
[ -n "$(cluster_procs node1 ncf_dist | grep -x "$holder")" ] ||
  fail "the lock's pid $holder is no ncf_dist of node1 ($(cluster_procs node1 ncf_dist | tr '\n' ' '))"

# 2. B on node2: refused, on every rank, before writing anything.
rc=0
cluster_mpirun_on node2:2 -- "$build/src/ncf_dist" "${args[@]}" --train_epochs 100 \
  --metrics_json "$CLUSTER_SHARED/b.jsonl" >"$CLUSTER_SHARED/b.out" 2>&1 || rc=$?
[ "$rc" -ne 0 ] || fail "job B on node2 was not refused"
[ "$rc" -ne 124 ] || fail "job B on node2 was left waiting"
grep -q "flag --checkpoint_dir $ck: another job holds this directory: ncf_dist pid $holder on host node1" \
  "$CLUSTER_SHARED/b.out" || fail "job B's refusal does not name node1 and pid $holder"
grep -q "it runs on another host and its heartbeat is" "$CLUSTER_SHARED/b.out" ||
  fail "job B's refusal does not say why the lock counts as held"
[ ! -e "$CLUSTER_SHARED/b.jsonl" ] || fail "job B wrote its metrics"
[ -z "$(cluster_procs node2 ncf_dist)" ] || fail "job B left ranks running on node2"
kill -0 "$apid" 2>/dev/null && [ -n "$(cluster_procs node1 ncf_dist)" ] ||
  fail "job A is not running (held by its output, it cannot have ended)"
[ "$(lock_field pid)" = "$holder" ] || fail "job B changed the lock"

# 3. node1 dies with A on it; the lock stays.
cluster_kill node1
wait "$apid" || true
[ -f "$lock" ] || fail "the lock went with node1 (nothing should have removed it)"
[ "$(lock_field host)" = node1 ] || fail "the lock changed after node1 died"
# The heartbeat's age on the shared directory's clock, whole seconds down: at
# stale + 2 it is surely past the age.
for _ in $(seq 600); do
  age=$(($(date +%s) - $(stat -c %Y "$lock")))
  [ "$age" -ge $((stale + 2)) ] && break
  sleep 0.2
done
[ "$age" -ge $((stale + 2)) ] || fail "the lock's heartbeat was still refreshed ${age} s ago after node1 died"

# 4. C on node2: takes it over and resumes. It ends the epoch A was in.
newest=$(find "$ck" -maxdepth 1 -name 'step-*' -type d | sort | tail -1)
[ -n "$newest" ] || fail "no committed checkpoint of A"
epochs=$("$cluster_python3" -c 'import json, sys; print(json.load(open(sys.argv[1]))["epoch"] + 1)' \
  "$newest/manifest.json")
cluster_mpirun_on node2:2 -- "$build/src/ncf_dist" "${args[@]}" --train_epochs "$epochs" \
  --allow_changed_flags train_epochs --resume auto >"$CLUSTER_SHARED/c.out" 2>&1 ||
  fail "job C on node2 failed"
grep -q "ncf_dist: note: flag --checkpoint_dir $ck: took over the lock of ncf_dist pid $holder on host node1" \
  "$CLUSTER_SHARED/c.out" || fail "job C did not take over node1's lock with a note"
grep -q "ncf_dist: resuming from $newest " "$CLUSTER_SHARED/c.out" ||
  fail "job C did not resume from $newest"
grep -qE "^ +$epochs " "$CLUSTER_SHARED/c.out" || fail "job C did not end epoch $epochs"
[ ! -e "$lock" ] || fail "job C did not release the lock"
echo "$name: ok: B on node2 refused naming node1 and pid $holder; after node1 died and" \
  "its heartbeat aged ${age} s (stale after $stale s), C on node2 took over and resumed from" \
  "${newest##*/} to the end of epoch $epochs"
