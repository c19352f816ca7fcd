// SharedSegment: a POSIX shared-memory object mapped into this process, the
// data plane between a training process (the SDK) and its worker daemon.
//
// The SDK creates a segment for each registered tensor set (owner-only,
// mode 0600), the daemon opens it by name, and the SDK unlinks the name once
// the daemon has mapped it, so that nothing outlives the two processes. Both
// sides then read and write the same pages: the gradient is never copied
// through a socket.
//
//   GM_ASSIGN_OR_RETURN(SharedSegment s, SharedSegment::Create(name, bytes));
//   // daemon: GM_ASSIGN_OR_RETURN(SharedSegment s,
//   //                             SharedSegment::Open(name, bytes));
//
// The layout of a tensor set of n float32 values (SegmentLayout): the values
// (the gradient in, the dense result out), the sparse result's indices, the
// sparse result's values, and the residual, each n entries. Pages of a
// region nobody touches cost no memory.
//
// Whether the SDK's process still lives: it holds a shared lock (flock) on
// the segment for as long as it keeps the segment (HoldLock), and the
// kernel drops the lock when the process ends, however it ends. The daemon
// asks Abandoned(). Processes forked from the SDK's share its lock.
//
// Movable, not copyable; unmaps (and closes, dropping a lock) on destruction.
// Not thread-safe as an object; the mapped memory is shared and its users agree
// on who writes when.
#ifndef GRADMESH_COMMON_SHM_SEGMENT_H_
#define GRADMESH_COMMON_SHM_SEGMENT_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace gradmesh {

struct SegmentLayout {
  explicit SegmentLayout(uint64_t values_per_region)
      : n(values_per_region),
        values(0),
        indices(4 * n),
        sparse_values(8 * n),
        residual(12 * n),
        bytes(16 * n) {}
  uint64_t n;
  // Byte offsets of the regions, and the total size.
  uint64_t values, indices, sparse_values, residual, bytes;
};

class SharedSegment {
 public:
  // Creates object `name` ("/gradmesh-..."; it must not exist) of `bytes`
  // bytes, mode 0600, and maps it. InvalidArgument for a bad name,
  // AlreadyExists, or Internal with errno's text.
  static absl::StatusOr<SharedSegment> Create(const std::string& name,
                                              uint64_t bytes);

  // Maps existing object `name`, which must be exactly `bytes` long
  // (InvalidArgument otherwise: the size comes from another process) and
  // this user's alone (PermissionDenied); NotFound if it does not exist.
  static absl::StatusOr<SharedSegment> Open(const std::string& name,
                                            uint64_t bytes);

  // Removes the name (the mappings stay). OK if it is already gone.
  static absl::Status Unlink(const std::string& name);

  // A name no other segment of this host has, and that no other user can
  // guess: /gradmesh-<pid>-<counter>-<64 random bits, hex>-<tag>.
  static std::string UniqueName(absl::string_view tag);

  // Takes a shared lock on the object, held until this segment is destroyed
  // or the process ends. Internal with errno's text.
  absl::Status HoldLock();

  // Whether no other open of the object holds a lock on it (its creator's
  // HoldLock): the creator has destroyed its segment, or exited. False
  // while one is held, and for an empty segment.
  bool Abandoned() const;

  SharedSegment() = default;
  SharedSegment(SharedSegment&& other) noexcept;
  SharedSegment& operator=(SharedSegment&& other) noexcept;
  ~SharedSegment();

  char* data() const { return data_; }
  uint64_t size() const { return size_; }

  template <typename T>
  T* at(uint64_t offset) const {
    return reinterpret_cast<T*>(data_ + offset);
  }

 private:
  SharedSegment(char* data, uint64_t size, int fd)
      : data_(data), size_(size), fd_(fd) {}
  void Reset();

  char* data_ = nullptr;
  uint64_t size_ = 0;
  int fd_ = -1;  // the object, kept open for HoldLock and Abandoned
};

}  // namespace gradmesh

#endif  // GRADMESH_COMMON_SHM_SEGMENT_H_
