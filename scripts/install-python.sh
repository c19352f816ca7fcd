#!/usr/bin/env bash
# Installs the gradmesh Python package (built by scripts/build.sh into
# BUILD_DIR/client/python/gradmesh) for Debian's python3, so that
# `import gradmesh` works in any directory: as root into
# /usr/local/lib/python3.X/dist-packages, otherwise into the user's site.
#   scripts/install-python.sh [BUILD_DIR]   (default: build-release)
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${1:-build-release}
python=/usr/bin/python3
package="$build_dir/client/python/gradmesh"
if ! compgen -G "$package/_gradmesh*.so" >/dev/null; then
  echo "install-python: no built extension in $package; build the" \
       "gradmesh_python target first" >&2
  exit 1
fi
if [[ $(id -u) -eq 0 ]]; then
  site=$("$python" -c 'import site; print(site.getsitepackages()[0])')
else
  site=$("$python" -m site --user-site)
fi
mkdir -p "$site"
rm -rf "$site/gradmesh"
cp -r "$package" "$site/gradmesh"
echo "install-python: gradmesh installed in $site"
