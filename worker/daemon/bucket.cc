#include "worker/daemon/bucket.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/fnv1a.h"
#include "common/status_macros.h"

namespace gradmesh::daemon {
namespace {

constexpr uint64_t kMaxNameBytes = 256;

absl::StatusOr<std::string> Describe(const BucketName& name,
                                     const std::vector<TensorSpec>& tensors,
                                     uint64_t* n) {
  GM_RETURN_IF_ERROR(CheckName("job", name.job, false));
  GM_RETURN_IF_ERROR(CheckName("bucket", name.bucket, false));
  if (tensors.empty()) {
    return absl::InvalidArgumentError("a tensor set needs a tensor");
  }
  absl::flat_hash_set<std::string> seen;
  std::vector<std::string> parts;
  *n = 0;
  for (const TensorSpec& t : tensors) {
    if (t.name.empty() || t.name.size() > kMaxNameBytes ||
        !seen.insert(t.name).second || t.size == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", t.name, "' of bucket '", name.bucket,
          "': names must be unique and non-empty, sizes positive"));
    }
    *n += t.size;
    if (*n > std::numeric_limits<uint32_t>::max()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "bucket '", name.bucket, "' holds over 2^32 - 1 values"));
    }
    parts.push_back(absl::StrCat(t.name, ":", t.size));
  }
  return absl::StrCat(name.bucket, " [", absl::StrJoin(parts, ","), "]");
}

}  // namespace

std::string BucketKey(const BucketName& name) {
  return absl::StrCat(name.job, "/", name.bucket);
}

absl::Status CheckName(absl::string_view what, absl::string_view name,
                       bool may_be_empty) {
  if ((name.empty() && !may_be_empty) || name.size() > kMaxNameBytes ||
      name.find('/') != absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bad ", what, " name '", name, "': 1 to 256 bytes without '/'"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Bucket>> OpenBucket(
    const BucketName& name, const std::vector<TensorSpec>& tensors,
    const std::string& shm_name, const BucketOptions& options) {
  auto bucket = std::make_shared<Bucket>();
  bucket->name = name;
  bucket->key = BucketKey(name);
  uint64_t n = 0;
  GM_ASSIGN_OR_RETURN(bucket->descriptor, Describe(name, tensors, &n));
  if (!options.per_tensor_quota) {
    absl::StrAppend(&bucket->descriptor, " after-fusion");
  }
  if (options.exact) absl::StrAppend(&bucket->descriptor, " exact");
  if (options.exact_tensors > tensors.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bucket '", name.bucket, "': the last ", options.exact_tensors,
        " tensors exact, of ", tensors.size()));
  }
  if (options.exact_tensors > 0) {
    absl::StrAppend(&bucket->descriptor, " exact-last:", options.exact_tensors);
  }
  bucket->per_tensor_quota = options.per_tensor_quota;
  // A tail of every tensor is the whole bucket exact, and says so.
  bucket->exact = options.exact || (options.exact_tensors > 0 &&
                                    options.exact_tensors == tensors.size());
  for (uint64_t start = 0; const TensorSpec& t : tensors) {
    bucket->tensor_starts.push_back(start);
    start += t.size;
  }
  for (size_t i = tensors.size() - options.exact_tensors;
       !bucket->exact && i < tensors.size(); ++i) {
    bucket->exact_tail += tensors[i].size;
  }
  bucket->fingerprint = Fnv1a(bucket->descriptor);
  bucket->layout = SegmentLayout(n);
  GM_ASSIGN_OR_RETURN(bucket->segment,
                      SharedSegment::Open(shm_name, bucket->layout.bytes));
  bucket->shm_name = shm_name;
  // Mapped: the name can go, so a client killed now leaves nothing behind.
  SharedSegment::Unlink(shm_name).IgnoreError();
  return bucket;
}

absl::Status Hold(Bucket& bucket, absl::Time deadline) {
  absl::MutexLock lock(&bucket.mu);
  auto idle = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(bucket.mu) {
    return !bucket.busy;
  };
  if (!bucket.mu.AwaitWithDeadline(absl::Condition(&idle), deadline)) {
    return absl::DeadlineExceededError(absl::StrCat(
        "bucket '", bucket.name.bucket,
        "' was still busy with an earlier call at the deadline; this call's "
        "gradient was not read"));
  }
  bucket.busy = true;
  return absl::OkStatus();
}

void Release(Bucket& bucket) {
  absl::MutexLock lock(&bucket.mu);
  bucket.busy = false;
}

absl::Status Usable(Bucket& bucket, const std::function<bool()>& cancelled) {
  absl::MutexLock lock(&bucket.mu);
  if (bucket.forgotten) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bucket '", bucket.name.bucket, "' of job '", bucket.name.job,
        "' was unregistered or registered again"));
  }
  // The client gave up while this call waited: its memory is its own again.
  if (cancelled != nullptr && cancelled()) {
    return absl::CancelledError("the client gave up before the call started");
  }
  return absl::OkStatus();
}

}  // namespace gradmesh::daemon
