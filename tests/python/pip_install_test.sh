#!/usr/bin/env bash
# `pip install ./client/python` into a virtual environment, as its README
# line says, with nothing fetched: the package imports from the
# environment's site-packages and trains through `gradmesh run`.
#   pip_install_test.sh GRADMESH_BINARY BUILD_DIR SOURCE_DIR
set -euo pipefail
gradmesh=$1 build_dir=$2 source_dir=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
/usr/bin/python3 -m venv --system-site-packages "$work/venv"
(cd "$work" && GRADMESH_BUILD_DIR=$build_dir "$work/venv/bin/pip" install \
    -q --no-build-isolation --no-index "$source_dir/client/python")
cd "$work"  # not the source tree: the installed package must be found
"$gradmesh" run --workers=2 --algo=dense -- "$work/venv/bin/python" -c '
import gradmesh, gradmesh.torch, torch, sys
assert gradmesh.__file__.startswith(sys.prefix), gradmesh.__file__
gradmesh.init(timeout=60)
total = gradmesh.allreduce(torch.ones(3), name="x", op=gradmesh.Sum)
assert total.tolist() == [2.0] * 3, total
print("installed in", sys.prefix, "and summed", total.tolist())
'
echo "pip_install_test: ok"
