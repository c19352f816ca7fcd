#include "worker/daemon/client_leases.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace gradmesh::daemon {

ClientLeases::ClientLeases(
    absl::Duration grace,
    std::function<void(const std::string& client_id)> expire)
    : grace_(grace), expire_(std::move(expire)) {
  if (grace_ > absl::ZeroDuration()) thread_ = std::thread([this] { Loop(); });
}

ClientLeases::~ClientLeases() { Stop(); }

absl::Status ClientLeases::Attach(const std::string& client_id) {
  if (grace_ <= absl::ZeroDuration()) return absl::OkStatus();  // no expiry
  absl::MutexLock lock(&mu_);
  int& streams = leases_[client_id].streams;
  if (streams >= kMaxStreams) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "client ", client_id, " holds ", streams, " Attach streams already"));
  }
  ++streams;
  return absl::OkStatus();
}

void ClientLeases::Detach(const std::string& client_id) {
  {
    absl::MutexLock lock(&mu_);
    auto it = leases_.find(client_id);
    if (it == leases_.end() || --it->second.streams > 0) return;
    it->second.detached = SteadyNow();
  }
  wake_.Notify();
}

void ClientLeases::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  wake_.Notify();
  if (thread_.joinable()) thread_.join();
}

absl::Duration ClientLeases::TakeExpired(std::vector<std::string>* expired) {
  const absl::Time now = SteadyNow();
  absl::Duration next = absl::InfiniteDuration();
  for (auto it = leases_.begin(); it != leases_.end();) {
    const Lease& lease = it->second;
    if (lease.streams > 0) {
      ++it;
      continue;
    }
    const absl::Duration left = lease.detached + grace_ - now;
    if (left > absl::ZeroDuration()) {
      next = std::min(next, left);
      ++it;
      continue;
    }
    expired->push_back(it->first);
    it = leases_.erase(it);
  }
  return next;
}

void ClientLeases::Loop() {
  while (true) {
    std::vector<std::string> expired;
    absl::Duration next;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      next = TakeExpired(&expired);
    }
    for (const std::string& client_id : expired) expire_(client_id);
    // A Detach or Stop in between has notified: the wait returns at once.
    wake_.WaitFor(std::min(next, absl::Hours(1)));
  }
}

}  // namespace gradmesh::daemon
