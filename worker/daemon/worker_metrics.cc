#include "worker/daemon/worker_metrics.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace gradmesh::daemon {

namespace {

// 100 us .. about 100 s, doubling.
prometheus::Histogram::BucketBoundaries SecondsBuckets() {
  prometheus::Histogram::BucketBoundaries bounds;
  for (double b = 1e-4; b < 120; b *= 2) bounds.push_back(b);
  return bounds;
}

}  // namespace

WorkerMetrics::WorkerMetrics()
    : registry_(std::make_shared<prometheus::Registry>()) {
  using prometheus::BuildCounter;
  using prometheus::BuildGauge;
  using prometheus::BuildHistogram;
  prometheus::Registry& r = *registry_;
  operation_seconds_ = &BuildHistogram()
                            .Name("gradmesh_worker_operation_seconds")
                            .Help("All-reduce latency, request to result")
                            .Register(r);
  topk_seconds_ = &BuildHistogram()
                       .Name("gradmesh_worker_topk_seconds")
                       .Help("Top-k selection time per all-reduce")
                       .Register(r);
  bytes_sent_ = &BuildCounter()
                     .Name("gradmesh_worker_bytes_sent_total")
                     .Help("Payload bytes sent, per peer node")
                     .Register(r);
  bytes_received_ = &BuildCounter()
                         .Name("gradmesh_worker_bytes_received_total")
                         .Help("Payload bytes received, per peer node")
                         .Register(r);
  nonzeros_ = &BuildGauge()
                   .Name("gradmesh_worker_nonzeros")
                   .Help("Nonzeros after each phase of the last all-reduce")
                   .Register(r);
  residual_norm_ = &BuildGauge()
                        .Name("gradmesh_worker_residual_norm")
                        .Help("L2 norm of the residual, per buffer")
                        .Register(r);
  operations_ = &BuildCounter()
                     .Name("gradmesh_worker_operations_total")
                     .Help("All-reduce requests by outcome (status code)")
                     .Register(r);
  frames_dropped_ = &BuildCounter()
                         .Name("gradmesh_worker_frames_dropped_total")
                         .Help("Peer frames dropped, by reason")
                         .Register(r);
  calls_refused_ = &BuildCounter()
                        .Name("gradmesh_worker_calls_refused_total")
                        .Help("Peer streams and calls refused, by reason")
                        .Register(r);
  tensors_reduced_ = &BuildCounter()
                          .Name("gradmesh_worker_tensors_reduced_total")
                          .Help(
                              "Tensors in the buckets of successful "
                              "all-reduces, by fusion mode")
                          .Register(r);
  tensors_missing_ = &BuildCounter()
                          .Name("gradmesh_worker_tensors_missing_total")
                          .Help(
                              "Tensors with no entry in an all-reduce's "
                              "result, by fusion mode")
                          .Register(r);
  bsag_h_ = &BuildGauge()
                 .Name("gradmesh_worker_bsag_h")
                 .Help("h of SparDL's B-SAG in the last all-reduce")
                 .Register(r)
                 .Add({});
  teams_ = &BuildGauge()
                .Name("gradmesh_worker_teams")
                .Help("SparDL's d in the current plan")
                .Register(r)
                .Add({});
  epoch_ = &BuildGauge()
                .Name("gradmesh_worker_epoch")
                .Help("Current view epoch")
                .Register(r)
                .Add({});
  rank_ = &BuildGauge()
               .Name("gradmesh_worker_rank")
               .Help("Rank in the current view (-1: not a member)")
               .Register(r)
               .Add({});
  world_size_ = &BuildGauge()
                     .Name("gradmesh_worker_world_size")
                     .Help("Members of the current view")
                     .Register(r)
                     .Add({});
  late_views_ = &BuildCounter()
                     .Name("gradmesh_worker_late_views_total")
                     .Help("Plan changes that arrived after their start step")
                     .Register(r)
                     .Add({});
  mismatches_ = &BuildCounter()
                     .Name("gradmesh_worker_result_mismatches_total")
                     .Help(
                         "Steps refused by the members because their "
                         "results differed")
                     .Register(r)
                     .Add({});
  unresolved_ = &BuildCounter()
                     .Name("gradmesh_worker_steps_in_doubt_total")
                     .Help(
                         "Steps whose outcome on the other members could "
                         "not be learned (answered DataLoss)")
                     .Register(r)
                     .Add({});
  retries_ = &BuildCounter()
                  .Name("gradmesh_worker_step_retries_total")
                  .Help(
                      "Steps run again on a new view after membership "
                      "changed under them")
                  .Register(r)
                  .Add({});
  dense_ring_model_bytes_ =
      &BuildCounter()
           .Name("gradmesh_worker_dense_ring_model_bytes_total")
           .Help(
               "Bytes a dense ring all-reduce of the same "
               "successful all-reduces would move, by its "
               "cost formula (not measured)")
           .Register(r)
           .Add({});
  // Every outcome and refusal starts at 0, so that rates and alerts over
  // them have a series before the first error.
  for (int code = 0; code <= 16; ++code) {
    operations(absl::StatusCodeToString(static_cast<absl::StatusCode>(code)));
  }
  operations_ok_ = &operations(absl::StatusCodeToString(absl::StatusCode::kOk));
  for (const char* reason : {"malformed", "limits", "identity", "token"}) {
    calls_refused(reason);
  }
  for (const char* reason : {"old_epoch", "retired_operation"}) {
    frames_dropped(reason);
  }
}

absl::StatusOr<std::unique_ptr<WorkerMetrics>> WorkerMetrics::Create(
    const std::string& listen, std::function<void()> refresh) {
  std::unique_ptr<WorkerMetrics> metrics(new WorkerMetrics());
  if (listen.empty()) return metrics;
  auto endpoint =
      MetricsEndpoint::Start(listen, metrics->registry_, std::move(refresh));
  if (!endpoint.ok()) return endpoint.status();
  metrics->endpoint_ = *std::move(endpoint);
  return metrics;
}

prometheus::Histogram& WorkerMetrics::operation_seconds(
    const std::string& algorithm) {
  return operation_seconds_->Add({{"algorithm", algorithm}}, SecondsBuckets());
}
prometheus::Histogram& WorkerMetrics::topk_seconds(
    const std::string& algorithm) {
  return topk_seconds_->Add({{"algorithm", algorithm}}, SecondsBuckets());
}
prometheus::Counter& WorkerMetrics::bytes_sent(const std::string& peer) {
  return bytes_sent_->Add({{"peer", peer}});
}
prometheus::Counter& WorkerMetrics::bytes_received(const std::string& peer) {
  return bytes_received_->Add({{"peer", peer}});
}
prometheus::Gauge& WorkerMetrics::nonzeros(const std::string& phase) {
  return nonzeros_->Add({{"phase", phase}});
}
prometheus::Gauge& WorkerMetrics::residual_norm(const std::string& buffer) {
  return residual_norm_->Add({{"buffer", buffer}});
}
void WorkerMetrics::SetResidualNorms(
    const std::vector<std::pair<std::string, double>>& norms) {
  absl::MutexLock lock(&norms_mu_);
  std::vector<std::string> now;
  for (const auto& [buffer, norm] : norms) {
    if (norm >= 0) residual_norm(buffer).Set(norm);
    now.push_back(buffer);
  }
  for (const std::string& old : norm_buffers_) {
    if (std::find(now.begin(), now.end(), old) == now.end()) {
      residual_norm_->Remove(&residual_norm(old));
    }
  }
  norm_buffers_ = std::move(now);
}

prometheus::Counter& WorkerMetrics::operations(const std::string& code) {
  return operations_->Add({{"code", code}});
}
prometheus::Counter& WorkerMetrics::frames_dropped(const std::string& reason) {
  return frames_dropped_->Add({{"reason", reason}});
}
prometheus::Counter& WorkerMetrics::calls_refused(const std::string& reason) {
  return calls_refused_->Add({{"reason", reason}});
}
prometheus::Counter& WorkerMetrics::tensors_reduced(const std::string& fusion) {
  return tensors_reduced_->Add({{"fusion", fusion}});
}
prometheus::Counter& WorkerMetrics::tensors_missing(const std::string& fusion) {
  return tensors_missing_->Add({{"fusion", fusion}});
}

}  // namespace gradmesh::daemon
