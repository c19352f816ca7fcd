#!/usr/bin/env bash
# The house's rules that a reader should not have to check by hand
# (docs/design.md): no function over 60 lines in the product's code, the
# daemon meets the algorithms only through the engine, and the data plane's
# main file stays small.
set -euo pipefail
cd "$(dirname "$0")/../.."
fail=0

# Functions longer than 60 lines (Universal Ctags' end lines), tests and
# generated code aside.
tags=$(ctags -R --languages=C++ --langmap=C++:+.cu --kinds-C++=f \
           --fields=+ne -f - worker server client tools common)
if ! grep -q $'\tend:' <<<"$tags"; then
  echo "FAIL: ctags gave no end lines (Universal Ctags is needed)"
  exit 1
fi
long=$(awk -F'\t' '{ln = ""; en = "";
                    for (i = 4; i <= NF; i++) {
                      if ($i ~ /^line:/) ln = substr($i, 6);
                      if ($i ~ /^end:/) en = substr($i, 5) }
                    if (ln != "" && en != "" && en - ln + 1 > 60)
                      print "  " $2 ":" ln " " $1 " (" en - ln + 1 " lines)"}' \
           <<<"$tags")
if [[ -n "$long" ]]; then
  echo "FAIL: functions over 60 lines:"
  echo "$long"
  fail=1
fi

# worker/daemon includes nothing of worker/collectives: it goes through
# worker/engine.
if grep -rn '#include "worker/collectives/' worker/daemon; then
  echo "FAIL: worker/daemon includes worker/collectives (use worker/engine)"
  fail=1
fi

lines=$(wc -l < worker/daemon/data_plane.cc)
if ((lines > 500)); then
  echo "FAIL: worker/daemon/data_plane.cc has $lines lines (at most 500)"
  fail=1
fi

if ((fail)); then exit 1; fi
echo "house_test: 3 passed, 0 failed"
