// The worker's Prometheus series, served at /metrics (prometheus-cpp).
//
//   gradmesh_worker_operation_seconds{algorithm}        histogram
//   gradmesh_worker_topk_seconds{algorithm}             histogram
//   gradmesh_worker_bytes_sent_total{peer}              counter (payload)
//   gradmesh_worker_bytes_received_total{peer}          counter (payload)
//   gradmesh_worker_dense_ring_model_bytes_total        counter: what a dense
//       ring all-reduce of the same all-reduces would move, by the dense
//       entry's cost formula (collectives/registry.h), not measured
//   gradmesh_worker_nonzeros{phase}                     gauge: srs, sag, result
//   gradmesh_worker_residual_norm{buffer}               gauge (L2, at scrape)
//   gradmesh_worker_bsag_h                              gauge (B-SAG's h)
//   gradmesh_worker_teams / _epoch / _rank / _world_size gauges
//   gradmesh_worker_operations_total{code}              counter (OK or error;
//       every code's series exists from the start, at 0)
//   gradmesh_worker_frames_dropped_total{reason}        counter: frames of
//       an old_epoch or a retired_operation; for unclaimed_operation,
//       messages dropped for a peer's budget (--peer_buffer_mib)
//   gradmesh_worker_calls_refused_total{reason}         counter: peer streams
//       and calls refused: malformed, limits (held epochs' bounds, a peer's
//       streams or budget), identity
//       (a certificate not naming the member's host), token (SDK over TCP)
//   gradmesh_worker_peer_channels                       gauge: channels kept
//       (to the newest view's members, and the coordinator)
//   gradmesh_worker_unreachable_peers                   gauge: members this
//       worker reports it cannot reach (frames unacknowledged, or
//       connections refused, for --link_timeout_s)
//   gradmesh_worker_late_views_total                    counter
//   gradmesh_worker_step_retries_total                  counter: steps run
//       again on a new view after membership changed under them
//   gradmesh_worker_steps_in_doubt_total                counter: steps whose
//       outcome on the other members could not be learned (DataLoss)
//   gradmesh_worker_result_mismatches_total             counter: steps the
//       members refused because their results differed
//   gradmesh_worker_tensors_reduced_total{fusion}       counter: tensors in
//   gradmesh_worker_tensors_missing_total{fusion}       counter: with no entry
//       in the result (fusion: per_tensor where the algorithm split its
//       selections per tensor, else after_fusion); the
//       tensor-missing rate is rate(missing) / rate(reduced)
//
// Thread-safe (prometheus-cpp's metrics are).
#ifndef GRADMESH_WORKER_DAEMON_WORKER_METRICS_H_
#define GRADMESH_WORKER_DAEMON_WORKER_METRICS_H_

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics/metrics_endpoint.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace gradmesh::daemon {

class WorkerMetrics {
 public:
  // Serves /metrics on `listen` (host:port, port 0 picks one), calling
  // `refresh` before each scrape; empty: the series are kept but not served.
  static absl::StatusOr<std::unique_ptr<WorkerMetrics>> Create(
      const std::string& listen, std::function<void()> refresh);

  int port() const { return endpoint_ == nullptr ? 0 : endpoint_->port(); }

  // Stops serving (and refreshing); the series stay.
  void StopServing() { endpoint_.reset(); }

  prometheus::Histogram& operation_seconds(const std::string& algorithm);
  prometheus::Histogram& topk_seconds(const std::string& algorithm);
  prometheus::Counter& bytes_sent(const std::string& peer);
  prometheus::Counter& bytes_received(const std::string& peer);
  prometheus::Gauge& nonzeros(const std::string& phase);
  prometheus::Gauge& residual_norm(const std::string& buffer);
  // Sets the residual norms of the buckets registered now (a negative norm:
  // busy, keep the last figure); buckets gone since the last call lose
  // their series.
  void SetResidualNorms(
      const std::vector<std::pair<std::string, double>>& norms);
  prometheus::Counter& operations(const std::string& code);
  prometheus::Counter& frames_dropped(const std::string& reason);
  prometheus::Counter& calls_refused(const std::string& reason);
  prometheus::Counter& tensors_reduced(const std::string& fusion);
  prometheus::Counter& tensors_missing(const std::string& fusion);
  prometheus::Gauge& bsag_h() { return *bsag_h_; }
  prometheus::Gauge& teams() { return *teams_; }
  prometheus::Gauge& epoch() { return *epoch_; }
  prometheus::Gauge& rank() { return *rank_; }
  prometheus::Gauge& world_size() { return *world_size_; }
  prometheus::Gauge& peer_channels() { return *peer_channels_; }
  prometheus::Gauge& unreachable_peers() { return *unreachable_peers_; }
  prometheus::Counter& late_views() { return *late_views_; }
  prometheus::Counter& retries() { return *retries_; }
  prometheus::Counter& unresolved() { return *unresolved_; }
  prometheus::Counter& mismatches() { return *mismatches_; }
  prometheus::Counter& dense_ring_model_bytes() {
    return *dense_ring_model_bytes_;
  }
  prometheus::Counter& operations_ok() { return *operations_ok_; }

 private:
  WorkerMetrics();
  // The families of one series each (gauges and counters of the worker).
  void RegisterSingleSeries(prometheus::Registry& r);
  // Every outcome and refusal, so that they have a series before the first.
  void StartSeriesAtZero();

  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Histogram>* operation_seconds_;
  prometheus::Family<prometheus::Histogram>* topk_seconds_;
  prometheus::Family<prometheus::Counter>* bytes_sent_;
  prometheus::Family<prometheus::Counter>* bytes_received_;
  prometheus::Family<prometheus::Gauge>* nonzeros_;
  prometheus::Family<prometheus::Gauge>* residual_norm_;
  prometheus::Family<prometheus::Counter>* operations_;
  prometheus::Family<prometheus::Counter>* frames_dropped_;
  prometheus::Family<prometheus::Counter>* calls_refused_;
  prometheus::Family<prometheus::Counter>* tensors_reduced_;
  prometheus::Family<prometheus::Counter>* tensors_missing_;
  prometheus::Gauge* bsag_h_;
  prometheus::Gauge* teams_;
  prometheus::Gauge* epoch_;
  prometheus::Gauge* rank_;
  prometheus::Gauge* world_size_;
  prometheus::Gauge* peer_channels_;
  prometheus::Gauge* unreachable_peers_;
  prometheus::Counter* late_views_;
  prometheus::Counter* retries_;
  prometheus::Counter* unresolved_;
  prometheus::Counter* mismatches_;
  prometheus::Counter* dense_ring_model_bytes_;
  prometheus::Counter* operations_ok_;  // operations("OK"), per success
  absl::Mutex norms_mu_;
  std::vector<std::string> norm_buffers_ ABSL_GUARDED_BY(norms_mu_);
  // Last, so destroyed first: a scrape's refresh in progress, which the
  // endpoint's destruction waits for, finds every other member alive.
  std::unique_ptr<MetricsEndpoint> endpoint_;
};

}  // namespace gradmesh::daemon

#endif  // GRADMESH_WORKER_DAEMON_WORKER_METRICS_H_
