// The data plane's residuals for checkpoints, and their norms.
#include <algorithm>
#include <cmath>

#include "worker/daemon/data_plane_internal.h"

namespace gradmesh::daemon {

absl::Status DataPlane::SaveResidual(const BucketName& name,
                                     absl::Time deadline) {
  return WithBucket<bool>(
             name, deadline, nullptr,
             [&](Bucket& bucket) -> absl::StatusOr<bool> {
               float* out = bucket.segment.at<float>(bucket.layout.residual);
               engine_.ReadResidual(
                   bucket.buffer, [&](absl::Span<const float> residual) {
                     if (residual.empty()) {  // no step yet: zeros
                       std::fill(out, out + bucket.layout.n, 0.0f);
                     }
                     std::copy(residual.begin(), residual.end(), out);
                   });
               return true;
             })
      .status();
}

absl::Status DataPlane::LoadResidual(const BucketName& name,
                                     absl::Time deadline) {
  return WithBucket<bool>(
             name, deadline, nullptr,
             [&](Bucket& bucket) -> absl::StatusOr<bool> {
               const absl::Span<const float> residual(
                   bucket.segment.at<float>(bucket.layout.residual),
                   bucket.layout.n);
               for (size_t i = 0; i < residual.size(); ++i) {
                 if (!std::isfinite(residual[i])) {
                   return absl::InvalidArgumentError(
                       absl::StrCat("residual of bucket '", name.bucket,
                                    "' to load has a non-finite value at ", i,
                                    "; the worker's residual is unchanged"));
                 }
               }
               GM_RETURN_IF_ERROR(engine_.SetResidual(bucket.buffer, residual));
               return true;
             })
      .status();
}

std::vector<std::pair<std::string, double>> DataPlane::ResidualNorms() const {
  std::vector<std::pair<std::string, std::string>> keys;  // key, buffer
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [key, bucket] : buckets_) {
      keys.emplace_back(key, bucket->buffer);
    }
  }
  std::vector<std::pair<std::string, double>> norms;
  for (const auto& [key, buffer] : keys) {
    double norm = 0;
    const bool read = engine_.ReadResidual(
        buffer,
        [&](absl::Span<const float> residual) {
          for (float v : residual) norm += double{v} * v;
        },
        /*if_idle=*/true);
    norms.emplace_back(key, read ? std::sqrt(norm) : -1.0);
  }
  return norms;
}

}  // namespace gradmesh::daemon
