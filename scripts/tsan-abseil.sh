#!/usr/bin/env bash
# Builds Debian 12's own Abseil (the same release as libabsl-dev, from
# Debian's source archive) with ThreadSanitizer, into PREFIX, for the tests
# that run under TSan: Debian's Abseil is not instrumented, so TSan would
# take every absl::Mutex for a race.
#
#   scripts/tsan-abseil.sh PREFIX    (skips the build when PREFIX is there)
set -euo pipefail
if [[ $# -ne 1 || "$1" == -h || "$1" == --help ]]; then
  echo "usage: $0 PREFIX   (installs a TSan-instrumented Abseil there)" >&2
  exit 2
fi
prefix=$(realpath -m "$1")
if [[ -f "$prefix/lib/cmake/absl/abslConfig.cmake" ]]; then
  echo "tsan-abseil: $prefix is there already"
  exit 0
fi
work="$prefix.src"
rm -rf "$work"
mkdir -p "$work/lists/partial" "$work/parts"
# Debian's source archive, through a list of our own (the system's apt
# configuration is left alone).
mirror=$( (sed -n 's/^URIs: //p' /etc/apt/sources.list.d/*.sources;
           awk '$1 == "deb" { print $2 }' /etc/apt/sources.list) 2>/dev/null |
         grep -v security | head -1 || true)
if [[ -z "$mirror" ]]; then
  echo "tsan-abseil: no Debian mirror in the apt configuration" >&2
  exit 1
fi
cat > "$work/parts/src.sources" <<SRC
Types: deb-src
URIs: $mirror
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
apt_opts=(-o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$work/parts"
          -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache"
          -o APT::Sandbox::User=root)
mkdir -p "$work/cache/archives/partial"
apt-get "${apt_opts[@]}" update -qq
version=$(dpkg-query -W -f='${source:Version}' libabsl-dev)
(cd "$work" && apt-get "${apt_opts[@]}" source --download-only -qq \
    "abseil=$version")
# With Debian's patches, as libabsl-dev was built.
(cd "$work" && dpkg-source -x --no-check abseil_*.dsc src >/dev/null)
src="$work/src"
cmake -S "$src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_STANDARD=20 -DABSL_PROPAGATE_CXX_STD=ON \
    -DCMAKE_POSITION_INDEPENDENT_CODE=ON -DBUILD_TESTING=OFF \
    -DCMAKE_CXX_FLAGS="-fsanitize=thread -fno-omit-frame-pointer" \
    -DCMAKE_INSTALL_PREFIX="$prefix" >/dev/null
ninja -C "$work/build" install >/dev/null
rm -rf "$work"
echo "tsan-abseil: installed in $prefix"
