/* verdict.h: how a run decides PASS or FAIL, one implementation for `shardc run` (compiler/driver/
 * cmd_run.c) and for a `shardc build` executable (launch.c), so that the two cannot disagree.
 * docs/run.md, "How run decides PASS", states the rule; in short, per output tensor:
 *
 *   - a NaN or an infinity in either run is a FAIL naming the tensor (with allow_nonfinite, the
 *     elements where both runs hold the same non-finite value are left out instead);
 *   - the tolerance is the tensor's noise bound (RtCmpDesc.noise: relative, from its dtype and the
 *     depth of the computation that made it, worked out by the compiler) times its scale (the
 *     largest magnitude of the one-device result), never one element's own magnitude, and for a
 *     gradient at least one rounding of the step's largest gradient (RtCmpDesc.floor);
 *   - state a train step updates (adam's moments; an sgd param or master copy) is compared by its
 *     update, out - before, both runs having started the step from the same state;
 *   - an adam param (or its master copy) is compared with adam's update made from the sharded
 *     run's own new moments: the moments carry the gradient (compared above, where the comparison
 *     is well conditioned), and the update itself, ~lr sign(g) where a gradient is within its
 *     noise, is not;
 *   - a param with a master copy must be that master rounded to its dtype.
 *
 * Everything is in double on the host; inputs are whole tensors in row-major order. No compiler
 * header is included here, and the compiler includes this one. */
#ifndef SHARDC_VERDICT_H
#define SHARDC_VERDICT_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

typedef enum RtCmpKind {
  RT_CMP_VALUE,    /* a function's result, the loss: |shd - ref| <= noise x scale */
  RT_CMP_UPDATE,   /* moments, sgd params and masters: (shd - before) vs (ref - before),
                      tolerance noise x max|ref - before| + one unit in the last place */
  RT_CMP_ADAM,     /* an adam param or master: shd vs before + adam's update from the sharded
                      run's new moments (RtCmpDesc.m, .v), within one unit in the last place */
  RT_CMP_ROUNDED,  /* a param with a master copy: shd vs the sharded master (RtCmpDesc.m)
                      rounded to the param's dtype, within one unit in the last place */
  RT_CMP_EXACT     /* integers: equal */
} RtCmpKind;

/* What the compiler knows of one output of the entry (a constant array in a built executable). */
typedef struct RtCmpDesc {
  const char *name;   /* for the report: `blocks.attn.wq`, `adam.m.blocks.attn.wq`, `loss` */
  int kind;           /* RtCmpKind */
  int dtype;          /* RtDtype of the stored values */
  double noise;       /* RT_CMP_VALUE / _UPDATE: the relative noise bound */
  int before;         /* _UPDATE, _ADAM: the input slot holding the value before the step */
  int m, v;           /* _ADAM: the outputs holding the new first and second moments;
                         _ROUNDED: m, the output holding the master copy */
  int group;          /* _UPDATE: tensors whose updates share a scale (RtCmpGroup), 0: none */
  double floor;       /* ... the tolerance is at least floor x the group's largest update: the
                         rounding of terms as large as the largest gradient's, which an element
                         whose own terms cancel (a key bias's gradient, zero exactly) carries */
} RtCmpDesc;

typedef enum { RT_CMP_NO_GROUP, RT_CMP_GROUP_M, RT_CMP_GROUP_V, RT_CMP_GROUP_PARAM, RT_CMP_GROUP_MASTER, RT_CMP_GROUPS } RtCmpGroup;

/* One output's values: whole tensors of n elements (before, m, v: NULL where the kind has none). */
typedef struct RtCmpData {
  int64_t n;
  const double *shd, *ref, *before, *m, *v;
} RtCmpData;

/* The verdict so far, over every tensor compared. */
typedef struct RtVerdict {
  bool pass;
  bool allow_nonfinite;
  double lr, t;               /* adam's lr and the step count t of the step compared */
  int tensors;                /* compared */
  /* the worst tensor: the largest error over its tolerance (ratio) */
  char worst[128];
  double worst_ratio, worst_abs, worst_rel, worst_tol_rel; /* error and tolerance over its scale */
  bool worst_ulp;             /* the worst is an RT_CMP_ADAM or _ROUNDED tensor */
  /* the first failure, in words: "adam.m.w: element 17: 0.25 sharded, 0.0123 one device (tolerance
     0.0004)", "loss: NaN in the sharded run" */
  char why[320];
  int64_t nonfinite_shd, nonfinite_ref; /* non-finite elements seen */
  FILE *trace;                /* not NULL: one line per tensor compared (SHARDC_VERDICT_TRACE) */
} RtVerdict;

void rt_verdict_init(RtVerdict *v, bool allow_nonfinite);
/* Compares one output under desc's rule (v->lr and v->t set for RT_CMP_ADAM); `floor`: an absolute
 * tolerance below which no element fails (rt_verdict_step's group floor; 0: none). */
void rt_verdict_add(RtVerdict *v, const RtCmpDesc *desc, const RtCmpData *x, double floor);
/* Compares the n outputs of one step: each group's largest update first (RtCmpDesc.group, .floor),
 * then every output by rt_verdict_add. */
void rt_verdict_step(RtVerdict *v, const RtCmpDesc *desc, const RtCmpData *x, int n);
/* One line for the report: "0.00146 abs in blocks.attn.wq, 0.8% of its largest value (tolerance
 * 3.2%)"; or the reason of a FAIL. */
void rt_verdict_text(const RtVerdict *v, char *buf, size_t n);
/* The report's lines (run's and a built executable's): `  worst error ...`, then `  failure ...`
 * on a FAIL, or `  non-finite ...` where --allow-nonfinite left elements out. */
void rt_verdict_print(const RtVerdict *v, FILE *out);

/* The value x as the dtype stores it (round to nearest even), and one unit in the last place of
 * the dtype at |x|. */
double rt_round_to(int dtype, double x);
double rt_ulp(int dtype, double x);

#endif
