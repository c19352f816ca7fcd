// The papers' cost formulas for one all-reduce, per worker: SparDL's Table I
// (paper 000) for SparDL, TopkA, TopkDSA, gTopk and Ok-Topk, and the ring's
// 2 (P-1) rounds and 2 (P-1)/P n values for the dense ring. `gradmesh sim`
// prints them beside what the real schedules did.
//
// Bytes count 8 a sparse value (Table I's "2k beta" counts 4-byte words: an
// index and a value) and 4 a dense one; log P is read as ceil(log2 P), the
// rounds of the Bruck and tree schedules for any P. Where Table I gives a
// range (TopkDSA, Ok-Topk, SparDL with B-SAG), min_bytes < max_bytes. SparDL
// is server::SparDlCost (the coordinator's model) where Table I is exact,
// and with B-SAG its lower bound is the sum of eqs. (6), (8) and (9),
// 2 (Pd + P - 2d)/(Pd) k words, not the table's misprint (cost_model.h).
//
// Pure functions; thread-safe.
#ifndef GRADMESH_TOOLS_GRADMESH_TABLE_ONE_H_
#define GRADMESH_TOOLS_GRADMESH_TABLE_ONE_H_

#include <cstdint>
#include <optional>
#include <string_view>

namespace gradmesh::tools {

struct FormulaCost {
  int rounds = 0;
  double min_bytes = 0;  // received by a worker
  double max_bytes = 0;

  bool exact() const { return min_bytes == max_bytes; }
};

// The formula's cost of `algorithm` for P workers (d teams for SparDL; d
// must divide P), n values and k = SelectionSize(n, density); nullopt for an
// algorithm without one (gaussiank).
std::optional<FormulaCost> TableOneCost(std::string_view algorithm,
                                        int world_size, int teams, uint64_t n,
                                        double density);

}  // namespace gradmesh::tools

#endif  // GRADMESH_TOOLS_GRADMESH_TABLE_ONE_H_
