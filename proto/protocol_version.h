// The version of what workers and the coordinator say to each other: the
// meaning of gradmesh/v1/peer.proto's and coordinator.proto's messages (the
// acknowledgements, the step's agreement and vote). Workers of two versions
// cannot run a step together (a newer sender waits for acknowledgements an
// older worker never sends), so the coordinator and its workers must speak
// one version: a worker asks the coordinator's (Hello, which changes
// nothing) before it joins or takes a view, and the coordinator refuses the
// Join of a worker of another (JoinRequest.protocol; 0 from a gradmesh
// from before versions were named, whose coordinator answers Hello with
// UNIMPLEMENTED). Raise it with any change that breaks a step between two
// versions.
#ifndef GRADMESH_PROTO_PROTOCOL_VERSION_H_
#define GRADMESH_PROTO_PROTOCOL_VERSION_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace gradmesh {

inline constexpr uint32_t kProtocolVersion = 1;

// FailedPrecondition naming both versions unless `theirs` (the version of
// `who`, e.g. "worker w1") is kProtocolVersion (that of `self`, e.g. "the
// coordinator").
inline absl::Status CheckProtocol(uint32_t theirs, absl::string_view who,
                                  absl::string_view self) {
  if (theirs == kProtocolVersion) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      who, " speaks protocol ", theirs,
      theirs == 0 ? " (a gradmesh from before versions were named)" : "", ", ",
      self, " ", kProtocolVersion,
      ": the coordinator and every worker of a cluster must run the same "
      "gradmesh version"));
}

}  // namespace gradmesh

#endif  // GRADMESH_PROTO_PROTOCOL_VERSION_H_
