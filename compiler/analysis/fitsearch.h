/* fitsearch.h: what to change when a program does not fit: a short search over combinations of
 * changes, and every program it proposes checked in full.
 *
 * In: a checked program that does not fit (its module after the pass pipeline and its memory
 * report), and how it was loaded (the parsed files and the command line's choices, so that a
 * program with a padded dim can be checked again from its declarations).
 * Out: plans of up to FIT_MAX_CHANGES changes, each plan checked as the program it proposes (the
 * whole pass pipeline, the buffer plan), with what each change adds: bytes per device, the ideal
 * time of the step's collectives, FLOPs. The changes:
 *   - a layout rule: a new rule for a dim of a param or an input, or more axes for a dim's rule,
 *     one axis or two at once (`embed: (data, model)`);
 *   - a dim padded to a multiple of its rule's axes (vocab 50257 -> 50304) where the rule does not
 *     divide it, for at most 1% more rows (layout_pad_size); each such padding is also checked
 *     alone, whether or not a plan needs it;
 *   - the train step's `remat`, `zero` and `microbatches`.
 * Where no plan fits, the least number of devices of the mesh's target that could hold the params,
 * gradients and optimizer state at all, and why.
 *
 * The search does not propagate: a candidate's params, gradients and optimizer state come from the
 * layout's rules applied to each param's type (layout_apply's order and skips), and the other
 * buffers live at the checked program's peak are rescaled by the axes the change adds to their
 * dims. Beam search over those estimates, then the best few candidates are checked in full. */
#ifndef SHARDC_FITSEARCH_H
#define SHARDC_FITSEARCH_H

#include "memory.h"
#include "pipeline.h"

#define FIT_MAX_CHANGES 3 /* changes in one plan */
#define FIT_MAX_PLANS 3   /* plans reported */

/* A program as checked in full. */
typedef struct FitFigures {
  bool valid;           /* checked with no errors */
  bool fits;
  int64_t total;        /* bytes per device (the buffer plan's peak) */
  int64_t params, grads, optimizer, activations, temporaries;
  double comm_s;        /* ideal time of the step's collectives, per device (step_comm_seconds) */
  double compute_s;     /* ideal time of its ops, per device (step_compute_seconds) */
  double flops;         /* flops_per_step, recomputation included */
} FitFigures;

typedef enum { FIT_RULE, FIT_PAD, FIT_REMAT, FIT_ZERO, FIT_MICRO } FitKind;

typedef struct FitChange {
  FitKind kind;
  const Dim *dim;       /* FIT_RULE, FIT_PAD */
  int8_t axes[MAX_AXES_PER_DIM]; /* FIT_RULE: the rule's axes after the change, as written */
  int naxes;
  uint16_t added;       /* FIT_RULE: the axes it adds (bit a: mesh axis a) */
  bool extends;         /* FIT_RULE: the layout has a rule for the dim, which grows */
  int64_t pad_to;       /* FIT_PAD; FIT_RULE: > 0 where the rule needs the dim padded first */
  int value;            /* FIT_REMAT: RematKind; FIT_ZERO: 1 or 2; FIT_MICRO: microbatches */
  double proxy_s;       /* the search's estimate of the time it adds (ranking only) */
} FitChange;

typedef struct FitPlan {
  FitChange change[FIT_MAX_CHANGES];
  int n;
  /* after[i]: the program with changes 0..i, checked (valid false where it was not checked:
   * every plan has after[n - 1]; the first plan every prefix) */
  FitFigures after[FIT_MAX_CHANGES];
  char text[FIT_MAX_CHANGES][400];   /* "add `embed: data` to layout dp" */
  char what[FIT_MAX_CHANGES][400];   /* the collectives or the compute it adds, in words */
  double added_s;       /* the time it adds per step and device, ideal: its ops' and its collectives' */
  /* the first plan only: change i saves nothing by itself (after[i] is no smaller than the program
   * before it), yet the plan without it, checked, is worse: a later change needs it */
  bool enabling[FIT_MAX_CHANGES];
} FitPlan;

typedef struct FitAdvice {
  FitFigures base;
  FitPlan plans[FIT_MAX_PLANS];      /* fitting plans, cheapest first; where none fits, the closest */
  int nplans;
  bool found;                        /* plans[0] fits (checked) */
  /* each dim a layout rule skips for not dividing it, padded so that the rule applies, checked
   * (a plan of one FIT_PAD change) */
  FitPlan pads[FIT_MAX_PLANS];
  int npads;
  /* params, gradients and optimizer state of the whole model: no layout holds them in fewer
   * devices than this (their bytes over the target's HBM, rounded up) */
  double state_params, state_grads, state_optimizer; /* global bytes */
  int64_t min_devices;
  int candidates;                    /* programs estimated */
  int checked;                       /* programs checked in full */
  int invalid;                       /* of which had errors (never reported) */
  double seconds;                    /* the search's wall time */
} FitAdvice;

typedef struct FitInput {
  const CheckedProgram *cp;          /* parsed, prog, ir (after the pass pipeline), so */
  const MemoryReport *base;
} FitInput;

/* Searches; out->nplans 0 when the program fits or has no mesh. */
void fit_search(const FitInput *in, FitAdvice *out);

/* "set `remat = full` in the train step", "add `embed: (data, model)` to layout dp", ... */
void fit_change_text(const Program *p, const FitChange *c, char *buf, size_t n);
#endif
