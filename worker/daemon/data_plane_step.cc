// The data plane's all-reduce: a step, its retries on a new view, one
// attempt, and the result written into the segment.
#include <algorithm>
#include <cstring>

#include "common/steady_clock.h"
#include "worker/daemon/data_plane_internal.h"
#include "worker/daemon/worker_metrics.h"

namespace gradmesh::daemon {
namespace {

// Whether `bucket`'s selections split their quota per tensor under `plan`:
// unless the bucket or the plan says after_fusion.
bool PerTensor(const Bucket& bucket, const PlanInfo& plan) {
  return bucket.per_tensor_quota && plan.fusion != collectives::kAfterFusion;
}

// Takes call.step as the bucket's latest step: InvalidArgument (the step
// refused) unless it is after the last one. Sets *period_seconds to the time
// since the step before's call came, when call.step follows it.
absl::Status ClaimStep(const ReduceCall& call, Bucket& bucket,
                       double* period_seconds) {
  absl::MutexLock lock(&bucket.mu);
  if (bucket.last_step.has_value() && call.step <= *bucket.last_step) {
    return absl::InvalidArgumentError(
        absl::StrCat("step ", call.step, " is not after step ",
                     *bucket.last_step, " of bucket '", call.name.bucket,
                     "'; the gradient is kept in the residual"));
  }
  const absl::Time now = SteadyNow();
  if (bucket.last_step.has_value() && call.step == *bucket.last_step + 1) {
    *period_seconds = absl::ToDoubleSeconds(now - bucket.last_step_began);
  }
  bucket.last_step_began = now;
  // A step number is used once per registration, so that no operation id
  // is ever reused (a failed operation's id is retired).
  bucket.last_step = call.step;
  return absl::OkStatus();
}

}  // namespace

void DataPlane::MarkMissed(const Bucket& bucket, uint64_t step) {
  absl::MutexLock lock(&mu_);
  missed_[bucket.name.job] = step;
}

uint64_t DataPlane::MissedMark(const Bucket& bucket) const {
  absl::MutexLock lock(&mu_);
  auto it = missed_.find(bucket.name.job);
  return it == missed_.end() ? 0 : it->second + 1;
}

void DataPlane::MarkWhole(const Bucket& bucket) {
  std::vector<std::shared_ptr<Bucket>> job;
  {
    absl::MutexLock lock(&mu_);
    missed_.erase(bucket.name.job);
    for (const auto& [key, b] : buckets_) {
      if (b->name.job == bucket.name.job) job.push_back(b);
    }
  }
  for (const std::shared_ptr<Bucket>& b : job) {
    absl::MutexLock lock(&b->mu);
    b->applied_step = 0;  // every replica is the root's again
    b->applied_epoch = 0;
  }
}

void DataPlane::MarkRefused(Bucket& bucket, bool refused) {
  absl::MutexLock lock(&bucket.mu);
  bucket.last_step_refused = refused;
}

absl::StatusOr<ReduceResult> DataPlane::AllReduce(const ReduceCall& call,
                                                  absl::Time deadline) {
  absl::StatusOr<ReduceResult> result = WithBucket<ReduceResult>(
      call.name, deadline, call.cancelled,
      [&](Bucket& bucket) { return Run(call, bucket, deadline); });
  if (!result.ok() && hooks_.metrics != nullptr) {
    hooks_.metrics->operations(absl::StatusCodeToString(result.status().code()))
        .Increment();
  }
  return result;
}

absl::StatusOr<ReduceResult> DataPlane::Run(const ReduceCall& call,
                                            Bucket& bucket,
                                            absl::Time deadline) {
  double period_seconds = 0;
  const absl::Status refused = ClaimStep(call, bucket, &period_seconds);
  absl::StatusOr<std::shared_ptr<Group>> group =
      refused.ok() ? views_->Acquire(call.step, deadline) : refused;
  if (group.ok()) group = RegisteredOn(bucket, *std::move(group));
  if (!group.ok()) {
    // Nothing is lost: the next step carries this gradient.
    engine_.Keep(bucket.buffer, bucket.values()).IgnoreError();
    if (refused.ok()) MarkRefused(bucket, true);
    return group.status();
  }
  MarkRefused(bucket, false);
  // A step that failed because membership changed runs again on the new
  // view, from the residual, which holds its gradient now: every member
  // whose attempt failed does the same (an attempt is all or nothing), so
  // the survivors meet on the new view under the same step.
  std::vector<float> zeros;
  absl::Span<const float> gradient = bucket.values();
  while (true) {
    bool retriable = false;
    absl::StatusOr<ReduceResult> out = Attempt(
        call, bucket, **group, gradient, deadline, period_seconds, &retriable);
    if (out.ok() || !retriable) return out;
    const uint64_t failed = (*group)->view.epoch;
    const absl::Time wait =
        std::min(deadline, views_->clock()->Now() + options_.view_wait);
    if (!views_->AwaitNewer(failed, wait)) return out;
    group = views_->Acquire(call.step, deadline);
    if (!group.ok() || (*group)->view.epoch == failed) return out;
    // (The gradient is in the residual already.)
    if (group = RegisteredOn(bucket, *std::move(group)); !group.ok()) {
      MarkRefused(bucket, true);
      return group.status();
    }
    if (hooks_.metrics != nullptr) hooks_.metrics->retries().Increment();
    zeros.assign(bucket.layout.n, 0.0f);
    gradient = zeros;
  }
}

engine::Request DataPlane::StepRequest(const ReduceCall& call, Bucket& bucket,
                                       const Group& g,
                                       absl::Span<const float> gradient,
                                       absl::Time deadline, StepState* state) {
  const uint64_t agree_op = AgreeOperation(bucket, call.step);
  engine::Request request{
      .buffer = bucket.buffer,
      .gradient = gradient,
      .operation = OperationId("allreduce", bucket.buffer, call.step),
      .deadline = deadline,
      .agree =
          [this, &bucket, &g, deadline, agree_op, state](uint64_t nonfinite) {
            StepRecord record{.fingerprint = bucket.fingerprint,
                              .values = bucket.layout.n,
                              .nonfinite = nonfinite,
                              .missed = MissedMark(bucket)};
            {
              absl::MutexLock lock(&bucket.mu);
              record.applied_step = bucket.applied_step;
              record.applied_epoch = bucket.applied_epoch;
            }
            // Its wait is the operation's (peers' skew lands there); its
            // rounds and bytes are not the algorithm's and stay out of the
            // stats.
            return protocol_.Agree(g, bucket.name.bucket, agree_op, record,
                                   deadline, &state->out.stats.wait_seconds);
          },
      .commit =
          [this, &call, &bucket, &g, deadline,
           state](const sparse::SparseBlock& result) {
            return Commit(g, bucket, call, result, deadline,
                          &state->refused_by_vote);
          }};
  if (PerTensor(bucket, g.view.plan)) {
    request.tensor_starts = bucket.tensor_starts;
  }
  if (call.return_residual) {
    request.residual_out = [&bucket](absl::Span<const float> residual) {
      std::memcpy(bucket.segment.at<float>(bucket.layout.residual),
                  residual.data(), residual.size() * sizeof(float));
    };
  }
  return request;
}

absl::StatusOr<ReduceResult> DataPlane::Attempt(
    const ReduceCall& call, Bucket& bucket, const Group& g,
    absl::Span<const float> gradient, absl::Time deadline,
    double period_seconds, bool* retriable) {
  StepState state{.out = {.epoch = g.view.epoch,
                          .rank = g.rank,
                          .world_size = g.size(),
                          .plan = g.view.plan,
                          .period_seconds = period_seconds,
                          .step = call.step,
                          .values = bucket.layout.n}};
  // Small buckets, those registered exact, those the plan's `auto` found
  // faster dense and the warm-up's steps are summed exactly.
  const collectives::Plan& plan = g.view.plan;
  const bool exact =
      bucket.exact || bucket.layout.n < plan.exact_below ||
      call.step < plan.warmup_steps ||
      std::binary_search(plan.dense_sizes.begin(), plan.dense_sizes.end(),
                         bucket.layout.n);
  if (exact) state.out.plan.algorithm = std::string(engine::kExactAlgorithm);
  state.out.exact = exact;
  const engine::Request request =
      StepRequest(call, bucket, g, gradient, deadline, &state);
  engine::GroupConfig config =
      exact ? engine::ExactConfig(g.config()) : g.config();
  if (!exact) config.options.algorithm.exact_tail = bucket.exact_tail;
  const absl::Time start = absl::Now();
  absl::StatusOr<sparse::SparseBlock> result =
      engine_.AllReduce(config, request, &state.out.stats);
  state.out.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  if (!result.ok()) {
    const absl::Status& why = result.status();
    *retriable = (absl::IsAborted(why) || absl::IsUnavailable(why)) &&
                 !state.refused_by_vote;
    return absl::Status(why.code(),
                        absl::StrCat("step ", call.step, " of bucket '",
                                     call.name.bucket, "': ", why.message()));
  }
  return Applied(call, bucket, g, *result, std::move(state.out));
}

absl::StatusOr<ReduceResult> DataPlane::Applied(
    const ReduceCall& call, Bucket& bucket, const Group& g,
    const sparse::SparseBlock& result, ReduceResult out) {
  // The client gave up after voting to apply the step (a narrow window, or
  // in doubt at its deadline): its memory is its own again, and its replica
  // is behind until a Broadcast.
  if (call.cancelled != nullptr && call.cancelled()) {
    MarkMissed(bucket, call.step);
    return absl::CancelledError(absl::StrCat(
        "step ", call.step, " of bucket '", call.name.bucket,
        "' was applied on every member, but this worker's client gave up "
        "just before its result was written: this replica missed it"));
  }
  WriteResult(call, bucket, result, g.size());
  {
    absl::MutexLock lock(&bucket.mu);
    bucket.applied_step = call.step + 1;
    bucket.applied_epoch = g.view.epoch;
  }
  out.nonzeros = result.size();
  out.tensors = bucket.tensor_starts.size();
  out.tensors_missing = engine::CountMissingTensors(bucket.tensor_starts,
                                                    bucket.layout.n, result);
  recorder_.Record(out, g,
                   PerTensor(bucket, out.plan) &&
                       engine::SplitsPerTensor(out.plan.algorithm));
  if (hooks_.on_success) hooks_.on_success(out);
  return out;
}

void DataPlane::WriteResult(const ReduceCall& call, const Bucket& bucket,
                            const sparse::SparseBlock& result, int world_size) {
  const float divisor = call.mean ? static_cast<float>(world_size) : 1.0f;
  if (call.sparse) {
    std::memcpy(bucket.segment.at<uint32_t>(bucket.layout.indices),
                result.indices.data(), result.size() * sizeof(uint32_t));
    float* values = bucket.segment.at<float>(bucket.layout.sparse_values);
    for (size_t e = 0; e < result.size(); ++e) {
      values[e] = result.values[e] / divisor;
    }
    return;
  }
  absl::Span<float> values = bucket.values();
  if (result.size() == values.size()) {
    // Every index, in order (they increase below n): no fill, no scatter.
    std::transform(result.values.begin(), result.values.end(), values.begin(),
                   [divisor](float v) { return v / divisor; });
    return;
  }
  std::fill(values.begin(), values.end(), 0.0f);
  for (size_t e = 0; e < result.size(); ++e) {
    values[result.indices[e]] = result.values[e] / divisor;
  }
}

}  // namespace gradmesh::daemon
