// Engine: runs all-reduce requests of one worker end to end.
//
// It owns the residual (error feedback) of every named gradient buffer and
// one Collective per buffer, numbers the operations, and applies the
// operation timeout. Every rank must issue the same requests in the same
// order (as with any collective library): the operation number is what
// matches the messages of one request across ranks.
//
//   auto engine = Engine::Create(transport, {.algorithm = {.teams = 2}});
//   GM_ASSIGN_OR_RETURN(SparseBlock sum, (*engine)->AllReduce("fc1", grad,
//   &stats));
//
// Operation ids are either numbered by the engine (0, 1, 2, ... per
// configuration) or given by the caller, who then must give every rank the
// same id for the same request (the daemon derives them from the client's
// step), so that a rank that missed a request cannot shift the numbering of
// the ones after it.
//
// Not thread-safe: one caller at a time. The transport must outlive its use.
#ifndef GRADMESH_WORKER_ENGINE_ENGINE_H_
#define GRADMESH_WORKER_ENGINE_ENGINE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "worker/collectives/registry.h"
#include "worker/transport/transport.h"

namespace gradmesh::engine {

struct EngineOptions {
  collectives::AlgorithmOptions algorithm;
  absl::Duration timeout = absl::Seconds(60);  // per operation
  uint64_t epoch = 0;                          // membership epoch of the group
};

class Engine {
 public:
  // Checks the options once (InvalidArgument if an algorithm would reject
  // them).
  static absl::StatusOr<std::unique_ptr<Engine>> Create(
      transport::Transport* transport, const EngineOptions& options);

  // Sums `gradient` across the group for buffer `name` (see collective.h for
  // the semantics). The first call for a name fixes its size; a later call
  // with another size is InvalidArgument and changes nothing. On any error
  // the buffer's residual holds residual + gradient.
  absl::StatusOr<sparse::SparseBlock> AllReduce(
      absl::string_view name, absl::Span<const float> gradient,
      collectives::OpStats* stats);

  // The same, under the caller's operation id.
  absl::StatusOr<sparse::SparseBlock> AllReduce(
      absl::string_view name, absl::Span<const float> gradient,
      uint64_t operation, collectives::OpStats* stats);

  // Moves to another group (a new membership epoch or plan): later calls run
  // over `transport` with `options`, numbering restarts at 0, and the
  // residuals stay (they are this worker's own error feedback, whatever the
  // group). InvalidArgument, changing nothing, if the options don't fit.
  absl::Status Reconfigure(transport::Transport* transport,
                           const EngineOptions& options);

  // Adds `gradient` to the residual of `name` without reducing it, for a
  // request that cannot run (no group): nothing is lost, the next call
  // carries it. InvalidArgument for a size that does not match.
  absl::Status Keep(absl::string_view name, absl::Span<const float> gradient);

  // The names of the buffers seen so far.
  std::vector<std::string> buffers() const;

  // The residual of `name` (empty if the name is unknown).
  absl::Span<const float> residual(absl::string_view name) const;

  const EngineOptions& options() const { return options_; }

 private:
  struct Buffer {
    std::unique_ptr<collectives::Collective> collective;
    std::vector<float> residual;
  };

  Engine(transport::Transport* transport, const EngineOptions& options)
      : transport_(transport), options_(options) {}

  transport::Transport* transport_;
  EngineOptions options_;
  uint64_t next_operation_ = 0;
  absl::flat_hash_map<std::string, Buffer> buffers_;
};

}  // namespace gradmesh::engine

#endif  // GRADMESH_WORKER_ENGINE_ENGINE_H_
