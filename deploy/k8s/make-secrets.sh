#!/usr/bin/env bash
# Prints the Secret the manifests mount, for namespace NAMESPACE:
#   gradmesh-tls  ca.crt, tls.crt, tls.key: one certificate naming every
#                 worker (*.gradmesh-worker.NAMESPACE.svc.cluster.local) and
#                 the coordinator, from a new CA, valid for DAYS days
#                 ($GRADMESH_CERT_DAYS, default 365): make it again before.
#
#   deploy/k8s/make-secrets.sh gradmesh | kubectl apply -f -
#
# The certificate is shared by all workers, so mutual TLS keeps strangers out
# but a worker could speak for another (deploy/README.md#tls). For per-pod
# identity, issue each pod its own certificate (e.g. cert-manager's CSI
# driver) under the same Secret keys. The CA key is thrown away: a new
# certificate means a new CA for every process (apply, then restart all).
set -euo pipefail
if [[ $# -ne 1 || "$1" == -h || "$1" == --help ]]; then
  echo "usage: $0 NAMESPACE   (prints the TLS Secret on stdout)" >&2
  exit 2
fi
namespace=$1
here=$(cd "$(dirname "$0")" && pwd)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
suffix="$namespace.svc.cluster.local"
GRADMESH_CERT_DAYS=${GRADMESH_CERT_DAYS:-365} \
  bash "$here/../../scripts/make-test-certs.sh" "$dir" \
  "cluster=*.gradmesh-worker.$suffix,gradmesh-coordinator.$suffix" >&2
kubectl create secret generic gradmesh-tls --namespace "$namespace" \
  --from-file=ca.crt="$dir/ca.pem" --from-file=tls.crt="$dir/cluster.pem" \
  --from-file=tls.key="$dir/cluster.key" --dry-run=client -o yaml
