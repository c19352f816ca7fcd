#!/usr/bin/env bash
# Makes a test certificate authority and one certificate signed by it, for
# gradmesh's mutual TLS on 127.0.0.1 / localhost. Every process of a test
# cluster (coordinator, workers, clients) can use the same certificate: it is
# valid for both server and client authentication.
#
#   scripts/make-test-certs.sh DIR     -> DIR/ca.pem DIR/node.pem DIR/node.key
#
# Not for production: the keys are unencrypted and the names are loopback.
set -euo pipefail
if [[ $# -ne 1 || "$1" == -h || "$1" == --help ]]; then
  echo "usage: $0 DIR   (writes DIR/ca.pem, DIR/node.pem, DIR/node.key)" >&2
  exit 2
fi
dir=$1
mkdir -p "$dir"
cd "$dir"
openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj "/CN=gradmesh test CA" \
  -keyout ca.key -out ca.pem 2>/dev/null
openssl req -newkey rsa:2048 -nodes -subj "/CN=gradmesh node" \
  -keyout node.key -out node.csr 2>/dev/null
cat > node.ext <<'EXT'
basicConstraints = CA:FALSE
keyUsage = digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth, clientAuth
subjectAltName = IP:127.0.0.1, DNS:localhost
EXT
openssl x509 -req -in node.csr -CA ca.pem -CAkey ca.key -CAcreateserial \
  -days 30 -extfile node.ext -out node.pem 2>/dev/null
rm -f node.csr node.ext ca.srl
echo "make-test-certs: wrote $dir/ca.pem, $dir/node.pem, $dir/node.key"
