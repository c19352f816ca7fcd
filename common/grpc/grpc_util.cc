#include "common/grpc/grpc_util.h"

#include <arpa/inet.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace gradmesh {

absl::Status ToAbsl(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      status.error_message());
}

grpc::Status ToGrpc(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

namespace {

absl::StatusOr<std::string> ReadPem(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("cannot read the TLS ", what, " file '", path, "'"));
  }
  std::ostringstream contents;
  contents << in.rdbuf();
  if (contents.str().find("-----BEGIN") == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("the TLS ", what, " file '", path, "' is not PEM"));
  }
  return contents.str();
}

struct Pems {
  std::string ca, cert, key;
};

absl::StatusOr<Pems> ReadAll(const TlsFiles& tls) {
  if (tls.ca.empty() || tls.cert.empty() || tls.key.empty()) {
    return absl::InvalidArgumentError(
        "TLS needs all three of the CA, certificate and key files");
  }
  Pems pems;
  GM_ASSIGN_OR_RETURN(pems.ca, ReadPem(tls.ca, "CA"));
  GM_ASSIGN_OR_RETURN(pems.cert, ReadPem(tls.cert, "certificate"));
  GM_ASSIGN_OR_RETURN(pems.key, ReadPem(tls.key, "key"));
  return pems;
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(
    const TlsFiles& tls) {
  if (!tls.enabled()) return grpc::InsecureServerCredentials();
  GM_ASSIGN_OR_RETURN(Pems pems, ReadAll(tls));
  grpc::SslServerCredentialsOptions options(
      GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  options.pem_root_certs = pems.ca;
  options.pem_key_cert_pairs.push_back({pems.key, pems.cert});
  return grpc::SslServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentials(
    const TlsFiles& tls) {
  if (!tls.enabled()) return grpc::InsecureChannelCredentials();
  GM_ASSIGN_OR_RETURN(Pems pems, ReadAll(tls));
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = pems.ca;
  options.pem_private_key = pems.key;
  options.pem_cert_chain = pems.cert;
  return grpc::SslCredentials(options);
}

std::pair<std::string, int> SplitHostPort(const std::string& address) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || address.back() == ']' ||
      !absl::SimpleAtoi(address.substr(colon + 1), &port)) {
    return {address, 0};
  }
  return {address.substr(0, colon), port};
}

bool OverUnixSocket(const grpc::ServerContextBase& context) {
  // "unix:PATH", or "unix-abstract:NAME" for a socket in the abstract
  // namespace.
  return absl::StartsWith(context.peer(), "unix:") ||
         absl::StartsWith(context.peer(), "unix-abstract:");
}

bool OverTls(const grpc::AuthContext& auth) {
  const std::vector<grpc::string_ref> type =
      auth.FindPropertyValues(GRPC_TRANSPORT_SECURITY_TYPE_PROPERTY_NAME);
  return !type.empty() && type.front() == GRPC_SSL_TRANSPORT_SECURITY_TYPE;
}

std::vector<std::string> CertificateNames(const grpc::AuthContext& auth) {
  std::vector<std::string> names;
  if (!OverTls(auth)) return names;
  for (const grpc::string_ref& name :
       auth.FindPropertyValues(GRPC_X509_SAN_PROPERTY_NAME)) {
    names.emplace_back(name.data(), name.size());
  }
  return names;
}

namespace {

bool IsIpAddress(const std::string& host) {
  in6_addr address;
  return inet_pton(AF_INET, host.c_str(), &address) == 1 ||
         inet_pton(AF_INET6, host.c_str(), &address) == 1;
}

}  // namespace

bool NamesHost(const std::vector<std::string>& names,
               const std::string& address) {
  std::string host = SplitHostPort(address).first;
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return std::any_of(names.begin(), names.end(), [&](const std::string& n) {
    if (absl::EqualsIgnoreCase(n, host)) return true;
    if (!absl::StartsWith(n, "*.") || IsIpAddress(host)) return false;
    const size_t dot = host.find('.');
    return dot != 0 && dot != std::string::npos &&
           absl::EqualsIgnoreCase(n.substr(1), host.substr(dot));
  });
}

absl::Status CheckCaller(const grpc::ServerContextBase& context,
                         const std::vector<std::string>& addresses,
                         const std::string& who) {
  const std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth == nullptr || !OverTls(*auth)) return absl::OkStatus();
  const std::vector<std::string> names = CertificateNames(*auth);
  for (const std::string& address : addresses) {
    if (NamesHost(names, address)) return absl::OkStatus();
  }
  std::vector<std::string> hosts;
  for (const std::string& address : addresses) {
    hosts.push_back(SplitHostPort(address).first);
  }
  return absl::PermissionDeniedError(absl::StrCat(
      "the caller's certificate names [", absl::StrJoin(names, ", "),
      "], not the host of ", who, " (",
      hosts.empty() ? "no member" : absl::StrJoin(hosts, ", "), ")"));
}

namespace {
constexpr int kKeepaliveTimeMs = 10000;
constexpr int kKeepaliveTimeoutMs = 5000;
}  // namespace

grpc::ChannelArguments DefaultChannelArguments() {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, kKeepaliveTimeMs);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kKeepaliveTimeoutMs);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // Pings go on however long the connection carries no data (gRPC stops
  // after 2 by default).
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  // Reconnect within a second of a server's return however long it was
  // gone (gRPC's default backoff grows to 120 s), so that members come back
  // to a restarted coordinator before it gives up on them.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 250);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  return args;
}

void ApplyServerKeepalive(grpc::ServerBuilder& builder) {
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, kKeepaliveTimeMs);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
                             kKeepaliveTimeoutMs);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  builder.AddChannelArgument(
      GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
      kKeepaliveTimeMs / 2);
}

}  // namespace gradmesh
