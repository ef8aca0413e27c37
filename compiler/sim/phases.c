/* phases.c: the simulated step split by phase, as Megatron's timers print it (see sim.h). */
#include <string.h>

#include "sim.h"

static const char *const PHASE_NAMES[SIMPH__COUNT] = {
#define X(id, name) name,
    SIM_PHASES(X)
#undef X
};

const char *sim_phase_name(SimPhaseKind k) { return k >= 0 && k < SIMPH__COUNT ? PHASE_NAMES[k] : "?"; }

static SimPhaseKind phase_of(const SimItem *it) {
  const Op *op = it->op;
  if (!op) return SIMPH_FORWARD;
  if (it->kind == SIMK_COLLECTIVE) {
    if (op->kind == OP_PIPELINE) return SIMPH_PIPELINE;
    if (ir_op_is_collective(op->kind) && op->role == ROLE_GRADIENT) return SIMPH_GRAD_REDUCE;
  }
  if (op->kind == OP_PIPELINE) return SIMPH_BACKWARD; /* its gradient accumulation */
  switch ((OpPhase)op->phase) {
  case PHASE_FORWARD:
  case PHASE_LOSS: return SIMPH_FORWARD;
  case PHASE_BACKWARD:
  case PHASE_RECOMPUTE:
  case PHASE_ACCUMULATE: return SIMPH_BACKWARD;
  case PHASE_UPDATE: return SIMPH_OPTIMIZER;
  }
  return SIMPH_FORWARD;
}

void sim_phases(const SimReport *r, SimPhase out[SIMPH__COUNT]) {
  memset(out, 0, sizeof(SimPhase) * SIMPH__COUNT);
  for (int k = 0; k < SIMPH__COUNT; k++) out[k].kind = (SimPhaseKind)k;
  for (int i = 0; i < r->nitems; i++) {
    const SimItem *it = &r->items[i];
    SimPhase *ph = &out[phase_of(it)];
    if (it->kind == SIMK_COLLECTIVE) {
      ph->comm_s += it->time_s;
      ph->exposed_comm_s += it->exposed_s;
    } else {
      ph->compute_s += it->time_s;
    }
    ph->flops += it->flops;
  }
  for (int k = 0; k < SIMPH__COUNT; k++) {
    SimPhase *ph = &out[k];
    ph->time_s = ph->compute_s + ph->exposed_comm_s;
    ph->flops_per_s = ph->time_s > 0 ? ph->flops / ph->time_s : 0;
  }
}
