#include "worker/collectives/mass_balance.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace gradmesh::collectives {

MassBalance::MassBalance(const std::vector<std::vector<float>>& gradients,
                         const std::vector<std::vector<float>>& residuals) {
  const size_t n = gradients.empty() ? 0 : gradients[0].size();
  input_.assign(n, 0.0);
  scale_.assign(n, 0.0);
  for (size_t r = 0; r < gradients.size(); ++r) {
    for (size_t i = 0; i < n; ++i) {
      const double x = double{gradients[r][i]} + residuals[r][i];
      input_[i] += x;
      scale_[i] += std::fabs(x);
    }
  }
}

absl::Status MassBalance::Check(
    const sparse::SparseBlock& result,
    const std::vector<std::vector<float>>& residuals, double tolerance) const {
  std::vector<double> output(input_.size(), 0.0);
  for (size_t e = 0; e < result.size(); ++e) {
    output[result.indices[e]] += result.values[e];
  }
  for (const std::vector<float>& residual : residuals) {
    for (size_t i = 0; i < output.size(); ++i) output[i] += residual[i];
  }
  double total_error = 0, total_scale = 0;
  for (size_t i = 0; i < output.size(); ++i) {
    const double error = std::fabs(output[i] - input_[i]);
    if (error > tolerance * scale_[i] + 1e-30) {
      return absl::DataLossError(
          absl::StrCat("mass not conserved at index ", i, ": inputs ",
                       input_[i], ", result + residuals ", output[i]));
    }
    total_error += error;
    total_scale += scale_[i];
  }
  if (total_error > tolerance * total_scale) {
    return absl::DataLossError(
        absl::StrCat("mass not conserved: total error ", total_error));
  }
  return absl::OkStatus();
}

}  // namespace gradmesh::collectives
