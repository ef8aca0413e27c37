/* plan_search.h: `shardc plan`'s search: meshes, layouts and step keys for a program's model on N
 * devices of a target, each candidate checked and simulated as the program it pastes into.
 *
 * A candidate is a strategy: the sizes of up to six mesh axes, outermost first, `stage` (pipeline
 * parallelism over the stacking dim), `data` (the batch; with fsdp the embedding dim too), `fsdp`
 * (with the batch, the embedding dim alone: FSDP within a group of devices and data parallelism
 * across the groups, PyTorch's HSDP), `ep'
 * (experts, with the batch), `ctx` (context parallelism over the sequence) and `model` (tensor
 * parallelism over heads, MLP hidden and vocabulary, with sequence parallelism or not), and the
 * step keys remat, microbatches, zero and schedule. Its three texts, a mesh's right-hand side, a
 * `layout plan { ... }` and the whole train block, are what the program is evaluated as: the
 * program's own text with its train block replaced and `mesh planned = ...` and the layout
 * appended, parsed and checked as the user's program would be, then the memory fit and the
 * simulated step. So pasting the texts reproduces the figures exactly.
 *
 * The search: every strategy the program's dims admit (sizes that divide them; `model` at most a
 * GPU's NVLink domain or 16 on a TPU), pruned first by a bound that needs no check (the resident
 * state, params + grads + optimizer, over the most any layout of the strategy can shard it, must
 * fit the HBM), then checked and simulated, remat from the cheapest (none, selective, full) until
 * one fits. Ranked by simulated step time, the fitting first. Deterministic: the order of
 * enumeration is fixed and ties keep it. docs/plan.md. */
#ifndef SHARDC_PLAN_SEARCH_H
#define SHARDC_PLAN_SEARCH_H

#include "check.h"

enum { PLAN_AXES = 6 };
extern const char *const plan_axis_names[PLAN_AXES]; /* stage, data, fsdp, ep, ctx, model */

typedef struct PlanCand {
  int size[PLAN_AXES];     /* by plan_axis_names; 1: the axis is left out */
  bool fsdp, sp;           /* embed over data (or over fsdp where that axis is there); seq over model */
  int remat, microbatches, zero;
  int interleave;          /* V of `schedule = interleaved(V)` with a pipeline; 1: 1f1b */
  bool tp_off;             /* `tp_overlap = off` (searched where there is a model axis) */
  /* the fast estimate (plan_estimate.h), which ranks strategies before any is simulated */
  double estimate_s, estimate_memory;
  bool estimate_fits;
  /* the texts: arena strings */
  const char *mesh, *layout, *step;
  /* figures of the checked and simulated program */
  bool evaluated, fits;
  double step_s, compute_s, exposed_s, bubble_s, mfu, memory;
  const char *comm_axes;   /* "data 1.2 s, model 0.4 s": communication time per step by axes */
} PlanCand;

typedef struct PlanInput {
  CheckedProgram *cp;      /* the program as written, checked (its own mesh, layout, step) */
  const Options *o;        /* -D overrides */
  const Target *target;
  int64_t devices;
  bool progress;           /* a line on stderr now and then */
} PlanInput;

typedef struct PlanResult {
  PlanCand *cands;         /* the evaluated, ranked: fitting first, each group fastest first */
  int ncands;
  int64_t enumerated;      /* strategies the dims admit (considered) */
  int64_t pruned;          /* of them, dropped by the resident-state bound */
  int64_t estimated;       /* of them, ranked by the fast estimate (plan_estimate.h) */
  int64_t simulated;       /* of them, the best by the estimate, checked and simulated */
  double estimate_seconds; /* the estimates' CPU time, all of them */
  int64_t evaluated;       /* checked and simulated (several per strategy: remat) */
  int64_t skipped;         /* remats not simulated: the estimate puts them past twice the HBM */
  int64_t invalid;         /* evaluated, but the program had errors (a mesh the target cannot form) */
  PlanCand own;            /* the program's own mesh, layout and step, evaluated the same way */
  const char *step_name;   /* "train llama.forward" */
  const char *error;       /* why there is no search (no train step, no model to place), or NULL */
  double seconds;          /* the search's wall time */
} PlanResult;

void plan_search(Arena *a, const PlanInput *in, PlanResult *out);
/* The size of the program's dim `name`, 0 if it declares none. */
int64_t plan_dim_size(const Program *p, const char *name);
#endif
