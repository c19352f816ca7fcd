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

prometheus::Family<prometheus::Counter>& Counters(prometheus::Registry& r,
                                                  const char* name,
                                                  const char* help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(r);
}

prometheus::Family<prometheus::Gauge>& Gauges(prometheus::Registry& r,
                                              const char* name,
                                              const char* help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(r);
}

prometheus::Family<prometheus::Histogram>& Histograms(prometheus::Registry& r,
                                                      const char* name,
                                                      const char* help) {
  return prometheus::BuildHistogram().Name(name).Help(help).Register(r);
}

}  // namespace

WorkerMetrics::WorkerMetrics()
    : registry_(std::make_shared<prometheus::Registry>()) {
  prometheus::Registry& r = *registry_;
  operation_seconds_ = &Histograms(r, "gradmesh_worker_operation_seconds",
                                   "All-reduce latency, request to result");
  topk_seconds_ = &Histograms(r, "gradmesh_worker_topk_seconds",
                              "Top-k selection time per all-reduce");
  bytes_sent_ = &Counters(r, "gradmesh_worker_bytes_sent_total",
                          "Payload bytes sent, per peer node");
  bytes_received_ = &Counters(r, "gradmesh_worker_bytes_received_total",
                              "Payload bytes received, per peer node");
  nonzeros_ = &Gauges(r, "gradmesh_worker_nonzeros",
                      "Nonzeros after each phase of the last all-reduce");
  residual_norm_ = &Gauges(r, "gradmesh_worker_residual_norm",
                           "L2 norm of the residual, per buffer");
  operations_ = &Counters(r, "gradmesh_worker_operations_total",
                          "All-reduce requests by outcome (status code)");
  frames_dropped_ = &Counters(r, "gradmesh_worker_frames_dropped_total",
                              "Peer frames dropped, by reason");
  calls_refused_ = &Counters(r, "gradmesh_worker_calls_refused_total",
                             "Peer streams and calls refused, by reason");
  tensors_reduced_ = &Counters(
      r, "gradmesh_worker_tensors_reduced_total",
      "Tensors in the buckets of successful all-reduces, by fusion mode");
  tensors_missing_ = &Counters(
      r, "gradmesh_worker_tensors_missing_total",
      "Tensors with no entry in an all-reduce's result, by fusion mode");
  RegisterSingleSeries(r);
  StartSeriesAtZero();
}

void WorkerMetrics::RegisterSingleSeries(prometheus::Registry& r) {
  bsag_h_ = &Gauges(r, "gradmesh_worker_bsag_h",
                    "h of SparDL's B-SAG in the last all-reduce")
                 .Add({});
  teams_ = &Gauges(r, "gradmesh_worker_teams", "SparDL's d in the current plan")
                .Add({});
  epoch_ = &Gauges(r, "gradmesh_worker_epoch", "Current view epoch").Add({});
  rank_ = &Gauges(r, "gradmesh_worker_rank",
                  "Rank in the current view (-1: not a member)")
               .Add({});
  world_size_ =
      &Gauges(r, "gradmesh_worker_world_size", "Members of the current view")
           .Add({});
  peer_channels_ = &Gauges(r, "gradmesh_worker_peer_channels",
                           "gRPC channels kept to peers and the coordinator")
                        .Add({});
  unreachable_peers_ =
      &Gauges(r, "gradmesh_worker_unreachable_peers",
              "Members this worker reports it cannot reach (frames to them "
              "unacknowledged, or connections refused, for "
              "--link_timeout_s)")
           .Add({});
  late_views_ = &Counters(r, "gradmesh_worker_late_views_total",
                          "Plan changes that arrived after their start step")
                     .Add({});
  mismatches_ = &Counters(r, "gradmesh_worker_result_mismatches_total",
                          "Steps refused by the members because their "
                          "results differed")
                     .Add({});
  unresolved_ = &Counters(r, "gradmesh_worker_steps_in_doubt_total",
                          "Steps whose outcome on the other members could "
                          "not be learned (answered DataLoss)")
                     .Add({});
  retries_ = &Counters(r, "gradmesh_worker_step_retries_total",
                       "Steps run again on a new view after membership "
                       "changed under them")
                  .Add({});
  dense_ring_model_bytes_ =
      &Counters(r, "gradmesh_worker_dense_ring_model_bytes_total",
                "Bytes a dense ring all-reduce of the same successful "
                "all-reduces would move, by its cost formula (not measured)")
           .Add({});
}

void WorkerMetrics::StartSeriesAtZero() {
  // Every outcome and refusal starts at 0, so that rates and alerts over
  // them have a series before the first error.
  for (int code = 0; code <= 16; ++code) {
    operations(absl::StatusCodeToString(static_cast<absl::StatusCode>(code)));
  }
  operations_ok_ = &operations(absl::StatusCodeToString(absl::StatusCode::kOk));
  for (const char* reason : {"malformed", "limits", "identity", "token"}) {
    calls_refused(reason);
  }
  for (const char* reason :
       {"old_epoch", "retired_operation", "unclaimed_operation"}) {
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
