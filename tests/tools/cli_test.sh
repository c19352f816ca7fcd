#!/usr/bin/env bash
# The `gradmesh` command as a user meets it: help, a clear one-line error and
# a non-zero exit for bad input, and a run that writes its outputs.
set -euo pipefail
gradmesh=$1
coordinator=${2:-}
worker=${3:-}
example=${4:-}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

help=$("$gradmesh" --help) || fail "--help exited non-zero"
grep -q "replay" <<<"$help" || fail "--help does not list replay"
# A command's --help: its flags alone, with dashes, no source paths, exit 0.
help=$("$gradmesh" replay --help) || fail "replay --help exited non-zero"
grep -q -- "--density=0.01" <<<"$help" || fail "replay --help lacks --density"
grep -q -- "--input-dir" <<<"$help" || fail "replay --help lacks --input-dir"
grep -q -- "--netns\|--autotune-window" <<<"$help" &&
    fail "replay --help lists local's flags"
grep -q -- "--[a-z]*_" <<<"$help" && fail "replay --help spells a flag with _"
grep -qi "flags from\|\.cc" <<<"$help" && fail "replay --help names sources"
help=$("$gradmesh" run -h) || fail "run -h exited non-zero"
grep -q -- "--job=" <<<"$help" || fail "run -h lacks --job"
grep -q -- "--input-dir" <<<"$help" && fail "run -h lists replay's flags"

expect_error() {  # expect_error PATTERN ARGS...
  local pattern=$1; shift
  local err rc=0
  err=$("$gradmesh" replay --output-dir="$work/out" "$@" 2>&1 >/dev/null) || rc=$?
  [[ $rc -ne 0 ]] || fail "$* exited 0"
  [[ $(wc -l <<<"$err") -eq 1 ]] || fail "$*: more than one line: $err"
  grep -q -- "$pattern" <<<"$err" || fail "$*: '$err' lacks '$pattern'"
  [[ ! -e "$work/out" ]] || fail "$*: left an output directory"
}
expect_error "density" --density=0
expect_error "density" --density=1.5
expect_error "teams d = 4" --workers=6 --teams=4
expect_error "no such file" --input-dir="$work/missing" --workers=2
expect_error "unknown algorithm" --algo=nope
expect_error "is not auto, cpu or cuda" --topk=tpu
expect_error "need a tagged encoding" --values=fp16
expect_error "is not coo, auto" --encoding=zip

"$gradmesh" replay --workers=6 --teams=3 --n=5000 --iterations=2 \
    --output-dir="$work/out" >"$work/log"
grep -q "iteration 2/2" "$work/log" || fail "no progress lines"
for r in 0 1 2 3 4 5; do
  [[ -s "$work/out/rank$r.result.npy" && -s "$work/out/rank$r.residual.npy" ]] ||
      fail "rank $r outputs missing"
done
grep -q '"bsag_h"' "$work/out/stats.json" || fail "stats.json lacks bsag_h"
"$gradmesh" replay --workers=4 --n=5000 --iterations=2 --encoding=auto \
    --values=bf16 --output-dir="$work/out" --overwrite >/dev/null
grep -q '"coo_bytes_received"' "$work/out/stats.json" ||
    fail "stats.json lacks the bytes without encoding"

# gradmesh sim: text, JSON, every d, and one-line errors with exit 2.
grep -q "sim " <<<"$help" || fail "--help does not list sim"
out=$("$gradmesh" sim --workers=6 --teams=3 --n=6000 --iterations=2) ||
    fail "sim exited $?"
grep -q "time per all-reduce" <<<"$out" || fail "sim: no time: $out"
grep -q "Table I: " <<<"$out" || fail "sim: no Table I: $out"
"$gradmesh" sim --workers=4 --n=4000 --json | python3 -c '
import json, sys
d = json.load(sys.stdin)
assert d["workers"] == 4 and d["rounds"] == 4 and d["seconds"] > 0, d
' || fail "sim --json is not the case as JSON"
out=$("$gradmesh" sim --workers=8 --teams=all --n=8000 --iterations=1 \
    --json="$work/teams.json" 2>/dev/null) || fail "sim --teams=all exited $?"
grep -q "the coordinator's model picks d=" <<<"$out" ||
    fail "sim --teams=all: no model pick: $out"
python3 -c 'import json, sys; d = json.load(open(sys.argv[1]));
assert [c["teams"] for c in d["cases"]] == [1, 2, 4, 8], d' \
    "$work/teams.json" || fail "sim --teams=all JSON lacks the cases"
expect_sim_error() {  # expect_sim_error PATTERN ARGS...
  local pattern=$1; shift
  local err rc=0
  err=$("$gradmesh" sim "$@" 2>&1 >/dev/null) || rc=$?
  [[ $rc -eq 2 ]] || fail "sim $* exited $rc"
  [[ $(wc -l <<<"$err") -eq 1 ]] || fail "sim $*: more than one line: $err"
  grep -q -- "$pattern" <<<"$err" || fail "sim $*: '$err' lacks '$pattern'"
}
expect_sim_error "teams d = 4" --workers=6 --teams=4
expect_sim_error "is outside 1..4096" --workers=5000
expect_sim_error "needs --algo=spardl" --algo=topka --teams=all
expect_sim_error "--gbit must be positive" --gbit=0
expect_sim_error "not a number or all" --teams=x
expect_sim_error "is outside 1..4096" --workers=0 --teams=all
expect_sim_error "--skip-factor must be at least 1" --teams=all --skip-factor=0.5
expect_sim_error "--compute-scale must be positive" --compute-scale=inf
expect_sim_error "--iterations=1001 is outside" --iterations=5000

# gradmesh local: a coordinator and worker processes on 127.0.0.1.
grep -q "local" <<<"$help" || fail "--help does not list local"
expect_local_error() {  # expect_local_error PATTERN ARGS...
  local pattern=$1; shift
  local err rc=0
  err=$("$gradmesh" local "$@" 2>&1 >/dev/null) || rc=$?
  [[ $rc -ne 0 ]] || fail "local $* exited 0"
  grep -q -- "$pattern" <<<"$err" || fail "local $*: '$err' lacks '$pattern'"
}
expect_local_error "1..64 workers" --workers=0
expect_local_error "not auto or a positive number" --teams=x
expect_local_error "unknown algorithm" --algo=nope --work-dir="$work/bad"
expect_local_error "is not in --bin-dir" --bin-dir="$work"
expect_local_error "is not auto, cpu or cuda" --topk=tpu
"$gradmesh" local --workers=3 --n=3000 --iterations=4 --teams=3 \
    --work-dir="$work/local" >"$work/local.out"
grep -q "iter   3 .* spardl d=3 .* checked" "$work/local.out" ||
    fail "local: no checked iteration 3: $(cat "$work/local.out")"
grep -q "cluster stopped$" "$work/local.out" || fail "local: no clean stop"
grep -q "epoch=.* rank=" "$work/local/worker-00.log" ||
    fail "worker logs lack epoch and rank"
# Every plan field reaches the workers: TopkDSA's dense phase quantized to
# 4 bits (set on the coordinator by local) changes the checked results.
digests() {  # digests JSON: every worker's result digests, in order
  python3 -c 'import json, sys
print(" ".join(w["result_digest"] for it in json.load(open(sys.argv[1]))["iterations"]
               for w in it["workers"]))' "$1"
}
for bits in 0 4; do
  "$gradmesh" local --workers=2 --n=3000 --iterations=2 --algo=topkdsa \
      --density=0.4 --quantize-bits=$bits --json="$work/q$bits.json" \
      --work-dir="$work/q$bits" >"$work/q$bits.out" 2>&1 ||
      fail "local --quantize-bits=$bits: $(tail -3 "$work/q$bits.out")"
done
[[ -n "$(digests "$work/q0.json")" ]] || fail "local --json: no digests"
[[ "$(digests "$work/q0.json")" != "$(digests "$work/q4.json")" ]] ||
    fail "--quantize-bits=4 did not reach the workers"
# Ctrl-C stops after the iteration in flight and still shuts down cleanly.
"$gradmesh" local --workers=2 --n=3000 --iterations=100000 \
    --work-dir="$work/interrupted" >"$work/int.out" 2>&1 &
pid=$!
for _ in $(seq 100); do grep -q "^iter" "$work/int.out" && break; sleep 0.1; done
kill -INT $pid
rc=0; wait $pid || rc=$?
[[ $rc -eq 130 ]] || fail "local after SIGINT exited $rc: $(tail -3 "$work/int.out")"
grep -q "interrupted after" "$work/int.out" || fail "local: no interrupt note"
grep -q "cluster stopped$" "$work/int.out" || fail "local: not stopped cleanly"
pgrep -f "$work/interrupted" >/dev/null && fail "local left processes behind"
# kill -9 of a worker mid-run: its trainer stops, the survivors run the step
# again on the new view and go on; every iteration succeeds.
"$gradmesh" local --workers=3 --n=3000 --iterations=400 --teams=1 \
    --work-dir="$work/killed" >"$work/killed.out" 2>&1 &
pid=$!
for _ in $(seq 300); do grep -q "^iter  20" "$work/killed.out" && break; sleep 0.1; done
grep -q "^iter  20" "$work/killed.out" || fail "local: no iteration 20 in 30 s"
pkill -9 -f "$work/killed/worker-01.sock" || fail "no worker 1 to kill"
rc=0; wait $pid || rc=$?
[[ $rc -eq 0 ]] || fail "local with a worker killed exited $rc: $(tail -5 "$work/killed.out")"
grep -q "worker 1 is gone; its trainer stops, 2 go on" "$work/killed.out" ||
    fail "local: no note of the lost worker: $(tail -5 "$work/killed.out")"
grep -q "iter 399 .* checked" "$work/killed.out" ||
    fail "local: no checked last iteration: $(tail -5 "$work/killed.out")"
grep -q "FAILED" "$work/killed.out" && fail "local: iterations failed"

# The daemons: --help, and configuration from the environment (Kubernetes
# passes it that way); a flag on the command line wins over it.
if [[ -n "$coordinator" && -n "$worker" ]]; then
  help=$("$coordinator" --help) || fail "coordinator --help exited non-zero"
  grep -q -- "--heartbeat-timeout-ms" <<<"$help" ||
      fail "coordinator --help lacks its flags"
  grep -q "GRADMESH_COORDINATOR_SOME_FLAG" <<<"$help" ||
      fail "coordinator --help does not name its environment"
  help=$("$worker" --help) || fail "worker --help exited non-zero"
  grep -q -- "--operation-timeout-s" <<<"$help" || fail "worker --help lacks its flags"
  grep -q -- "--tls-ca" <<<"$help" || fail "worker --help lacks --tls-ca"
  grep -qi "flags from\|\.cc" <<<"$help" && fail "worker --help names sources"
  # --topk: a bad name is a usage error; cuda without a device (or in a
  # build without CUDA) says so and exits before serving.
  rc=0; err=$("$worker" --topk=tpu 2>&1) || rc=$?
  [[ $rc -eq 2 ]] || fail "worker --topk=tpu exited $rc"
  grep -q "is not auto, cpu or cuda" <<<"$err" || fail "worker --topk=tpu: $err"
  if ! ls /dev/nvidia[0-9]* >/dev/null 2>&1; then  # no NVIDIA device here
    rc=0; err=$(timeout 10 "$worker" --topk=cuda 2>&1) || rc=$?
    [[ $rc -eq 1 ]] || fail "worker --topk=cuda without a device exited $rc"
    grep -q "^gradmesh-worker: --topk=cuda: .*\(no CUDA\|has no CUDA\)" <<<"$err" ||
        fail "worker --topk=cuda without a device: $err"
    rc=0; timeout 60 "$gradmesh" local --workers=2 --topk=cuda \
        --work-dir="$work/cuda" >"$work/cuda.out" 2>&1 || rc=$?
    [[ $rc -ne 0 ]] || fail "local --topk=cuda without a device exited 0"
    grep -q -- "--topk=cuda" "$work/cuda.out" ||
        fail "local --topk=cuda without a device: $(tail -3 "$work/cuda.out")"
  fi
  rc=0; err=$(GRADMESH_COORDINATOR_ALGO=nope "$coordinator" --listen=127.0.0.1:0 2>&1) || rc=$?
  [[ $rc -ne 0 ]] && grep -q "unknown algorithm 'nope'" <<<"$err" ||
      fail "coordinator ignored GRADMESH_COORDINATOR_ALGO: $err"
  rc=0; err=$(GRADMESH_COORDINATOR_DENSITY=x "$coordinator" 2>&1) || rc=$?
  [[ $rc -eq 2 ]] && grep -q "GRADMESH_COORDINATOR_DENSITY='x'" <<<"$err" ||
      fail "a bad environment value: rc $rc, $err"
  GRADMESH_COORDINATOR_ALGO=nope "$coordinator" --algo=dense --listen=127.0.0.1:0 \
      --port-file="$work/c.port" 2>"$work/c.log" &
  pid=$!
  for _ in $(seq 100); do [[ -s "$work/c.port" ]] && break; sleep 0.1; done
  [[ -s "$work/c.port" ]] || fail "--algo did not win over the environment: $(cat "$work/c.log")"
  kill -TERM $pid; wait $pid || fail "coordinator did not stop cleanly on SIGTERM"
fi
# gradmesh run: the user's own program on a local cluster, found by the SDK
# through the environment; each output line carries its rank.
if [[ -n "$example" ]]; then
  help=$("$gradmesh" --help) || true
  grep -q "run" <<<"$help" || fail "--help does not list run"
  "$gradmesh" run --workers=3 --work-dir="$work/run" -- "$example" --steps=4 \
      >"$work/run.out" 2>"$work/run.err" ||
      fail "run exited $?: $(tail -5 "$work/run.err")"
  for r in 0 1 2; do
    grep -q "^\[$r\] rank $r: parameters identical to rank 0's" "$work/run.out" ||
        fail "run: rank $r did not finish: $(cat "$work/run.out")"
  done
  grep -q "^\[1\] step 3: " "$work/run.out" || fail "run: no prefixed steps"
  # The first failure's exit code; the other commands are stopped.
  rc=0
  "$gradmesh" run --workers=2 --work-dir="$work/run2" -- sh -c \
      'if [ "$GRADMESH_RANK" = 1 ]; then exit 3; fi; sleep 60' \
      >/dev/null 2>"$work/run2.err" || rc=$?
  [[ $rc -eq 3 ]] || fail "run: a failing command gave $rc: $(cat "$work/run2.err")"
  rc=0; "$gradmesh" run --workers=2 >/dev/null 2>&1 || rc=$?
  [[ $rc -eq 2 ]] || fail "run without a command exited $rc"
  # --nnodes as torchrun's: N or MIN:MAX; a wrong one is named, nothing runs.
  for bad in "3:2" "0:2" "2:" ":2" "1:2:3" "x"; do
    rc=0; err=$("$gradmesh" run --nnodes="$bad" --coordinator=127.0.0.1:7 \
        -- true 2>&1) || rc=$?
    [[ $rc -eq 2 ]] && grep -q "is not N or MIN:MAX" <<<"$err" ||
        fail "run --nnodes=$bad: exit $rc, '$err'"
  done
  rc=0; err=$("$gradmesh" run --nnodes=1:3 --min-nodes=2 \
      --coordinator=127.0.0.1:7 -- true 2>&1) || rc=$?
  [[ $rc -eq 2 ]] && grep -q "disagree" <<<"$err" ||
      fail "run --nnodes=1:3 --min-nodes=2: exit $rc, '$err'"
  # SIGTERM while node 0 waits for the other nodes: 130, saying so.
  "$gradmesh" run --nnodes=2 --node-rank=0 --coordinator=127.0.0.1:17950 \
      --work-dir="$work/wait" -- true >/dev/null 2>"$work/wait.err" &
  pid=$!
  for _ in $(seq 300); do
    grep -q "more nodes" "$work/wait.err" && break
    sleep 0.1
  done
  kill -TERM "$pid"
  rc=0; wait "$pid" || rc=$?
  [[ $rc -eq 130 ]] &&
      grep -q "interrupted while the nodes joined" "$work/wait.err" ||
      fail "run stopped while waiting for nodes: exit $rc: $(cat "$work/wait.err")"
fi
echo "cli_test: all checks passed"
