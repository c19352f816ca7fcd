// Small helpers for absl::Status plumbing and invariant checks.
//
// Abseil 20220623 ships neither RETURN_IF_ERROR / ASSIGN_OR_RETURN nor a CHECK
// macro, so the project defines its own, once, here.
//
//   GM_RETURN_IF_ERROR(transport.Send(peer, tag, payload));
//   GM_ASSIGN_OR_RETURN(std::string bytes, transport.Recv(peer, tag,
//   deadline)); GM_CHECK(begin <= end) << "block range";
//
// GM_CHECK is for broken invariants (bugs), never for bad input: it prints the
// condition, the location and the streamed message, then aborts.
#ifndef GRADMESH_COMMON_STATUS_MACROS_H_
#define GRADMESH_COMMON_STATUS_MACROS_H_

#include <sstream>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace gradmesh::internal {

// Streams a message and aborts in its destructor.
class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* condition);
  [[noreturn]] ~CheckFailure();
  std::ostream& stream() { return stream_; }

 private:
  std::ostringstream stream_;
};

}  // namespace gradmesh::internal

#define GM_STATUS_CONCAT_INNER_(a, b) a##b
#define GM_STATUS_CONCAT_(a, b) GM_STATUS_CONCAT_INNER_(a, b)

#define GM_RETURN_IF_ERROR(expr)             \
  do {                                       \
    ::absl::Status gm_status_ = (expr);      \
    if (!gm_status_.ok()) return gm_status_; \
  } while (false)

#define GM_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                              \
  if (!statusor.ok()) return statusor.status();        \
  lhs = std::move(statusor).value()

#define GM_ASSIGN_OR_RETURN(lhs, expr)                                      \
  GM_ASSIGN_OR_RETURN_IMPL_(GM_STATUS_CONCAT_(gm_statusor_, __LINE__), lhs, \
                            expr)

#define GM_CHECK(condition) \
  if (condition) {          \
  } else                    \
    ::gradmesh::internal::CheckFailure(__FILE__, __LINE__, #condition).stream()

#define GM_CHECK_OK(expr)                                                  \
  if (::absl::Status gm_check_status_ = (expr); gm_check_status_.ok()) {   \
  } else                                                                   \
    ::gradmesh::internal::CheckFailure(__FILE__, __LINE__, #expr).stream() \
        << gm_check_status_ << " "

#endif  // GRADMESH_COMMON_STATUS_MACROS_H_
