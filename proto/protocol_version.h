// The version of what workers and the coordinator say to each other: the
// meaning of gradmesh/v1/peer.proto's and coordinator.proto's messages (the
// acknowledgements, the step's agreement and vote). Workers of two versions
// cannot run a step together (a newer sender waits for acknowledgements an
// older worker never sends), so a worker names its version when it joins
// (JoinRequest.protocol), the coordinator refuses a worker of another, and a
// worker refuses a coordinator of another (JoinResponse.protocol). 0 is what
// a gradmesh from before versions were named sends. Raise it with any change
// that breaks a step between two versions.
#ifndef GRADMESH_PROTO_PROTOCOL_VERSION_H_
#define GRADMESH_PROTO_PROTOCOL_VERSION_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace gradmesh {

inline constexpr uint32_t kProtocolVersion = 1;

// FailedPrecondition naming both versions unless `theirs` (that of `who`,
// e.g. "worker w1") is kProtocolVersion.
inline absl::Status CheckProtocol(uint32_t theirs, absl::string_view who) {
  if (theirs == kProtocolVersion) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      who, " speaks protocol ", theirs,
      theirs == 0 ? " (a gradmesh from before versions were named)" : "",
      ", this process ", kProtocolVersion,
      ": the coordinator and every worker of a cluster must run the same "
      "gradmesh version"));
}

}  // namespace gradmesh

#endif  // GRADMESH_PROTO_PROTOCOL_VERSION_H_
