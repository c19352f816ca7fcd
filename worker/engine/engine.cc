#include "worker/engine/engine.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace gradmesh::engine {

namespace {

// Validates the algorithm options with a throw-away instance over n = 0.
absl::Status CheckOptions(transport::Transport* transport,
                          const EngineOptions& options) {
  GM_CHECK(transport != nullptr);
  return collectives::CreateCollective(options.algorithm, transport->size(),
                                       transport->rank(), 0)
      .status();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(
    transport::Transport* transport, const EngineOptions& options) {
  GM_RETURN_IF_ERROR(CheckOptions(transport, options));
  return std::unique_ptr<Engine>(new Engine(transport, options));
}

absl::Status Engine::Reconfigure(transport::Transport* transport,
                                 const EngineOptions& options) {
  GM_RETURN_IF_ERROR(CheckOptions(transport, options));
  transport_ = transport;
  options_ = options;
  next_operation_ = 0;
  for (auto& [name, buffer] : buffers_) buffer.collective.reset();
  return absl::OkStatus();
}

absl::StatusOr<sparse::SparseBlock> Engine::AllReduce(
    absl::string_view name, absl::Span<const float> gradient,
    collectives::OpStats* stats) {
  return AllReduce(name, gradient, next_operation_++, stats);
}

absl::StatusOr<sparse::SparseBlock> Engine::AllReduce(
    absl::string_view name, absl::Span<const float> gradient,
    uint64_t operation, collectives::OpStats* stats) {
  auto it = buffers_.find(name);
  if (it == buffers_.end()) {
    it =
        buffers_
            .emplace(std::string(name),
                     Buffer{nullptr, std::vector<float>(gradient.size(), 0.0f)})
            .first;
  }
  Buffer& buffer = it->second;
  if (gradient.size() != buffer.residual.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("buffer '", name, "' has ", buffer.residual.size(),
                     " values, got ", gradient.size()));
  }
  if (buffer.collective == nullptr) {
    auto collective =
        collectives::CreateCollective(options_.algorithm, transport_->size(),
                                      transport_->rank(), gradient.size());
    if (!collective.ok()) {
      // Keep the promise of collective.h: the gradient is not lost.
      for (size_t i = 0; i < gradient.size(); ++i) {
        buffer.residual[i] += gradient[i];
      }
      return collective.status();
    }
    buffer.collective = *std::move(collective);
  }
  const collectives::OpContext context{
      .transport = transport_,
      .epoch = options_.epoch,
      .operation = operation,
      .deadline = absl::Now() + options_.timeout};
  return buffer.collective->AllReduce(gradient, absl::MakeSpan(buffer.residual),
                                      context, stats);
}

absl::Status Engine::Keep(absl::string_view name,
                          absl::Span<const float> gradient) {
  auto [it, inserted] = buffers_.try_emplace(
      name, Buffer{nullptr, std::vector<float>(gradient.size(), 0.0f)});
  std::vector<float>& residual = it->second.residual;
  if (residual.size() != gradient.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("buffer '", name, "' has ", residual.size(),
                     " values, got ", gradient.size()));
  }
  for (size_t i = 0; i < gradient.size(); ++i) residual[i] += gradient[i];
  return absl::OkStatus();
}

std::vector<std::string> Engine::buffers() const {
  std::vector<std::string> names;
  for (const auto& [name, buffer] : buffers_) names.push_back(name);
  return names;
}

absl::Span<const float> Engine::residual(absl::string_view name) const {
  auto it = buffers_.find(name);
  if (it == buffers_.end()) return {};
  return it->second.residual;
}

}  // namespace gradmesh::engine
