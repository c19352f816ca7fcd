// The one conversion between the plan of the system (collectives::Plan) and
// its proto (gradmesh.v1.Plan), for the coordinator's views and the workers'
// SDK answers alike.
#ifndef GRADMESH_PROTO_PLAN_PROTO_H_
#define GRADMESH_PROTO_PLAN_PROTO_H_

#include "gradmesh/v1/coordinator.pb.h"
#include "worker/collectives/plan.h"

namespace gradmesh {

void PlanToProto(const collectives::Plan& plan, v1::Plan* out);

// Fields a message from an older coordinator leaves unset (0) take the
// Plan defaults; dense_sizes come out ascending.
collectives::Plan PlanFromProto(const v1::Plan& plan);

}  // namespace gradmesh

#endif  // GRADMESH_PROTO_PLAN_PROTO_H_
