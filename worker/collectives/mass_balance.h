// MassBalance: the conservation identity of one all-reduce, checked index by
// index. Records the inputs of an iteration (each worker's gradient plus the
// residual it carried, summed over workers, in double) and checks that they
// equal the result plus the residuals left, within `tolerance` of the
// inputs' magnitude at each index and over all of them.
//
//   MassBalance balance(gradients, residuals);     // before the all-reduce
//   ... run it ...
//   GM_RETURN_IF_ERROR(balance.Check(result, residuals));
//
// Used by the tests and by `gradmesh local --verify`.
#ifndef GRADMESH_WORKER_COLLECTIVES_MASS_BALANCE_H_
#define GRADMESH_WORKER_COLLECTIVES_MASS_BALANCE_H_

#include <vector>

#include "absl/status/status.h"
#include "worker/sparse/sparse_block.h"

namespace gradmesh::collectives {

class MassBalance {
 public:
  // gradients[w] and residuals[w]: worker w's, all of one length.
  MassBalance(const std::vector<std::vector<float>>& gradients,
              const std::vector<std::vector<float>>& residuals);

  // DataLoss naming the first index (or the total) that is off.
  absl::Status Check(const sparse::SparseBlock& result,
                     const std::vector<std::vector<float>>& residuals,
                     double tolerance = 1e-5) const;

 private:
  std::vector<double> input_, scale_;
};

}  // namespace gradmesh::collectives

#endif  // GRADMESH_WORKER_COLLECTIVES_MASS_BALANCE_H_
