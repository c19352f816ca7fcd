#!/usr/bin/env bash
# Makes a test certificate authority and certificates signed by it, for
# gradmesh's mutual TLS. Each certificate is valid for both server and client
# authentication.
#
#   scripts/make-test-certs.sh DIR [HOST...]
#     DIR/ca.pem                   the CA
#     DIR/node.pem, DIR/node.key   names 127.0.0.1 and localhost: every
#                                  process of a test cluster on this machine
#                                  can use it
#     DIR/HOST.pem, DIR/HOST.key   for each HOST: names that host only (an IP
#                                  address or a DNS name), as a worker that
#                                  advertises HOST needs (docs/reliability.md)
#     DIR/NAME.pem, DIR/NAME.key   for each NAME=HOST,HOST...: names every one
#                                  of those hosts (a DNS name may be a
#                                  wildcard, "*.svc.example")
#
# Valid for $GRADMESH_CERT_DAYS days (default 30). Not for production: the
# keys are unencrypted.
set -euo pipefail
if [[ $# -lt 1 || "$1" == -h || "$1" == --help ]]; then
  echo "usage: $0 DIR [HOST | NAME=HOST,HOST...]...   (writes DIR/ca.pem," \
       "DIR/node.{pem,key}, and DIR/HOST.{pem,key} or DIR/NAME.{pem,key})" >&2
  exit 2
fi
dir=$1
shift
days=${GRADMESH_CERT_DAYS:-30}  # how long the certificates are valid
mkdir -p "$dir"
cd "$dir"
openssl req -x509 -newkey rsa:2048 -nodes -days "$days" -subj "/CN=gradmesh test CA" \
  -keyout ca.key -out ca.pem 2>/dev/null

# sign NAME SUBJECT_ALT_NAMES: NAME.pem and NAME.key.
sign() {
  openssl req -newkey rsa:2048 -nodes -subj "/CN=$1" \
    -keyout "$1.key" -out "$1.csr" 2>/dev/null
  cat > "$1.ext" <<EXT
basicConstraints = CA:FALSE
keyUsage = digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth, clientAuth
subjectAltName = $2
EXT
  openssl x509 -req -in "$1.csr" -CA ca.pem -CAkey ca.key -CAcreateserial \
    -days "$days" -extfile "$1.ext" -out "$1.pem" 2>/dev/null
  rm -f "$1.csr" "$1.ext"
}

# alt_name HOST: the subject alternative name of an IP address or DNS name.
alt_name() {
  if [[ "$1" =~ ^[0-9.]+$ || "$1" == *:* ]]; then echo "IP:$1"; else echo "DNS:$1"; fi
}

sign node "IP:127.0.0.1, DNS:localhost"
for arg in "$@"; do
  if [[ "$arg" == *=* ]]; then
    names=()
    IFS=, read -ra hosts <<< "${arg#*=}"
    for host in "${hosts[@]}"; do names+=("$(alt_name "$host")"); done
    sign "${arg%%=*}" "$(IFS=,; echo "${names[*]}")"
  else
    sign "$arg" "$(alt_name "$arg")"
  fi
done
rm -f ca.srl
echo "make-test-certs: wrote ca.pem, node.pem, node.key${*:+ and certificates for $*} in $dir"
