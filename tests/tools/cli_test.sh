#!/usr/bin/env bash
# The `gradmesh` command as a user meets it: help, a clear one-line error and
# a non-zero exit for bad input, and a run that writes its outputs.
set -euo pipefail
gradmesh=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

help=$("$gradmesh" --help) || fail "--help exited non-zero"
grep -q "replay" <<<"$help" || fail "--help does not list replay"
help=$("$gradmesh" replay --help 2>&1 || true)  # absl's --help exits 1
grep -q -- "--density" <<<"$help" || fail "replay --help lacks --density"

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
echo "cli_test: all checks passed"
