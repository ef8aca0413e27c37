/* memory.h: memory fit per device and FLOPs per step.
 *
 * In: the checked Program (its mesh, layout and step) and the entry's IR with a sharding on every
 * value. Out: the per-device bytes of language.md's memory keys (params, grads, optimizer,
 * activations, temporaries), the total against the target's HBM, the largest buffers, FLOPs per
 * step. When it does not fit, fitsearch.h says what to change. */
#ifndef SHARDC_MEMORY_H
#define SHARDC_MEMORY_H

#include "ir.h"

typedef struct MemBuffer {
  const char *what;      /* "param blocks.mlp.w_up", "activations of loop body (x126)", ... */
  SrcLoc loc;
  int64_t bytes;         /* per device */
} MemBuffer;

#define MEM_MAX_LARGEST 6
/* One pipeline stage's device (language.md's per_stage; the whole mesh without a pipeline). */
typedef struct MemStage {
  int stage;
  int64_t params, grads, optimizer, activations, temporaries, total;
  int in_flight;             /* microbatch chunks whose residuals are kept at the peak */
} MemStage;

typedef struct MemoryReport {
  bool training;
  int64_t devices;
  int64_t param_count;       /* global */
  int64_t param_bytes;       /* global, in the params' dtypes */
  /* per device, after sharding (language.md's fixed keys) */
  int64_t params, grads, optimizer, activations, temporaries, total;
  double capacity;           /* the target's HBM, bytes */
  bool fits;
  double flops_per_step;     /* global, recomputation included */
  double model_flops_per_step; /* the same without recomputation (MFU's numerator) */
  double recompute_flops;
  MemBuffer largest[MEM_MAX_LARGEST]; /* largest buffers, largest first */
  int nlargest;
  /* under a pipeline, each stage's device (per_device above is the largest of them) */
  MemStage *stages;
  int nstages;               /* 0 without a pipeline */
} MemoryReport;

/* Runs the pass pipeline (pipeline.h) if it has not run, then reads the report off the buffer plan
 * (bufplan.h): per device the plan's peak and its split by class; under a pipeline per stage. */
void memory_estimate(const Program *p, IrModule *m, MemoryReport *out);

void memory_print_text(FILE *out, const Program *p, const MemoryReport *r);
/* "512 B", "1.50 GB": decimal units (1 KB = 1000 B), two decimals above B, the sign kept. The one
 * byte format of check's and explain's reports and of the suggestions. */
void memory_format_bytes(char *buf, size_t n, double b);
#endif
