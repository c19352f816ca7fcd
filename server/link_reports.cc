#include "server/link_reports.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace gradmesh::server {

LinkReports::LinkReports(absl::Duration settle, absl::Duration quarantine)
    : settle_(settle), quarantine_(quarantine) {
  GM_CHECK(settle > absl::ZeroDuration() && quarantine > absl::ZeroDuration());
}

void LinkReports::Update(absl::string_view reporter,
                         const std::vector<std::string>& unreachable,
                         absl::Time now) {
  if (unreachable.empty()) {
    reports_.erase(reporter);
    return;
  }
  absl::flat_hash_map<std::string, absl::Time>& mine =
      reports_[std::string(reporter)];
  absl::flat_hash_map<std::string, absl::Time> listed;
  for (const std::string& peer : unreachable) {
    auto before = mine.find(peer);
    listed.emplace(peer, before == mine.end() ? now : before->second);
  }
  mine = std::move(listed);
}

void LinkReports::Forget(absl::string_view node_id) {
  reports_.erase(node_id);
  for (auto& [reporter, peers] : reports_) peers.erase(node_id);
}

std::optional<LinkReports::Verdict> LinkReports::Choose(
    const absl::flat_hash_set<std::string>& members, absl::Time now) const {
  std::map<std::string, std::vector<std::string>> reported;  // peer -> by
  absl::Time newest = absl::InfinitePast();
  for (const auto& [reporter, peers] : reports_) {
    if (!members.contains(reporter)) continue;
    for (const auto& [peer, since] : peers) {
      if (peer == reporter || !members.contains(peer)) continue;
      reported[peer].push_back(reporter);
      newest = std::max(newest, since);
    }
  }
  // Every report has stood for `settle`: no member still on its way to say
  // what it sees.
  if (reported.empty() || now - newest < settle_) return std::nullopt;
  std::optional<Verdict> chosen;
  for (auto& [peer, by] : reported) {  // node-id order: ties go to the last
    if (!chosen.has_value() || by.size() >= chosen->reporters.size()) {
      std::sort(by.begin(), by.end());
      chosen = Verdict{.node_id = peer, .reporters = by};
    }
  }
  return chosen;
}

absl::Duration LinkReports::KeepOut(const std::string& node_id,
                                    uint64_t incarnation, absl::Time now) {
  KeptOut& out = kept_out_[node_id];
  if (out.incarnation != incarnation) out = {.incarnation = incarnation};
  out.strikes = std::min(out.strikes + 1, 5);
  const absl::Duration length = quarantine_ * (1 << (out.strikes - 1));
  out.until = now + length;
  ++removals_[node_id];
  return length;
}

absl::Status LinkReports::MayJoin(absl::string_view node_id,
                                  uint64_t incarnation, absl::Time now) const {
  auto it = kept_out_.find(node_id);
  if (it == kept_out_.end() || it->second.incarnation != incarnation ||
      now >= it->second.until) {
    return absl::OkStatus();
  }
  return absl::UnavailableError(absl::StrFormat(
      "'%s' is kept out for %.1f s more: members could not reach it (a link "
      "that drops its packets); it may join again then",
      node_id, absl::ToDoubleSeconds(it->second.until - now)));
}

}  // namespace gradmesh::server
