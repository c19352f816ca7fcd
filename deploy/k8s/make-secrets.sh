#!/usr/bin/env bash
# Prints the two Secrets the manifests mount, for namespace NAMESPACE:
#   gradmesh-tls        ca.crt, tls.crt, tls.key: one certificate naming every
#                       worker (*.gradmesh-worker.NAMESPACE.svc.cluster.local)
#                       and the coordinator, from a new CA;
#   gradmesh-sdk-token  token: what SDK clients over TCP must give.
#
#   deploy/k8s/make-secrets.sh gradmesh | kubectl apply -f -
#
# The certificate is shared by all workers, so mutual TLS keeps strangers out
# but a worker could speak for another (deploy/README.md#tls). For per-pod
# identity, issue each pod its own certificate (e.g. cert-manager's CSI
# driver) under the same Secret keys. Not for production as it is: the CA
# key is thrown away and the keys are unencrypted.
set -euo pipefail
if [[ $# -ne 1 || "$1" == -h || "$1" == --help ]]; then
  echo "usage: $0 NAMESPACE   (prints Secret manifests on stdout)" >&2
  exit 2
fi
namespace=$1
here=$(cd "$(dirname "$0")" && pwd)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
suffix="$namespace.svc.cluster.local"
bash "$here/../../scripts/make-test-certs.sh" "$dir" \
  "cluster=*.gradmesh-worker.$suffix,gradmesh-coordinator.$suffix" >&2
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$dir/token"
kubectl create secret generic gradmesh-tls --namespace "$namespace" \
  --from-file=ca.crt="$dir/ca.pem" --from-file=tls.crt="$dir/cluster.pem" \
  --from-file=tls.key="$dir/cluster.key" --dry-run=client -o yaml
echo "---"
kubectl create secret generic gradmesh-sdk-token --namespace "$namespace" \
  --from-file=token="$dir/token" --dry-run=client -o yaml
