#include "worker/transport/loopback.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/steady_clock.h"

namespace gradmesh::transport {

std::string ToString(const Tag& tag) {
  return absl::StrCat("epoch ", tag.epoch, " op ", tag.operation, " step ",
                      tag.step);
}

class LoopbackNetwork::Endpoint : public Transport {
 public:
  Endpoint(LoopbackNetwork* net, int rank) : net_(net), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return net_->size(); }

  absl::Status Send(int peer, const Tag& tag, std::string payload) override {
    GM_CHECK(peer >= 0 && peer < size() && peer != rank_) << "peer " << peer;
    absl::MutexLock lock(&net_->mu_);
    GM_RETURN_IF_ERROR(net_->aborted_[rank_]);
    Counters& mine = net_->counters_[rank_];
    ++mine.messages_sent;
    mine.bytes_sent += payload.size();
    mine.bytes_sent_to[peer] += payload.size();
    Inbox& theirs = net_->inboxes_[peer];
    const OperationKey op(tag.epoch, tag.operation);
    if (theirs.ended.contains(op)) return absl::OkStatus();
    theirs.mailboxes[MessageKey{rank_, tag}].push_back(std::move(payload));
    if (!theirs.started.contains(op)) {
      theirs.unclaimed_since.try_emplace(op, SteadyNow());
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> Recv(int peer, const Tag& tag,
                                   absl::Time deadline) override {
    GM_CHECK(peer >= 0 && peer < size() && peer != rank_) << "peer " << peer;
    const MessageKey key{peer, tag};
    absl::MutexLock lock(&net_->mu_);
    Inbox& inbox = net_->inboxes_[rank_];
    const OperationKey op(tag.epoch, tag.operation);
    if (!inbox.ended.contains(op)) inbox.started.insert(op);
    inbox.unclaimed_since.erase(op);
    auto& mailboxes = inbox.mailboxes;
    auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(net_->mu_) {
      if (!net_->aborted_[rank_].ok() || !net_->aborted_[peer].ok()) {
        return true;
      }
      auto it = mailboxes.find(key);
      return it != mailboxes.end() && !it->second.empty();
    };
    net_->mu_.AwaitWithDeadline(absl::Condition(&ready), deadline);
    GM_RETURN_IF_ERROR(net_->aborted_[rank_]);
    auto it = mailboxes.find(key);
    if (it == mailboxes.end() || it->second.empty()) {
      if (!net_->aborted_[peer].ok()) {
        return absl::UnavailableError(
            absl::StrCat("rank ", rank_, ": peer ", peer, " is gone (",
                         net_->aborted_[peer].message(), ") while waiting for ",
                         ToString(tag)));
      }
      return absl::DeadlineExceededError(
          absl::StrCat("rank ", rank_, ": no message from peer ", peer, " for ",
                       ToString(tag), " before the deadline"));
    }
    std::string payload = std::move(it->second.front());
    it->second.pop_front();
    if (it->second.empty()) mailboxes.erase(it);
    Counters& mine = net_->counters_[rank_];
    ++mine.messages_received;
    mine.bytes_received += payload.size();
    mine.bytes_received_from[peer] += payload.size();
    return payload;
  }

  void Abort(const absl::Status& status) override {
    GM_CHECK(!status.ok());
    absl::MutexLock lock(&net_->mu_);
    if (net_->aborted_[rank_].ok()) net_->aborted_[rank_] = status;
  }

  void EndOperation(uint64_t epoch, uint64_t operation) override {
    absl::MutexLock lock(&net_->mu_);
    Inbox& mine = net_->inboxes_[rank_];
    const OperationKey op(epoch, operation);
    mine.started.erase(op);
    mine.unclaimed_since.erase(op);
    if (!mine.ended.insert(op).second) return;
    mine.ended_order.push_back(op);
    if (mine.ended_order.size() > kEndedOperationsKept) {
      mine.ended.erase(mine.ended_order.front());
      mine.ended_order.pop_front();
    }
    absl::erase_if(mine.mailboxes, [&](const auto& m) {
      return m.first.tag.epoch == epoch && m.first.tag.operation == operation;
    });
  }

  Counters counters() const override {
    absl::MutexLock lock(&net_->mu_);
    return net_->counters_[rank_];
  }

  std::optional<absl::Time> UnclaimedSince(uint64_t epoch,
                                           uint64_t operation) const override {
    absl::MutexLock lock(&net_->mu_);
    const Inbox& mine = net_->inboxes_[rank_];
    auto it = mine.unclaimed_since.find(OperationKey(epoch, operation));
    if (it == mine.unclaimed_since.end()) return std::nullopt;
    return it->second;
  }

 private:
  LoopbackNetwork* const net_;
  const int rank_;
};

LoopbackNetwork::LoopbackNetwork(int size) {
  GM_CHECK(size >= 1) << "size " << size;
  aborted_.assign(size, absl::OkStatus());
  inboxes_.resize(size);
  counters_.resize(size);
  for (Counters& c : counters_) {
    c.bytes_sent_to.assign(size, 0);
    c.bytes_received_from.assign(size, 0);
  }
  for (int r = 0; r < size; ++r) {
    endpoints_.push_back(std::make_unique<Endpoint>(this, r));
  }
}

LoopbackNetwork::~LoopbackNetwork() = default;

Transport* LoopbackNetwork::endpoint(int rank) const {
  GM_CHECK(rank >= 0 && rank < size()) << "rank " << rank;
  return endpoints_[rank].get();
}

}  // namespace gradmesh::transport
