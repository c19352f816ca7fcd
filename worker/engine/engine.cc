#include "worker/engine/engine.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace gradmesh::engine {

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(
    transport::Transport* transport, const EngineOptions& options) {
  GM_CHECK(transport != nullptr);
  // Validate the algorithm options with a throw-away instance over n = 0.
  GM_RETURN_IF_ERROR(collectives::CreateCollective(options.algorithm,
                                                   transport->size(),
                                                   transport->rank(), 0)
                         .status());
  return std::unique_ptr<Engine>(new Engine(transport, options));
}

absl::StatusOr<sparse::SparseBlock> Engine::AllReduce(
    absl::string_view name, absl::Span<const float> gradient,
    collectives::OpStats* stats) {
  auto it = buffers_.find(name);
  if (it == buffers_.end()) {
    GM_ASSIGN_OR_RETURN(
        std::unique_ptr<collectives::Collective> collective,
        collectives::CreateCollective(options_.algorithm, transport_->size(),
                                      transport_->rank(), gradient.size()));
    it = buffers_
             .emplace(std::string(name),
                      Buffer{std::move(collective),
                             std::vector<float>(gradient.size(), 0.0f)})
             .first;
  }
  Buffer& buffer = it->second;
  if (gradient.size() != buffer.residual.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("buffer '", name, "' has ", buffer.residual.size(),
                     " values, got ", gradient.size()));
  }
  const collectives::OpContext context{
      .transport = transport_,
      .epoch = options_.epoch,
      .operation = next_operation_++,
      .deadline = absl::Now() + options_.timeout};
  return buffer.collective->AllReduce(gradient, absl::MakeSpan(buffer.residual),
                                      context, stats);
}

absl::Span<const float> Engine::residual(absl::string_view name) const {
  auto it = buffers_.find(name);
  if (it == buffers_.end()) return {};
  return it->second.residual;
}

}  // namespace gradmesh::engine
