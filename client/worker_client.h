// WorkerClient: a blocking client of one worker's Worker service, the
// all-reduce call of the SDK (which builds on it) and of `gradmesh local`.
//
//   GM_ASSIGN_OR_RETURN(auto client, WorkerClient::Connect(address, tls));
//   GM_ASSIGN_OR_RETURN(Reduced r, client->AllReduce(step, {{"fc1", grad}}));
//
// Thread-compatible: one call at a time per client (a worker runs one
// request at a time anyway).
#ifndef GRADMESH_CLIENT_WORKER_CLIENT_H_
#define GRADMESH_CLIENT_WORKER_CLIENT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/grpc/grpc_util.h"
#include "gradmesh/v1/worker.grpc.pb.h"

namespace gradmesh::client {

struct Tensor {
  std::string name;
  std::vector<float> values;
};

// One tensor's sum across the workers, sparse, plus its residual if asked.
struct ReducedTensor {
  std::string name;
  uint64_t size = 0;
  std::vector<uint32_t> indices;  // ascending, < size
  std::vector<float> values;
  std::vector<float> residual;  // empty unless asked for
};

struct Reduced {
  std::vector<ReducedTensor> tensors;  // in request order
  uint64_t epoch = 0;
  int rank = 0;
  int world_size = 0;
  std::string algorithm;
  int teams = 0;
  double seconds = 0;  // the worker's time for the operation
  int rounds = 0;
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
};

class WorkerClient {
 public:
  // Does not wait for the worker: calls fail with Unavailable until it is up.
  static absl::StatusOr<std::unique_ptr<WorkerClient>> Connect(
      const std::string& address, const TlsFiles& tls);

  // Sums `tensors` across the workers for training step `step` (strictly
  // increasing; every worker gets the same steps and tensor shapes). On an
  // error the gradients stay in the worker's residuals.
  absl::StatusOr<Reduced> AllReduce(uint64_t step,
                                    const std::vector<Tensor>& tensors,
                                    bool return_residuals,
                                    absl::Duration timeout);

  absl::StatusOr<gradmesh::v1::StatusResponse> GetStatus(
      absl::Duration timeout);

 private:
  explicit WorkerClient(std::unique_ptr<gradmesh::v1::Worker::Stub> stub)
      : stub_(std::move(stub)) {}

  std::unique_ptr<gradmesh::v1::Worker::Stub> stub_;
};

}  // namespace gradmesh::client

#endif  // GRADMESH_CLIENT_WORKER_CLIENT_H_
