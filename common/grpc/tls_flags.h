// The mutual-TLS flags shared by every gradmesh binary: --tls_ca,
// --tls_cert and --tls_key (also from the environment, see cli.h).
#ifndef GRADMESH_COMMON_GRPC_TLS_FLAGS_H_
#define GRADMESH_COMMON_GRPC_TLS_FLAGS_H_

#include "common/grpc/grpc_util.h"

namespace gradmesh {

// The files the flags name (all empty: plaintext).
TlsFiles TlsFilesFromFlags();

}  // namespace gradmesh

#endif  // GRADMESH_COMMON_GRPC_TLS_FLAGS_H_
