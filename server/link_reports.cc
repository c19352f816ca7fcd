#include "server/link_reports.h"

#include <algorithm>
#include <tuple>

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

void LinkReports::ForgetReports() { reports_.clear(); }

void LinkReports::Excuse(absl::Duration unobserved, absl::Time now) {
  for (auto& [reporter, peers] : reports_) {
    for (auto& [peer, since] : peers) since = std::min(since + unobserved, now);
  }
}

std::optional<LinkReports::Verdict> LinkReports::Choose(
    const absl::flat_hash_set<std::string>& members, absl::Time now) const {
  if (members.size() < 2) return std::nullopt;
  const size_t others = members.size() - 1;
  std::map<std::string, std::vector<std::string>> named;  // peer -> by
  absl::flat_hash_set<std::string> reporting;
  absl::Time newest = absl::InfinitePast();
  absl::Time oldest = absl::InfiniteFuture();
  for (const auto& [reporter, peers] : reports_) {
    if (!members.contains(reporter)) continue;
    std::vector<std::string> names;
    for (const auto& [peer, since] : peers) {
      if (peer == reporter || !members.contains(peer)) continue;
      names.push_back(peer);
      newest = std::max(newest, since);
      oldest = std::min(oldest, since);
    }
    if (names.empty()) continue;
    reporting.insert(reporter);
    if (members.size() > 2 && 2 * names.size() > others) continue;
    for (std::string& peer : names) named[peer].push_back(reporter);
  }
  // Every report has stood `settle` (or the oldest twice that, so that a
  // stream of new reports cannot put the choice off for ever).
  if (reporting.empty() ||
      (now - newest < settle_ && now - oldest < 2 * settle_)) {
    return std::nullopt;
  }
  // The most named; then one that reports others; then the last node id.
  std::optional<Verdict> chosen;
  auto rank = [&](const std::string& id, size_t votes) {
    return std::tuple(votes, reporting.contains(id), id);
  };
  for (auto& [peer, by] : named) {
    if (!chosen.has_value() ||
        rank(peer, by.size()) >
            rank(chosen->node_id, chosen->reporters.size())) {
      std::sort(by.begin(), by.end());
      chosen = Verdict{.node_id = peer, .reporters = by};
    }
  }
  return chosen;
}

absl::Duration LinkReports::KeepOut(const std::string& node_id,
                                    absl::Time now) {
  KeptOut& out = kept_out_[node_id];
  if (!OnProbation(node_id, now)) out.strikes = 0;
  out.strikes = std::min(out.strikes + 1, kMaxStrikes);
  out.length = quarantine_ * (1 << (out.strikes - 1));
  out.until = now + out.length;
  return out.length;
}

bool LinkReports::OnProbation(absl::string_view node_id, absl::Time now) const {
  auto it = kept_out_.find(node_id);
  return it != kept_out_.end() && it->second.strikes > 0 &&
         now - it->second.until <= 16 * quarantine_;
}

std::vector<LinkReports::Quarantine> LinkReports::Quarantines(
    absl::Time now) const {
  std::vector<Quarantine> out;
  for (const auto& [node_id, kept] : kept_out_) {
    if (now < kept.until) {
      out.push_back(
          {.node_id = node_id, .length = kept.length, .strikes = kept.strikes});
    } else if (OnProbation(node_id, now)) {
      out.push_back({.node_id = node_id,
                     .length = absl::ZeroDuration(),
                     .strikes = kept.strikes});
    }
  }
  std::sort(out.begin(), out.end(),
            [](const Quarantine& a, const Quarantine& b) {
              return a.node_id < b.node_id;
            });
  return out;
}

void LinkReports::Adopt(const Quarantine& q, absl::Time now) {
  if (q.node_id.empty()) return;
  const absl::Duration length = std::clamp(
      q.length, absl::ZeroDuration(), quarantine_ * (1 << (kMaxStrikes - 1)));
  const int strikes = std::clamp(q.strikes, 1, kMaxStrikes);
  if (length <= absl::ZeroDuration()) {
    // Back already, on probation from now (unless kept out or on it here).
    if (!OnProbation(q.node_id, now)) {
      kept_out_[q.node_id] = {
          .until = now, .length = quarantine_, .strikes = strikes};
    }
    return;
  }
  KeptOut& out = kept_out_[q.node_id];
  if (now + length <= out.until) return;
  out.until = now + length;
  out.length = length;
  out.strikes = strikes;
}

absl::Status LinkReports::MayJoin(absl::string_view node_id,
                                  absl::Time now) const {
  auto it = kept_out_.find(node_id);
  if (it == kept_out_.end() || now >= it->second.until) {
    return absl::OkStatus();
  }
  return absl::UnavailableError(absl::StrFormat(
      "'%s' was removed because members could not reach it (a link that "
      "drops its packets), and is kept out for %.0f s from then",
      node_id, absl::ToDoubleSeconds(it->second.length)));
}

}  // namespace gradmesh::server
