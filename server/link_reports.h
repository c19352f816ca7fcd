// LinkReports: which member the coordinator removes when members report
// peers they cannot reach, and who is kept out afterwards.
//
// A link that drops every packet (a black-holed route, a switch port gone
// bad) while both ends heartbeat leaves membership unchanged, so every step
// that needs the link fails. Each worker reports, with its heartbeats, the
// members of its view whose channel has not been ready for its link timeout
// (LinkWatch). Once no report is newer than `settle` (at least a heartbeat
// timeout, so that every member that sees the fault has had a heartbeat to
// say so), the member reported by the most members is removed, and with ties
// the last in node-id order. A node that lost its network to
// every peer is reported by all of them and removed; of the two ends of one
// bad link, one is.
//
// The removed process (node id and incarnation) may not join again for the
// quarantine, doubled at each removal of the same process (to 16 times), so
// that a link still bad does not cut the others' steps every few seconds. A
// new process of the node (a restart) is not kept out.
//
// Not thread-safe: the Coordinator holds it under its mutex. Time is passed
// in (steady time in the service).
#ifndef GRADMESH_SERVER_LINK_REPORTS_H_
#define GRADMESH_SERVER_LINK_REPORTS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace gradmesh::server {

class LinkReports {
 public:
  // `settle` and `quarantine` must be positive.
  LinkReports(absl::Duration settle, absl::Duration quarantine);

  // The member `reporter`'s list at `now` of the peers it cannot reach: a
  // peer listed before keeps the time it was first listed, one no longer
  // listed is forgotten.
  void Update(absl::string_view reporter,
              const std::vector<std::string>& unreachable, absl::Time now);

  // Forgets `node_id`'s reports and the reports about it (it left, or a new
  // process replaced it).
  void Forget(absl::string_view node_id);

  struct Verdict {
    std::string node_id;
    std::vector<std::string> reporters;  // sorted
  };
  // Among `members`, the one to remove at `now`, or nullopt: see above.
  // Reports by or about non-members do not count.
  std::optional<Verdict> Choose(const absl::flat_hash_set<std::string>& members,
                                absl::Time now) const;

  // Keeps `node_id`'s process `incarnation` out from `now`; returns for how
  // long.
  absl::Duration KeepOut(const std::string& node_id, uint64_t incarnation,
                         absl::Time now);

  // OK, or Unavailable saying for how long while that process is kept out.
  absl::Status MayJoin(absl::string_view node_id, uint64_t incarnation,
                       absl::Time now) const;

  // How many times each node's processes were removed for its links.
  const std::map<std::string, int>& removals() const { return removals_; }

 private:
  struct KeptOut {
    uint64_t incarnation = 0;
    absl::Time until;
    int strikes = 0;  // removals of this incarnation
  };

  const absl::Duration settle_;
  const absl::Duration quarantine_;
  // reporter -> (unreachable peer -> first listed).
  absl::flat_hash_map<std::string, absl::flat_hash_map<std::string, absl::Time>>
      reports_;
  absl::flat_hash_map<std::string, KeptOut> kept_out_;
  std::map<std::string, int> removals_;
};

}  // namespace gradmesh::server

#endif  // GRADMESH_SERVER_LINK_REPORTS_H_
