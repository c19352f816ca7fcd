#include "worker/daemon/step_recorder.h"

#include <string>

#include "worker/daemon/worker_metrics.h"

namespace gradmesh::daemon {

void StepRecorder::Record(const ReduceResult& result, const Group& group,
                          bool per_tensor_quota) {
  if (metrics_ == nullptr) return;
  WorkerMetrics& m = *metrics_;
  const std::string fusion = per_tensor_quota ? "per_tensor" : "after_fusion";
  m.tensors_reduced(fusion).Increment(static_cast<double>(result.tensors));
  m.tensors_missing(fusion).Increment(
      static_cast<double>(result.tensors_missing));
  const collectives::OpStats& stats = result.stats;
  const std::string& algorithm = result.plan.algorithm;
  m.operations_ok().Increment();
  m.operation_seconds(algorithm).Observe(result.seconds);
  // The yardstick: the dense ring's cost formula for the same values.
  m.dense_ring_model_bytes().Increment(
      engine::DenseRingModelBytes(group.size(), result.values));
  m.topk_seconds(algorithm).Observe(stats.topk_seconds);
  RecordTraffic(group);
  const collectives::OpFigures& figures = stats.figures;
  if (figures.srs_nonzeros) {
    m.nonzeros("srs").Set(static_cast<double>(*figures.srs_nonzeros));
  }
  if (figures.sag_nonzeros) {
    m.nonzeros("sag").Set(static_cast<double>(*figures.sag_nonzeros));
  }
  m.nonzeros("result").Set(static_cast<double>(stats.result_nonzeros));
  if (figures.bsag_h) m.bsag_h().Set(static_cast<double>(*figures.bsag_h));
  m.teams().Set(result.plan.teams);
  m.rank().Set(group.rank);
  m.world_size().Set(group.size());
}

void StepRecorder::RecordTraffic(const Group& group) {
  // What the group's transport counted since the last record, so that
  // buckets running at once are not counted twice.
  absl::MutexLock lock(&mu_);
  if (epoch_ != group.view.epoch) {
    epoch_ = group.view.epoch;
    counted_ = transport::Counters{};
    counted_.bytes_sent_to.assign(group.size(), 0);
    counted_.bytes_received_from.assign(group.size(), 0);
  }
  const transport::Counters now = group.transport->counters();
  for (int p = 0; p < group.size(); ++p) {
    const std::string& peer = group.view.member_ids[p];
    metrics_->bytes_sent(peer).Increment(
        static_cast<double>(now.bytes_sent_to[p] - counted_.bytes_sent_to[p]));
    metrics_->bytes_received(peer).Increment(static_cast<double>(
        now.bytes_received_from[p] - counted_.bytes_received_from[p]));
  }
  counted_ = now;
}

}  // namespace gradmesh::daemon
