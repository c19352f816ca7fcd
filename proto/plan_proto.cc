#include "proto/plan_proto.h"

#include <algorithm>

namespace gradmesh {

void PlanToProto(const collectives::Plan& plan, v1::Plan* out) {
  out->set_algorithm(plan.algorithm);
  out->set_density(plan.density);
  out->set_teams(plan.teams);
  out->set_encoding(plan.encoding);
  out->set_values(plan.values);
  out->set_quantize_bits(plan.quantize_bits);
  out->set_oktopk_tau(plan.oktopk_tau);
  out->set_oktopk_tau_prime(plan.oktopk_tau_prime);
  out->set_seed(plan.seed);
  out->set_exact_below(plan.exact_below);
  out->mutable_dense_sizes()->Assign(plan.dense_sizes.begin(),
                                     plan.dense_sizes.end());
  out->set_warmup_steps(plan.warmup_steps);
  out->set_fusion(plan.fusion);
  out->set_chunk_bytes(plan.chunk_bytes);
  out->set_autotuning(plan.autotuning);
  out->set_note(plan.note);
}

collectives::Plan PlanFromProto(const v1::Plan& plan) {
  const collectives::Plan defaults;
  collectives::Plan out{
      .algorithm = plan.algorithm(),
      .density = plan.density(),
      .teams = plan.teams(),
      .encoding = plan.encoding(),
      .values = plan.values(),
      .quantize_bits = plan.quantize_bits(),
      .oktopk_tau =
          plan.oktopk_tau() != 0 ? plan.oktopk_tau() : defaults.oktopk_tau,
      .oktopk_tau_prime = plan.oktopk_tau_prime() != 0
                              ? plan.oktopk_tau_prime()
                              : defaults.oktopk_tau_prime,
      .seed = plan.seed() != 0 ? plan.seed() : defaults.seed,
      .exact_below = plan.exact_below(),
      .dense_sizes = {plan.dense_sizes().begin(), plan.dense_sizes().end()},
      .warmup_steps = plan.warmup_steps(),
      .fusion = plan.fusion().empty() ? defaults.fusion : plan.fusion(),
      .chunk_bytes = plan.chunk_bytes(),
      .autotuning = plan.autotuning(),
      .note = plan.note()};
  // Workers look sizes up by binary search.
  std::sort(out.dense_sizes.begin(), out.dense_sizes.end());
  return out;
}

}  // namespace gradmesh
