#!/usr/bin/env bash
# Makes the base image the Dockerfiles start from, docker.io/library/debian:12,
# on a machine that cannot pull it from a registry but reaches a Debian
# mirror: debootstrap (minbase) a bookworm tree from the mirror this machine's
# apt uses, then import it into the local container storage (podman's, which
# buildah shares). Does nothing when the image is already there.
#
#   scripts/make-base-image.sh [--force] [--image NAME] [--mirror URL]
#
# Needs root, debootstrap and podman (or buildah): apt-get install -y
# debootstrap podman buildah.
set -euo pipefail

image=docker.io/library/debian:12
suite=bookworm
mirror=""
force=0

usage() {
  cat <<EOF
usage: scripts/make-base-image.sh [--force] [--image NAME] [--mirror URL]

Creates the container image $image (Debian $suite, debootstrap
--variant=minbase) in the local container storage when it is missing, so that
'buildah bud --pull=never' finds the Dockerfiles' FROM debian:12 without a
registry. Idempotent: exits at once when the image exists.

  --force        rebuild and replace the image even if it exists
  --image NAME   the image name to create (default: $image)
  --mirror URL   the Debian mirror (default: the one apt is configured with,
                 from /etc/apt/sources.list and /etc/apt/sources.list.d/)
  -h, --help     this text
EOF
}

die() { echo "make-base-image: error: $*" >&2; exit 1; }
log() { echo "make-base-image: $*"; }

while (($#)); do
  case $1 in
    -h|--help) usage; exit 0 ;;
    --force) force=1 ;;
    --image) (($# > 1)) || die "--image needs a value"; image=$2; shift ;;
    --image=*) image=${1#*=} ;;
    --mirror) (($# > 1)) || die "--mirror needs a value"; mirror=$2; shift ;;
    --mirror=*) mirror=${1#*=} ;;
    *) usage >&2; die "unknown argument '$1'" ;;
  esac
  shift
done

# Which tool reads the local storage: podman, else buildah (same storage).
image_exists() {
  if command -v podman >/dev/null; then
    podman image exists "$1"
  elif command -v buildah >/dev/null; then
    buildah inspect --type image "$1" >/dev/null 2>&1
  else
    die "neither podman nor buildah is installed (apt-get install -y podman buildah)"
  fi
}

if ((!force)) && image_exists "$image"; then
  log "$image exists; nothing to do (--force rebuilds it)"
  exit 0
fi

[[ $(id -u) -eq 0 ]] || die "debootstrap needs root"
command -v debootstrap >/dev/null ||
  die "debootstrap is not installed (apt-get install -y debootstrap)"
command -v podman >/dev/null ||
  die "podman is not installed (apt-get install -y podman); 'podman import' makes the image"

# The URIs apt uses for a suite, from one-line (.list) and deb822 (.sources)
# files: prints "URI SUITE" for each "deb" entry.
apt_entries() {
  local f
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [[ -f $f ]] || continue
    # deb [options] URI SUITE COMPONENTS...
    sed -e 's/#.*//' -e 's/\[[^]]*\]//' "$f" |
      awk '$1 == "deb" && NF >= 3 { print $2, $3 }'
  done
  for f in /etc/apt/sources.list.d/*.sources; do
    [[ -f $f ]] || continue
    # Stanzas separated by blank lines; Types, URIs, Suites, Enabled fields.
    awk '
      function flush() {
        if (types ~ /(^| )deb( |$)/ && enabled !~ /^[Nn]o/)
          for (i = 1; i <= nu; i++) for (j = 1; j <= ns; j++) print u[i], s[j]
        types = ""; enabled = ""; nu = 0; ns = 0
      }
      /^[ \t]*#/ { next }
      /^[ \t]*$/ { flush(); next }
      {
        key = tolower($1); sub(/:$/, "", key); $1 = ""; sub(/^ +/, "")
        if (key == "types") types = $0
        else if (key == "enabled") enabled = $0
        else if (key == "uris") nu = split($0, u, " ")
        else if (key == "suites") ns = split($0, s, " ")
      }
      END { flush() }' "$f"
  done
}

entries=$(apt_entries | sort -u)
if [[ -z $mirror ]]; then
  mirror=$(awk -v s="$suite" '$2 == s { print $1; exit }' <<<"$entries")
  [[ -n $mirror ]] || die "no '$suite' entry in apt's sources" \
    "(/etc/apt/sources.list, /etc/apt/sources.list.d/); give --mirror URL"
fi
mirror=${mirror%/}
# The security archive, when apt has one: the image gets it too, like
# Debian's official image.
security=$(awk -v s="$suite-security" '$2 == s { print $1; exit }' <<<"$entries")
security=${security%/}
log "mirror $mirror${security:+, security $security}"

work=$(mktemp -d /var/tmp/make-base-image.XXXXXX)
cleanup() {
  # debootstrap may leave /proc or /sys mounted in the tree when it fails.
  local m
  awk -v w="$work" 'index($2, w) == 1 { print $2 }' /proc/mounts | sort -r |
    while read -r m; do umount -l "$m" 2>/dev/null || true; done
  rm -rf --one-file-system "$work"
}
trap cleanup EXIT
root=$work/rootfs

log "debootstrap --variant=minbase $suite $root $mirror (a few minutes)"
start=$SECONDS
if ! debootstrap --variant=minbase "$suite" "$root" "$mirror" \
    >"$work/debootstrap.log" 2>&1; then
  tail -n 30 "$work/debootstrap.log" >&2
  [[ -f $root/debootstrap/debootstrap.log ]] &&
    tail -n 30 "$root/debootstrap/debootstrap.log" >&2
  die "debootstrap failed"
fi
log "debootstrap took $((SECONDS - start)) s"

# As Debian's official image: deb822 sources (the release, its updates and
# security), no package caches or lists, apt told to keep none.
rm -f "$root/etc/apt/sources.list"
{
  printf 'Types: deb\nURIs: %s\nSuites: %s %s-updates\nComponents: main\n' \
    "$mirror" "$suite" "$suite"
  printf 'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n'
  if [[ -n $security ]]; then
    printf '\nTypes: deb\nURIs: %s\nSuites: %s-security\nComponents: main\n' \
      "$security" "$suite"
    printf 'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n'
  fi
} >"$root/etc/apt/sources.list.d/debian.sources"
cat >"$root/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
printf 'Acquire::GzipIndexes "true";\n' >"$root/etc/apt/apt.conf.d/docker-gzip-indexes"
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin \
  "$root"/var/cache/apt/archives/*.deb "$root"/var/log/*.log \
  "$root"/var/log/apt/* "$root"/tmp/* "$root"/debootstrap
mkdir -p "$root/var/lib/apt/lists/partial"
: >"$root/etc/resolv.conf"   # the container runtime provides one
echo "debian" >"$root/etc/hostname"

log "importing the tree as $image"
tar --numeric-owner --xattrs -C "$root" -c . |
  podman import --quiet --change 'CMD ["bash"]' \
    --message "debootstrap --variant=minbase $suite" - "$image" >/dev/null
image_exists "$image" || die "podman import did not create $image"
log "made $image ($(podman image inspect --format '{{.Size}}' "$image") bytes)"
