#include "worker/engine/engine.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/collectives/tensor_quota.h"

namespace gradmesh::engine {

absl::Status CheckOptions(const GroupConfig& group) {
  GM_CHECK(group.transport != nullptr);
  return collectives::CreateCollective(group.options.algorithm,
                                       group.transport->size(),
                                       group.transport->rank(), 0)
      .status();
}

GroupConfig ExactConfig(const GroupConfig& group) {
  GroupConfig exact = group;
  exact.options.algorithm = {.algorithm = std::string(kExactAlgorithm)};
  return exact;
}

bool SplitsPerTensor(absl::string_view algorithm) {
  const collectives::AlgorithmEntry* entry =
      collectives::FindAlgorithm(algorithm);
  return entry != nullptr && entry->tensor_quotas;
}

double DenseRingModelBytes(int world_size, uint64_t values) {
  return collectives::FindAlgorithm("dense")
      ->cost(world_size, 1, values, 1.0)
      .model_bytes;
}

uint64_t CountMissingTensors(absl::Span<const uint64_t> starts, uint64_t n,
                             const sparse::SparseBlock& result) {
  return collectives::CountMissingTensors(starts, n, result);
}

absl::StatusOr<std::shared_ptr<Engine::Buffer>> Engine::FindOrCreate(
    absl::string_view name, uint64_t n) {
  absl::MutexLock lock(&mu_);
  std::shared_ptr<Buffer>& buffer = buffers_[name];
  if (buffer == nullptr) buffer = std::make_shared<Buffer>(n);
  if (buffer->n != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "buffer '", name, "' has ", buffer->n, " values, got ", n));
  }
  return buffer;
}

std::shared_ptr<Engine::Buffer> Engine::Find(absl::string_view name) const {
  absl::MutexLock lock(&mu_);
  auto it = buffers_.find(name);
  return it == buffers_.end() ? nullptr : it->second;
}

absl::StatusOr<sparse::SparseBlock> Engine::AllReduce(
    const GroupConfig& group, const Request& request,
    collectives::OpStats* stats) {
  GM_CHECK(group.transport != nullptr && stats != nullptr);
  const transport::OperationScope scope(group.transport, group.options.epoch,
                                        request.operation);
  GM_ASSIGN_OR_RETURN(std::shared_ptr<Buffer> buffer,
                      FindOrCreate(request.buffer, request.gradient.size()));
  absl::MutexLock lock(&buffer->mu);
  absl::Span<float> residual = absl::MakeSpan(buffer->residual);
  auto run = [&]() -> absl::StatusOr<sparse::SparseBlock> {
    if (buffer->collective == nullptr ||
        buffer->collective_epoch != group.options.epoch ||
        buffer->collective_algorithm != group.options.algorithm.algorithm ||
        buffer->collective_tail != group.options.algorithm.exact_tail) {
      buffer->collective.reset();
      collectives::AlgorithmOptions options = group.options.algorithm;
      options.tensor_starts.assign(request.tensor_starts.begin(),
                                   request.tensor_starts.end());
      auto collective = collectives::CreateCollective(
          options, group.transport->size(), group.transport->rank(),
          residual.size());
      if (!collective.ok()) {
        // The promise of collective.h: the gradient is not lost.
        collectives::AccumulateFinite(request.gradient, residual);
        return collective.status();
      }
      buffer->collective = *std::move(collective);
      buffer->collective_epoch = group.options.epoch;
      buffer->collective_algorithm = group.options.algorithm.algorithm;
      buffer->collective_tail = group.options.algorithm.exact_tail;
    }
    const collectives::OpContext context{
        .transport = group.transport,
        .epoch = group.options.epoch,
        .operation = request.operation,
        .deadline =
            std::min(request.deadline, absl::Now() + group.options.timeout)};
    return Run(*buffer->collective, request, context, residual, stats);
  };
  absl::StatusOr<sparse::SparseBlock> result = run();
  if (request.residual_out != nullptr) request.residual_out(residual);
  return result;
}

absl::StatusOr<sparse::SparseBlock> Engine::Run(
    collectives::Collective& collective, const Request& request,
    const collectives::OpContext& context, absl::Span<float> residual,
    collectives::OpStats* stats) {
  GM_ASSIGN_OR_RETURN(const uint64_t nonfinite,
                      collective.Accumulate(request.gradient, residual, stats));
  // From here on the residual holds the accumulator until a proposal is
  // applied: any failure leaves it there, nothing lost.
  if (request.agree) GM_RETURN_IF_ERROR(request.agree(nonfinite));
  GM_ASSIGN_OR_RETURN(collectives::Proposal proposal,
                      collective.Reduce(residual, context, stats));
  if (request.commit) GM_RETURN_IF_ERROR(request.commit(proposal.result));
  std::move(proposal.apply)(proposal.result, residual);
  return std::move(proposal.result);
}

absl::Status Engine::Keep(absl::string_view name,
                          absl::Span<const float> gradient) {
  GM_ASSIGN_OR_RETURN(std::shared_ptr<Buffer> buffer,
                      FindOrCreate(name, gradient.size()));
  absl::MutexLock lock(&buffer->mu);
  collectives::AccumulateFinite(gradient, absl::MakeSpan(buffer->residual));
  return absl::OkStatus();
}

absl::Status Engine::SetResidual(absl::string_view name,
                                 absl::Span<const float> residual) {
  GM_ASSIGN_OR_RETURN(std::shared_ptr<Buffer> buffer,
                      FindOrCreate(name, residual.size()));
  absl::MutexLock lock(&buffer->mu);
  std::copy(residual.begin(), residual.end(), buffer->residual.begin());
  return absl::OkStatus();
}

void Engine::Drop(absl::string_view name) {
  std::shared_ptr<Buffer> buffer;
  {
    absl::MutexLock lock(&mu_);
    auto it = buffers_.find(name);
    if (it == buffers_.end()) return;
    buffer = std::move(it->second);
    buffers_.erase(it);
  }
  absl::MutexLock wait_for_idle(&buffer->mu);
}

std::vector<std::string> Engine::buffers() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> names;
  for (const auto& [name, buffer] : buffers_) names.push_back(name);
  return names;
}

bool Engine::ReadResidual(absl::string_view name,
                          absl::FunctionRef<void(absl::Span<const float>)> read,
                          bool if_idle) const {
  std::shared_ptr<Buffer> buffer = Find(name);
  if (buffer == nullptr) {
    read({});
    return true;
  }
  if (if_idle) {
    if (!buffer->mu.TryLock()) return false;
  } else {
    buffer->mu.Lock();
  }
  read(buffer->residual);
  buffer->mu.Unlock();
  return true;
}

}  // namespace gradmesh::engine
