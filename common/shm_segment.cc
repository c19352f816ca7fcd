#include "common/shm_segment.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace gradmesh {
namespace {

absl::Status CheckName(const std::string& name) {
  if (name.size() < 2 || name.size() > 200 || name[0] != '/' ||
      name.find('/', 1) != std::string::npos ||
      !absl::StartsWith(name, "/gradmesh-")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bad shared memory name '", name, "' (want /gradmesh-...)"));
  }
  return absl::OkStatus();
}

absl::Status Errno(absl::string_view what, const std::string& name) {
  const int e = errno;
  const std::string text = absl::StrCat(what, " ", name, ": ", strerror(e));
  if (e == ENOENT) return absl::NotFoundError(text);
  if (e == EEXIST) return absl::AlreadyExistsError(text);
  return absl::InternalError(text);
}

absl::StatusOr<char*> Map(int fd, uint64_t bytes, const std::string& name) {
  if (bytes == 0) return nullptr;
  void* data = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) return Errno("mmap", name);
  return static_cast<char*>(data);
}

}  // namespace

absl::StatusOr<SharedSegment> SharedSegment::Create(const std::string& name,
                                                    uint64_t bytes) {
  if (absl::Status ok = CheckName(name); !ok.ok()) return ok;
  const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) return Errno("shm_open", name);
  absl::StatusOr<char*> data = absl::InternalError("unset");
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    data = Errno("ftruncate", name);
  } else {
    data = Map(fd, bytes, name);
  }
  if (!data.ok()) {
    close(fd);
    shm_unlink(name.c_str());
    return data.status();
  }
  return SharedSegment(*data, bytes, fd);
}

absl::StatusOr<SharedSegment> SharedSegment::Open(const std::string& name,
                                                  uint64_t bytes) {
  if (absl::Status ok = CheckName(name); !ok.ok()) return ok;
  const int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) return Errno("shm_open", name);
  struct stat st = {};
  absl::StatusOr<char*> data = absl::InternalError("unset");
  if (fstat(fd, &st) != 0) {
    data = Errno("fstat", name);
  } else if (st.st_uid != geteuid() || (st.st_mode & 077) != 0) {
    data = absl::PermissionDeniedError(
        absl::StrCat(name, " is not private to this user (owner ", st.st_uid,
                     ", mode ", absl::Hex(st.st_mode & 0777), ")"));
  } else if (static_cast<uint64_t>(st.st_size) != bytes) {
    data = absl::InvalidArgumentError(
        absl::StrCat(name, " holds ", st.st_size, " bytes, expected ", bytes));
  } else {
    data = Map(fd, bytes, name);
  }
  if (!data.ok()) {
    close(fd);
    return data.status();
  }
  return SharedSegment(*data, bytes, fd);
}

absl::Status SharedSegment::Unlink(const std::string& name) {
  if (shm_unlink(name.c_str()) != 0 && errno != ENOENT) {
    return Errno("shm_unlink", name);
  }
  return absl::OkStatus();
}

std::string SharedSegment::UniqueName(absl::string_view tag) {
  static std::atomic<uint64_t> counter{0};
  std::string clean;
  for (char c : tag.substr(0, 64)) {
    clean.push_back(std::isalnum(static_cast<unsigned char>(c)) ? c : '_');
  }
  // The random part keeps other local users from creating it first.
  thread_local absl::BitGen bitgen;
  return absl::StrCat(
      "/gradmesh-", getpid(), "-", counter++, "-",
      absl::Hex(absl::Uniform<uint64_t>(bitgen), absl::kZeroPad16), "-", clean);
}

absl::Status SharedSegment::HoldLock() {
  if (fd_ < 0) return absl::FailedPreconditionError("no segment to lock");
  while (flock(fd_, LOCK_SH) != 0) {
    if (errno != EINTR) return Errno("flock", "segment");
  }
  return absl::OkStatus();
}

bool SharedSegment::Abandoned() const {
  if (fd_ < 0) return false;
  if (flock(fd_, LOCK_EX | LOCK_NB) != 0) return false;  // held, or EINTR
  flock(fd_, LOCK_UN);
  return true;
}

SharedSegment::SharedSegment(SharedSegment&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      fd_(std::exchange(other.fd_, -1)) {}

SharedSegment& SharedSegment::operator=(SharedSegment&& other) noexcept {
  if (this != &other) {
    Reset();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

SharedSegment::~SharedSegment() { Reset(); }

void SharedSegment::Reset() {
  if (data_ != nullptr) munmap(data_, size_);
  if (fd_ >= 0) close(fd_);  // releases a lock held through it
  data_ = nullptr;
  size_ = 0;
  fd_ = -1;
}

}  // namespace gradmesh
