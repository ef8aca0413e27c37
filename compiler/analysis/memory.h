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
  const char *what;      /* "activations: f32 logits [batch 8, seq 8192, vocab 128256]": its class,
                            dtype, name and per-device shape (a param by its path) */
  const char *name;      /* the tensor: "logits", "param blocks.mlp.w_up", "cast(h)" */
  const char *dtype;     /* "f32" */
  const char *shape;     /* "[batch 8, seq 8192, vocab 128256]": per-device extents */
  const char *cls;       /* "param", "gradient", "optimizer state", "activations", "temporary" */
  SrcLoc loc;
  int64_t bytes;         /* per device */
} MemBuffer;

/* What a device holds between steps (Megatron's model state), by what it is: each param, its
 * gradient as the optimizer reads it (after its reductions: ZeRO-2/3 shard it), adam's moments and
 * the master copy (ZeRO-1 shards them), at their per-device shardings. Without a train step,
 * params alone. The peak (MemoryReport's classes) adds activations and temporaries and counts a
 * gradient only while it is live: during the forward none is. */
typedef struct MemResident {
  int64_t params, grads, moments, master, total;
} MemResident;

#define MEM_MAX_LARGEST 6
/* One pipeline stage's device (language.md's per_stage; the whole mesh without a pipeline). */
typedef struct MemStage {
  int stage;
  int64_t params, grads, optimizer, activations, temporaries, total; /* its peak, by class */
  int in_flight;             /* microbatch chunks whose residuals are kept at the peak */
  MemResident resident;      /* what it holds between steps: its own params (the first stage the
                                embedding, the last the head, each its layers), their gradients
                                and optimizer state */
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
  MemResident resident;      /* per device, between steps (under a pipeline the stage holding most) */
  const char *peak_at;       /* the op at the peak of the worst device: "the backward of ... at line 40" */
  MemBuffer largest[MEM_MAX_LARGEST]; /* largest buffers, largest first */
  int nlargest;
  /* under a pipeline, each stage's device (per_device above is the largest of them) */
  MemStage *stages;
  int nstages;               /* 0 without a pipeline */
} MemoryReport;

/* Runs the pass pipeline (pipeline.h) if it has not run, then reads the report off the buffer plan
 * (bufplan.h): per device the plan's peak and its split by class; under a pipeline per stage. */
void memory_estimate(const Program *p, IrModule *m, MemoryReport *out);

/* Resident state, then the peak by class (and per pipeline stage). Paths relative: the program's
 * file as given, stdlib files as models/llama.shard. */
void memory_print_text(FILE *out, const Program *p, const MemoryReport *r);
/* "models/llama.shard:39", or "prog.shard:12" for the program itself (its base name) (arena) */
const char *memory_where(Arena *a, const Program *p, SrcLoc loc);
/* "512 B", "1.50 GB": decimal units (1 KB = 1000 B), two decimals above B, the sign kept. The one
 * byte format of check's and explain's reports and of the suggestions. */
void memory_format_bytes(char *buf, size_t n, double b);
#endif
