// What every gRPC-speaking part of gradmesh shares: status conversion and the
// transport security settings.
//
// TLS is mutual: with TlsFiles set, a server demands and verifies a client
// certificate signed by the CA, and a client verifies the server's. Without
// them everything runs in plaintext (tests, a trusted network).
//
//   GM_ASSIGN_OR_RETURN(auto creds, ServerCredentials(tls));
//   builder.AddListeningPort(address, creds);
#ifndef GRADMESH_COMMON_GRPC_GRPC_UTIL_H_
#define GRADMESH_COMMON_GRPC_GRPC_UTIL_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"

namespace gradmesh {

absl::Status ToAbsl(const grpc::Status& status);
grpc::Status ToGrpc(const absl::Status& status);

// PEM files of the mutual-TLS setup (scripts/make-test-certs.sh makes a test
// set). All three empty: plaintext.
struct TlsFiles {
  std::string ca;    // CA certificate that signs every member's certificate
  std::string cert;  // this process's certificate
  std::string key;   // its private key

  bool enabled() const { return !ca.empty() || !cert.empty() || !key.empty(); }
};

// InvalidArgument if only some files are given; NotFound/PermissionDenied if
// one can't be read.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(
    const TlsFiles& tls);
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentials(
    const TlsFiles& tls);

// "host:port" -> (host, port); port 0 when absent or not a number. Brackets
// around an IPv6 host are kept ("[::1]:7000" -> "[::1]").
std::pair<std::string, int> SplitHostPort(const std::string& address);

// Identity. A member's certificate names the host it advertises, as a DNS or
// IP subject alternative name: the name its peers dial, which their TLS
// handshake checks. Servers check the other direction with these: that a
// caller's certificate names the host of the member it speaks for.
//
// Whether the connection of `auth` is TLS (with mutual TLS: a certificate of
// the CA, whatever names it holds).
bool OverTls(const grpc::AuthContext& auth);
// Whether the caller came over a unix-domain socket (the SDK's: a local
// trainer, never a peer).
bool OverUnixSocket(const grpc::ServerContextBase& context);
// The subject alternative names of the certificate `auth` was authenticated
// with; empty on plaintext or for a certificate without any.
std::vector<std::string> CertificateNames(const grpc::AuthContext& auth);
// Whether `names` include the host of `address` ("host:port"; case is
// ignored, brackets around an IPv6 host too). A name "*.rest" stands for any
// one label before "rest" (RFC 6125: "*.svc.example" names "a.svc.example",
// not "svc.example" nor "a.b.svc.example"), as a certificate shared by a
// StatefulSet's pods has it; a wildcard names no IP address.
bool NamesHost(const std::vector<std::string>& names,
               const std::string& address);
// For handlers: OK when the caller's connection is not TLS (nothing to
// check), or its certificate names the host of one of `addresses`;
// PermissionDenied saying what it names and what `who` needed otherwise.
absl::Status CheckCaller(const grpc::ServerContextBase& context,
                         const std::vector<std::string>& addresses,
                         const std::string& who);

// Channel arguments used everywhere: unlimited receive size for the worker
// service's tensors, keepalive so that a silent peer is noticed, and a
// reconnect backoff of 1 s at most, so that a server back after a long
// outage is reached within about a second.
grpc::ChannelArguments DefaultChannelArguments();

// The servers' side of it: they accept those keepalive pings, with or
// without calls in flight (gRPC's default server policy closes a connection
// that pings more often than every 5 minutes without data, so an idle peer
// stream or SDK connection died after about 30 s), and ping their clients
// on the same period, so that the receiving end of a dead link notices too.
void ApplyServerKeepalive(grpc::ServerBuilder& builder);

}  // namespace gradmesh

// In a gRPC handler: returns the absl::Status `expr` as a grpc::Status if it
// is an error.
#define GM_RETURN_IF_ERROR_GRPC(expr)                                      \
  do {                                                                     \
    const ::absl::Status gm_grpc_status_ = (expr);                         \
    if (!gm_grpc_status_.ok()) return ::gradmesh::ToGrpc(gm_grpc_status_); \
  } while (0)

#endif  // GRADMESH_COMMON_GRPC_GRPC_UTIL_H_
