#include "worker/transport/simulated.h"

#include <algorithm>
#include <string>
#include <utility>

#include "common/status_macros.h"

namespace gradmesh::transport {

class SimulatedNetwork::Endpoint : public Transport {
 public:
  Endpoint(SimulatedNetwork* net, int rank)
      : net_(net), rank_(rank), inner_(net->loopback_.endpoint(rank)) {}

  int rank() const override { return rank_; }
  int size() const override { return net_->size(); }

  absl::Status Send(int peer, const Tag& tag, std::string payload) override {
    net_->Charge(rank_);
    const MessageKey key{rank_, tag};
    if (!net_->PushArrival(peer, key, net_->Depart(rank_, payload.size()))) {
      return absl::OkStatus();  // the receiver ended the operation
    }
    absl::Status status = inner_->Send(peer, tag, std::move(payload));
    if (!status.ok()) net_->DropLastArrival(peer, key);  // never delivered
    return status;
  }

  absl::StatusOr<std::string> Recv(int peer, const Tag& tag,
                                   absl::Time deadline) override {
    net_->Charge(rank_);
    absl::StatusOr<std::string> payload = inner_->Recv(peer, tag, deadline);
    if (payload.ok()) {
      Clock& clock = net_->clocks_[rank_];
      clock.now = std::max(clock.now, net_->PopArrival(rank_, {peer, tag}));
    }
    return payload;
  }

  void Abort(const absl::Status& status) override { inner_->Abort(status); }

  void EndOperation(uint64_t epoch, uint64_t operation) override {
    net_->EndArrivals(rank_, epoch, operation);
    inner_->EndOperation(epoch, operation);
  }

  Counters counters() const override { return inner_->counters(); }

 private:
  SimulatedNetwork* const net_;
  const int rank_;
  Transport* const inner_;
};

SimulatedNetwork::SimulatedNetwork(int size, const SimOptions& options)
    : options_(options),
      loopback_(size),
      clocks_(size),
      arrivals_(size),
      ended_(size) {
  GM_CHECK(options.scale >= 1) << "scale " << options.scale;
  for (int r = 0; r < size; ++r) {
    endpoints_.push_back(std::make_unique<Endpoint>(this, r));
  }
}

SimulatedNetwork::~SimulatedNetwork() = default;

Transport* SimulatedNetwork::endpoint(int rank) const {
  GM_CHECK(rank >= 0 && rank < size()) << "rank " << rank;
  return endpoints_[rank].get();
}

void SimulatedNetwork::Start(int rank) {
  GM_CHECK(rank >= 0 && rank < size()) << "rank " << rank;
  clocks_[rank] = {.seen = ThreadWork()};
}

SimTimes SimulatedNetwork::Finish(int rank) {
  GM_CHECK(rank >= 0 && rank < size()) << "rank " << rank;
  Charge(rank);
  return {.seconds = clocks_[rank].now,
          .compute_seconds = clocks_[rank].compute};
}

void SimulatedNetwork::Charge(int rank) {
  Clock& clock = clocks_[rank];
  const WorkCount now = ThreadWork();
  const double seconds =
      options_.scale *
      (static_cast<double>(now.selected - clock.seen.selected) *
           options_.compute.select_s_per_value +
       static_cast<double>(now.merged - clock.seen.merged) *
           options_.compute.merge_s_per_value +
       static_cast<double>(now.accumulated - clock.seen.accumulated) *
           options_.compute.accumulate_s_per_value);
  clock.now += seconds;
  clock.compute += seconds;
  clock.seen = now;
}

double SimulatedNetwork::Depart(int from, uint64_t bytes) {
  Clock& clock = clocks_[from];
  clock.link_free = std::max(clock.now, clock.link_free) +
                    options_.scale * static_cast<double>(bytes) *
                        options_.link.beta_s_per_byte;
  return clock.link_free + options_.link.alpha_s;
}

bool SimulatedNetwork::PushArrival(int to, const MessageKey& key,
                                   double arrival) {
  absl::MutexLock lock(&mu_);
  if (ended_[to].ids.contains(std::pair(key.tag.epoch, key.tag.operation))) {
    return false;
  }
  arrivals_[to][key].push_back(arrival);
  return true;
}

void SimulatedNetwork::DropLastArrival(int to, const MessageKey& key) {
  absl::MutexLock lock(&mu_);
  auto it = arrivals_[to].find(key);
  // (Gone already if the receiver ended the operation meanwhile.)
  if (it == arrivals_[to].end()) return;
  it->second.pop_back();
  if (it->second.empty()) arrivals_[to].erase(it);
}

double SimulatedNetwork::PopArrival(int to, const MessageKey& key) {
  absl::MutexLock lock(&mu_);
  auto it = arrivals_[to].find(key);
  GM_CHECK(it != arrivals_[to].end() && !it->second.empty())
      << "a message without its arrival time";
  const double arrival = it->second.front();
  it->second.pop_front();
  if (it->second.empty()) arrivals_[to].erase(it);
  return arrival;
}

void SimulatedNetwork::EndArrivals(int to, uint64_t epoch, uint64_t operation) {
  absl::MutexLock lock(&mu_);
  Ended& ended = ended_[to];
  if (ended.ids.insert(std::pair(epoch, operation)).second) {
    ended.order.emplace_back(epoch, operation);
    if (ended.order.size() > Transport::kEndedOperationsKept) {
      ended.ids.erase(ended.order.front());
      ended.order.pop_front();
    }
  }
  absl::erase_if(arrivals_[to], [&](const auto& a) {
    return a.first.tag.epoch == epoch && a.first.tag.operation == operation;
  });
}

}  // namespace gradmesh::transport
