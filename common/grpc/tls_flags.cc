#include "common/grpc/tls_flags.h"

#include <string>

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, tls_ca, "",
          "CA certificate (PEM); with --tls-cert and --tls-key every "
          "connection uses mutual TLS (scripts/make-test-certs.sh makes a "
          "test set)");
ABSL_FLAG(std::string, tls_cert, "", "this process's certificate (PEM)");
ABSL_FLAG(std::string, tls_key, "", "this process's private key (PEM)");

namespace gradmesh {

TlsFiles TlsFilesFromFlags() {
  return {.ca = absl::GetFlag(FLAGS_tls_ca),
          .cert = absl::GetFlag(FLAGS_tls_cert),
          .key = absl::GetFlag(FLAGS_tls_key)};
}

}  // namespace gradmesh
