/* simulate.c: a per-device program on the timeline (sim.h's sim_program).
 *
 * In: a module after the pass pipeline and its Program. Out: the timeline of one representative
 * device per distinct role and what it comes to (SimReport).
 *
 * Devices. Without a pipeline every device runs the same program (SPMD): one simulated device
 * stands for the whole mesh. Under `layers@stage` one per stage, each for devices / p (main's ops
 * run on the stages Op.place names).
 *
 * Streams of a device. `compute` runs kernels in program order (sim.h: kernels.c decides what a
 * kernel is and what it costs). A collective runs on the `comm` stream of the link class it rides:
 * one for the fast links (TPU ICI, GPU NVLink) and one for the slow (TPU DCN, the GPU network),
 * since collectives over different links run at once and those sharing a link take turns; a comm
 * stream runs its collectives in the order they become ready (an asynchronous collective starts
 * as soon as its operand exists, as XLA's scheduler and NCCL streams do). `p2p` carries a
 * pipeline's transfers.
 *
 * Dependencies follow the dataflow: a task waits for the tasks that make its operands. Loops are
 * unrolled (a stacked loop runs its trips, a microbatch loop its microbatches), with one rule a
 * compiler adds: a collective of iteration i that needs nothing the iteration computes (an FSDP
 * weight gather) may start once iteration i - 1 has started -- prefetched one layer ahead, never
 * further (the gathered weights of two layers at most, as FSDP and XLA bound them). A data-parallel
 * collective with an overlap window in the device program (shard/dpwin.h, DevOp.win) is issued
 * where the window says (window_tasks): a gradient reduction once the value it names is made (after
 * a microbatch loop: the last microbatch's gradient), a stacked gradient in pieces, piece i when
 * iteration i of its layer loop ends; so reductions overlap the rest of the backward. What a
 * collective leaves exposed is whatever of it no compute overlaps.
 *
 * Pipelines. Each region (ir.h's PipeRegion) is simulated alone once (its ops, its loop of layers
 * and its collectives, and the f32 accumulation of the gradients it yields), and each stage runs
 * the schedule's actions: a region as one task of that duration, a send as a transfer on the p2p
 * stream (cost_collective(COLL_PERMUTE) over the stage axes), which the receiving stage's next
 * region waits for.
 *
 * Steady states. Time and memory do not grow with the number of layers or microbatches: what
 * repeats is simulated a few times and the rest follows in closed form. Identical iterations (or
 * microbatches) settle into a steady state where the timeline repeats exactly, every c of them one
 * shift later; steady_period proves it on a simulated timeline (a check of every task, not of a
 * figure), and then every figure F of n iterations is F(k) + (n - k) / (cP) (F(k + cP) - F(k)).
 *   - A loop whose unrolling would pass the task budget (SimOptions.max_tasks) is a block: the loop
 *     simulated alone with k0 = 24 P iterations (P: the period of its pipeline permutes, 1
 *     otherwise; k0 doubling while no steady state shows) for the cycle c, then with k = n mod cP
 *     and k + cP, both proven periodic; one compute task of the extrapolated time in the timeline
 *     that runs it.
 *   - A 1f1b or interleaved pipeline of N microbatches, when that costs less than simulating N: the
 *     whole step simulated at fewer microbatches the same way, a run of the schedule's steady span
 *     (schedule.h) being the unit (P = p under interleaving, else 1). gpipe runs every forward
 *     before any backward, its stages drifting apart with no steady state: always in full.
 * What shows no steady state within the budget, and is too large to simulate whole, is a located
 * error. tests/unit/test_sim_steady.c checks both against full simulations. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bufplan.h"
#include "devprog.h"
#include "diag.h"
#include "dpwin.h"
#include "opcost.h"
#include "outfile.h"
#include "partition.h"
#include "route.h"
#include "schedule.h"
#include "sim.h"
#include "sim_int.h"
#include "stages.h"
#include "step.h"

enum { TAG_KERNEL, TAG_ACCUM, TAG_SEND_ACT, TAG_SEND_GRAD, TAG_REGION, TAG_REPEAT };
enum { LINK_FAST, LINK_SLOW, NLINK };
enum { DEFAULT_MAX_TASKS = 1000000 };
/* A pipeline simulated whole (gpipe, or no steady state found) may take this many budgets: 4,000,000
 * tasks, what every loop and pipeline could take before steady states. */
enum { WHOLE_PIPELINE_BUDGETS = 4 };

/* The longest cycle, in periods, a steady state is looked for with (a timeline may repeat every
 * second microbatch rather than every one: stages of unequal time). */
enum { STEADY_MAX_CYCLE = 8 };
/* Units a steady state is first looked for in (a pipeline: on its stage with the fewest). */
enum { STEADY_UNITS = 24 };

typedef struct TaskInfo {
  const Op *op;    /* the kernel's anchor; the pipeline op or the loop for the others */
  int kernel;      /* TAG_KERNEL: its kernel, else -1 */
  int sub;         /* TAG_REGION, TAG_REPEAT: the sub-timeline it runs, else -1 */
  int mb, chunk;   /* TAG_REGION, sends: microbatch and model chunk */
  uint8_t tag;
  int unit;        /* the repeating unit it belongs to (a loop block's iterations, a pipeline's steady
                      span's runs), -1 none (Sim.cur_unit when added) */
  int pieces;      /* TAG_KERNEL: one of this many pieces of one run (a gradient reduced in pieces,
                      dpwin.h; mb of them in this task), 0 or 1 a whole run */
} TaskInfo;

/* One timeline and what each of its tasks stands for. */
typedef struct Timeline {
  SimGraph *g;
  double contention; /* its devices' (sim_device_set_contention): contention_of(mesh, ideal) */
  TaskInfo *info;
  int n, cap;
  double *exposed; /* after the run, by task: the part of a comm task no compute overlaps */
} Timeline;

typedef struct Dev {
  int dev, compute, p2p, comm[NLINK];
  int last_compute; /* the last compute task added, -1 */
  int block;        /* a blocking collective (dp_overlap = off) the next compute task waits for, -1 */
} Dev;

/* A timeline simulated alone: a pipeline region, or a loop run as a block. */
typedef struct Sub {
  const IrFunc *f;     /* the region; NULL for a loop block */
  const Op *op;        /* the pipeline or the loop */
  int region;          /* PR_* or -1 */
  int64_t iters;       /* a loop block: the iterations its timeline runs */
  int index;           /* in Sim.subs */
  Timeline tl;
  Dev d;
  double time_s;       /* its makespan (a block: extrapolated to the loop's count) */
  SimDeviceStats st;   /* (a block: extrapolated) */
  bool link_used[NLINK];
  double mult;         /* runs per step over all simulated devices (the items' weights) */
  struct Sub *lin;     /* a block standing for more iterations than its timeline runs: its items are
                          (1 - lin_m) x its own timeline's + lin_m x lin's (P more iterations) */
  double lin_m;
} Sub;

/* The context of the loop iteration being unrolled. */
typedef struct LoopCtx {
  int64_t iter;
  const bool *hoist;   /* by value id: needs nothing the iteration computes */
  int marker;          /* the compute task a hoisted collective waits for, -1 none */
} LoopCtx;

typedef struct JoinRec {
  const Op *op;
  int task;
} JoinRec;

/* One simulation of the step: its timeline, its devices and its figures. */
typedef struct Top {
  Timeline tl;
  Dev *devs;
  int ndevs;
  int *pipe_first, *pipe_last; /* by simulated device: its first and last region task, -1 */
  int nmb;                     /* the microbatches its schedule runs (0 without a pipeline) */
  bool ok;                     /* every task scheduled */
  double step_s;
  SimStageStats *stages;       /* [ndevs] */
} Top;

/* A loop's way through the simulation, decided once (the step may be simulated several times). */
typedef struct LoopMode {
  const Op *loop;
  Sub *block;          /* NULL: unrolled */
  int task, prev;      /* a block: its task in the timeline built last, and the compute task before it */
} LoopMode;

typedef struct Sim {
  const Program *p;
  const IrModule *m;
  const Mesh *mesh;
  Arena *a;
  SimCosts c;
  bool ideal;
  int32_t *prod;       /* by value id: the task that makes it in the timeline being built; -1:
                          there from the start */
  int32_t *ktask;      /* by kernel: its task in the iteration being built */
  const char **kname;  /* by kernel: its label */
  int64_t max_tasks;   /* unrolled loops: the timelines' tasks before loops become blocks */
  int64_t budget;      /* what a steady state's search, or a block or a pipeline simulated whole, may take */
  int64_t ntasks_total;
  Sub **subs;
  int nsubs, capsubs;
  LoopMode *modes;
  int nmodes, capmodes;
  int blocks;          /* loops simulated as blocks */
  const PipeInfo *pi;
  uint16_t stage_mask;
  /* the step being built */
  Top *top;
  const PipeInfo *sched; /* its schedule: pi, or pi at fewer microbatches */
  int32_t *send_task;  /* by (backward, mb, chunk) */
  int *recv_wait, *recv_task; /* pairs: key, region task that waits for it */
  int nrecv, caprecv;
  JoinRec *joins;
  int njoins, capjoins;
  bool failed;         /* a located error was reported */
  bool full;           /* SimOptions.full: no steady state, every iteration and microbatch */
  int cur_unit;        /* the unit the tasks being added belong to, -1 none */
  const Op *unit_loop; /* the loop whose iterations are units (a block being built) */
  int64_t unit_period; /* its iterations per unit */
  double outer_runs;   /* runs of what is being built: the product of the enclosing unrolled loops' counts */
  /* the loops whose iterations issue the pieces of a gradient reduction (DevWindow.piece_loop):
   * per loop, the last compute task of each iteration in its last unrolling, -1 unknown */
  const Op **piece_loop;
  int32_t **piece_end;
  int npiece_loops;
} Sim;

/* ---- timelines ---- */

static int tl_add(Sim *S, Timeline *tl, int stream, double dur, const char *name, SrcLoc loc, TaskInfo info) {
  int t = sim_task_add(tl->g, stream, dur, name, loc);
  if (t < 0) return -1;
  if (t >= tl->cap) {
    tl->cap = tl->cap ? 2 * tl->cap : 1024;
    while (tl->cap <= t) tl->cap *= 2;
    tl->info = mem_realloc(tl->info, sizeof *tl->info * (size_t)tl->cap, "the simulated timeline's tasks");
  }
  tl->info[t] = info;
  tl->info[t].unit = S->cur_unit;
  tl->n = t + 1;
  S->ntasks_total++;
  return t;
}

static void tl_free(Timeline *tl) {
  sim_graph_free(tl->g);
  free(tl->info);
  free(tl->exposed);
  memset(tl, 0, sizeof *tl);
}

/* How much slower compute runs while a collective runs beside it (calibrated, GPU): the collective
 * holds `collective_sms` of the `matmul_units` SMs, so kernels that spread over all of them run on
 * the rest. 1 in the ideal mode and where the target states none. */
static double contention_of(const Mesh *mesh, bool ideal) {
  const Target *t = mesh ? mesh->target : NULL;
  if (ideal || !t || t->kind != TARGET_GPU || t->collective_sms <= 0 || t->matmul_units <= t->collective_sms) return 1;
  return (double)t->matmul_units / (t->matmul_units - t->collective_sms);
}

static void dev_init(Timeline *tl, Dev *d, const char *name, int64_t represents) {
  d->dev = sim_device_add(tl->g, name, represents);
  sim_device_set_contention(tl->g, d->dev, tl->contention);
  d->compute = sim_stream_add(tl->g, d->dev, SIM_STREAM_COMPUTE, "compute");
  d->p2p = -1;
  d->comm[LINK_FAST] = d->comm[LINK_SLOW] = -1;
  d->last_compute = -1;
  d->block = -1;
}

static const char *link_stream_name(const Mesh *m, int cls) {
  bool tpu = m->target->kind == TARGET_TPU;
  if (cls == LINK_FAST) return tpu ? "comm (ICI)" : "comm (NVLink)";
  return tpu ? "comm (DCN)" : "comm (network)";
}

static int comm_stream(Sim *S, Timeline *tl, Dev *d, int cls) {
  if (d->comm[cls] < 0) {
    d->comm[cls] = sim_stream_add(tl->g, d->dev, SIM_STREAM_COMM, link_stream_name(S->mesh, cls));
    sim_stream_set_order(tl->g, d->comm[cls], SIM_ORDER_READY);
  }
  return d->comm[cls];
}

static int p2p_stream(Timeline *tl, Dev *d) {
  if (d->p2p < 0) d->p2p = sim_stream_add(tl->g, d->dev, SIM_STREAM_P2P, "p2p");
  return d->p2p;
}

static int link_class(const SimKernel *k) {
  return k->coll.link == LINK_DCN || k->coll.link == LINK_NETWORK ? LINK_SLOW : LINK_FAST;
}

static int prod_of(const Sim *S, const Value *v) { return v ? S->prod[v->id] : -1; }

static void dep(Timeline *tl, int before, int after) {
  if (before >= 0 && after >= 0 && before != after) sim_dep_add(tl->g, before, after, 0);
}

/* ---- labels ---- */

static const char *phase_suffix(int phase) {
  switch (phase) {
  case PHASE_LOSS: return " [loss]";
  case PHASE_BACKWARD: return " [backward]";
  case PHASE_RECOMPUTE: return " [recompute]";
  case PHASE_ACCUMULATE: return " [accumulate]";
  case PHASE_UPDATE: return " [optimizer]";
  default: return "";
  }
}

static const char *axes_text(Sim *S, uint16_t axes) {
  char buf[160];
  int n = 0, cnt = 0;
  for (int a = 0; a < S->mesh->naxes; a++) cnt += (axes >> a) & 1;
  buf[0] = 0;
  if (cnt > 1) n += snprintf(buf, sizeof buf, "(");
  for (int a = 0, k = 0; a < S->mesh->naxes && n < (int)sizeof buf - 24; a++)
    if ((axes >> a) & 1) n += snprintf(buf + n, sizeof buf - (size_t)n, "%s%s", k++ ? ", " : "", S->mesh->axes[a].name);
  if (cnt > 1) snprintf(buf + n, sizeof buf - (size_t)n, ")");
  return arena_printf(S->a, "%s", buf);
}

static const char *kernel_label(Sim *S, int ki) {
  if (S->kname[ki]) return S->kname[ki];
  const SimKernel *k = &S->c.kernels[ki];
  const Op *op = k->anchor;
  const Value *v = op->nresults ? op->results[0] : NULL;
  const char *name = v && v->name ? v->name : NULL;
  const char *s;
  switch (k->kind) {
  case SIMK_COLLECTIVE: {
    /* name what moves: the value, or the param whose gradient it is (partition.c's reasons) */
    const char *what = name;
    char grad[96];
    static const char lead[] = "the gradient of ";
    if (op->reason && strncmp(op->reason, lead, sizeof lead - 1) == 0) {
      const char *g = op->reason + sizeof lead - 1;
      size_t n = strcspn(g, " :,(");
      if (n > 0 && n < 80) snprintf(grad, sizeof grad, "grad %.*s", (int)n, g), what = grad;
    }
    s = arena_printf(S->a, "%s%s%s%s over %s%s", ir_op_name(op->kind), op->reduce_max ? " (max)" : "", what ? " " : "",
                     what ? what : "", axes_text(S, op->axes), phase_suffix(op->phase));
    break;
  }
  case SIMK_ATTENTION_BWD:
    s = "attention backward";
    break;
  case SIMK_FUSED:
    if (k->nops > 1)
      s = arena_printf(S->a, "fused %s%s%s (%d ops)%s", ir_op_label(op), name ? " " : "", name ? name : "",
                       k->nops, phase_suffix(op->phase));
    else
      s = arena_printf(S->a, "%s%s%s%s", ir_op_label(op), name ? " " : "", name ? name : "", phase_suffix(op->phase));
    break;
  default:
    s = arena_printf(S->a, "%s%s%s%s", ir_op_label(op), name ? " " : "", name ? name : "", phase_suffix(op->phase));
  }
  S->kname[ki] = s;
  return s;
}

/* ---- figures ---- */

typedef struct Iv {
  double t0, t1;
} Iv;

static int iv_cmp(const void *pa, const void *pb) {
  const Iv *a = pa, *b = pb;
  return a->t0 < b->t0 ? -1 : a->t0 > b->t0;
}

/* The union of the intervals, merged in place; returns how many remain. */
static int iv_merge(Iv *v, int n) {
  if (n == 0) return 0;
  qsort(v, (size_t)n, sizeof *v, iv_cmp);
  int k = 0;
  for (int i = 1; i < n; i++) {
    if (v[i].t0 <= v[k].t1) {
      if (v[i].t1 > v[k].t1) v[k].t1 = v[i].t1;
    } else {
      v[++k] = v[i];
    }
  }
  return k + 1;
}

/* Length of [t0, t1] covered by merged intervals v[0..n). */
static double iv_cover(const Iv *v, int n, double t0, double t1) {
  double s = 0;
  int lo = 0, hi = n; /* first interval ending after t0 */
  while (lo < hi) {
    int mid = (lo + hi) / 2;
    if (v[mid].t1 <= t0) lo = mid + 1;
    else hi = mid;
  }
  for (int i = lo; i < n && v[i].t0 < t1; i++) {
    double a = v[i].t0 > t0 ? v[i].t0 : t0, b = v[i].t1 < t1 ? v[i].t1 : t1;
    if (b > a) s += b - a;
  }
  return s;
}

/* Per device of tl: the merged compute intervals and the merged intervals of everything. Fills
 * tl->exposed for comm tasks. */
/* The tasks of tl grouped by device (a counting sort): device d's are order[first[d] ..
 * first[d + 1]), in id order. */
static void tl_by_device(const Timeline *tl, int ndev, int **first_out, int **order_out) {
  SimGraph *g = tl->g;
  int n = sim_task_count(g);
  const char *what = "the simulated devices' tasks";
  int *first = mem_calloc((size_t)ndev + 1, sizeof *first, what), *order = mem_alloc(sizeof *order * (size_t)n, what);
  int *fill = mem_alloc(sizeof *fill * ((size_t)ndev + 1), what);
  for (int t = 0; t < n; t++) first[sim_stream_device(g, sim_task_stream(g, t)) + 1]++;
  for (int d = 0; d < ndev; d++) first[d + 1] += first[d];
  memcpy(fill, first, sizeof *fill * (size_t)ndev);
  for (int t = 0; t < n; t++) order[fill[sim_stream_device(g, sim_task_stream(g, t))]++] = t;
  free(fill);
  *first_out = first, *order_out = order;
}

static void tl_exposure(Timeline *tl, int ndev, Iv **compute_out, int *ncompute, Iv **all_out, int *nall) {
  SimGraph *g = tl->g;
  int n = sim_task_count(g);
  tl->exposed = mem_realloc(tl->exposed, sizeof *tl->exposed * (size_t)n, "the collectives' exposure");
  int *first, *order;
  tl_by_device(tl, ndev, &first, &order);
  for (int dv = 0; dv < ndev; dv++) {
    int m = first[dv + 1] - first[dv];
    const char *what = "the simulated devices' busy intervals";
    Iv *cv = mem_alloc(sizeof *cv * (size_t)m, what), *av = mem_alloc(sizeof *av * (size_t)m, what);
    int nc = 0, na = 0;
    for (int k = first[dv]; k < first[dv + 1]; k++) {
      int t = order[k], s = sim_task_stream(g, t);
      double a = sim_task_start(g, t), b = sim_task_end(g, t);
      if (!(b > a)) continue;
      av[na++] = (Iv){a, b};
      if (sim_stream_kind(g, s) == SIM_STREAM_COMPUTE) cv[nc++] = (Iv){a, b};
    }
    nc = iv_merge(cv, nc);
    na = iv_merge(av, na);
    for (int k = first[dv]; k < first[dv + 1]; k++) {
      int t = order[k], s = sim_task_stream(g, t);
      tl->exposed[t] = 0;
      if (sim_stream_kind(g, s) == SIM_STREAM_COMPUTE) continue;
      double a = sim_task_start(g, t), b = sim_task_end(g, t);
      if (b > a) tl->exposed[t] = (b - a) - iv_cover(cv, nc, a, b);
    }
    if (compute_out) compute_out[dv] = cv, ncompute[dv] = nc;
    else free(cv);
    if (all_out) all_out[dv] = av, nall[dv] = na;
    else free(av);
  }
  free(first);
  free(order);
}

/* ---- items (the slowest ops and collectives) ---- */

typedef struct ItemKey {
  const Op *op;
  int tag;
} ItemKey;

typedef struct Items {
  SimItem *v;
  ItemKey *key;
  int n, cap;
  int *hash; /* open addressing, -1 empty */
  int hcap;
} Items;

static unsigned key_hash(const Op *op, int tag) {
  uintptr_t x = (uintptr_t)op;
  x ^= x >> 17;
  x *= 0x9E3779B97F4A7C15ull;
  return (unsigned)(x >> 32) ^ (unsigned)tag * 2654435761u;
}

static SimItem *item_get(Items *I, const Op *op, int tag) {
  if (I->n * 2 >= I->hcap) {
    int nh = I->hcap ? 2 * I->hcap : 1024;
    int *h = mem_alloc(sizeof *h * (size_t)nh, "the step's items");
    for (int i = 0; i < nh; i++) h[i] = -1;
    for (int i = 0; i < I->n; i++) {
      unsigned j = key_hash(I->key[i].op, I->key[i].tag) & (unsigned)(nh - 1);
      while (h[j] >= 0) j = (j + 1) & (unsigned)(nh - 1);
      h[j] = i;
    }
    free(I->hash);
    I->hash = h, I->hcap = nh;
  }
  unsigned j = key_hash(op, tag) & (unsigned)(I->hcap - 1);
  while (I->hash[j] >= 0) {
    int i = I->hash[j];
    if (I->key[i].op == op && I->key[i].tag == tag) return &I->v[i];
    j = (j + 1) & (unsigned)(I->hcap - 1);
  }
  if (I->n == I->cap) {
    I->cap = I->cap ? 2 * I->cap : 256;
    I->v = mem_realloc(I->v, sizeof *I->v * (size_t)I->cap, "the step's items");
    I->key = mem_realloc(I->key, sizeof *I->key * (size_t)I->cap, "the step's items");
  }
  I->hash[j] = I->n;
  I->key[I->n] = (ItemKey){op, tag};
  SimItem *it = &I->v[I->n++];
  memset(it, 0, sizeof *it);
  return it;
}

static void items_free(Items *I) {
  free(I->v);
  free(I->key);
  free(I->hash);
  memset(I, 0, sizeof *I);
}

/* The runs of a region or a block: on sub_mult (by Sub.index), a block standing for more
 * iterations than it ran split between its own timeline and its P-longer one. */
static void sub_runs(const Sub *sb, double weight, double *sub_mult) {
  if (sb->lin) {
    sub_mult[sb->index] += weight * (1 - sb->lin_m);
    sub_mult[sb->lin->index] += weight * sb->lin_m;
  } else {
    sub_mult[sb->index] += weight;
  }
}

static void items_add(Sim *S, Items *I, const Timeline *tl, double weight, double *sub_mult) {
  int n = sim_task_count(tl->g);
  for (int t = 0; t < n; t++) {
    const TaskInfo *in = &tl->info[t];
    double dur = sim_task_end(tl->g, t) - sim_task_start(tl->g, t);
    if (in->tag == TAG_REGION || in->tag == TAG_REPEAT) {
      if (in->sub >= 0) sub_runs(S->subs[in->sub], weight, sub_mult);
      continue;
    }
    SimItem *it = item_get(I, in->op, in->tag);
    if (!it->what) {
      it->op = in->op;
      it->loc = in->op ? in->op->loc : (SrcLoc){0};
      if (in->tag == TAG_KERNEL) {
        it->what = kernel_label(S, in->kernel);
        it->kind = S->c.kernels[in->kernel].kind;
      } else if (in->tag == TAG_ACCUM) {
        it->what = "pipeline: f32 gradient accumulation per microbatch";
        it->kind = SIMK_FUSED;
      } else {
        it->what = in->tag == TAG_SEND_ACT ? "pipeline: send activations to the next stage"
                                           : "pipeline: send gradients to the previous stage";
        it->kind = SIMK_COLLECTIVE;
      }
    }
    /* a gradient's pieces (dpwin.h): mb of its `pieces` pieces, a share of one run */
    it->runs += in->pieces > 1 ? weight * (in->mb > 0 ? in->mb : 1) / in->pieces : weight;
    it->time_s += weight * (dur > 0 ? dur : 0);
    if (tl->exposed) it->exposed_s += weight * tl->exposed[t];
    if (in->tag == TAG_KERNEL) it->flops += weight * S->c.kernels[in->kernel].flops;
  }
}

/* Every item of the timelines tls[i], each weighted w[i], with the regions and blocks they run
 * (subs made later first: a sub runs only subs made before it). keep_mult: record each sub's runs
 * (Sub.mult). */
static Items items_table(Sim *S, const Timeline *const *tls, const double *w, int n, bool keep_mult) {
  Items I = {0};
  double *mult = mem_calloc((size_t)S->nsubs + 1, sizeof *mult, "the step's items");
  for (int i = 0; i < n; i++)
    if (w[i] != 0) items_add(S, &I, tls[i], w[i], mult);
  for (int k = S->nsubs - 1; k >= 0; k--) {
    if (keep_mult) S->subs[k]->mult = mult[k];
    if (mult[k] != 0) items_add(S, &I, &S->subs[k]->tl, mult[k], mult);
  }
  free(mult);
  return I;
}

static int item_cmp(const void *pa, const void *pb) {
  const SimItem *a = pa, *b = pb;
  return a->time_s > b->time_s ? -1 : a->time_s < b->time_s;
}

/* ---- steady states ----
 * A timeline whose unit tasks (TaskInfo.unit) repeat one pattern per simulated device -- each unit
 * the same tasks, with the same durations and the same dependencies relative to the unit -- is
 * a max-plus system: a task starts when its stream and what it waits for let it. steady_period
 * checks, on a timeline of U units, that over a run of units [j, j2) every task of unit u + c
 * starts and ends exactly one shift after its counterpart in unit u (one shift for every device;
 * the first units warm up, the last ones may differ with nothing after them), the run being at
 * least 2 D + c + 1 units long, D the farthest (in units) a dependency, or two tasks one after the
 * other on a stream, reach. A task's times are fixed by the tasks within D units of it, so the
 * timeline of U + m c units is this one with m copies of the block [ins - c, ins) (ins = j + D + c)
 * inserted before unit ins, everything from there on moved m shifts later. That needs the tasks
 * outside the units to keep out of the way: on each device, what stays (units before the block,
 * and the other tasks no unit from ins on leads to through dependencies, streams and joins) ends
 * before what moves (units from ins on and what they lead to) starts. Every figure (makespan, busy
 * and exposed times, each item's runs and time) is then one linear function of m:
 * F(U + m c) = F(U) + m (F(U + c) - F(U)). tests/unit/test_sim_steady.c sets it against full
 * simulations. */

/* Times equal to this fraction of the makespan (rounding over long sums; a true drift exceeds it). */
#define PERIOD_TOL 1e-10

typedef struct StartKey {
  double start;
  int task;
} StartKey;

static int cmp_start(const void *pa, const void *pb) {
  const StartKey *a = pa, *b = pb;
  return a->start < b->start ? -1 : a->start > b->start ? 1 : (a->task > b->task) - (a->task < b->task);
}

/* Is tl periodic, c units at a time, from some unit on (the comment above)? */
static bool steady_period(const Timeline *tl, int c) {
  const SimGraph *g = tl->g;
  int n = sim_task_count(g), ndev = sim_device_count(g), nstreams = sim_stream_count(g);
  if (n == 0 || ndev == 0 || c < 1) return false;
  const char *what = "the steady state's check";
  double tol = PERIOD_TOL * sim_makespan(g);
  int *dev = mem_alloc(sizeof *dev * (size_t)n, what);
  int *nu = mem_calloc((size_t)ndev, sizeof *nu, what), *per = mem_calloc((size_t)ndev, sizeof *per, what);
  int *tot = mem_calloc((size_t)ndev, sizeof *tot, what), *base = mem_calloc((size_t)ndev + 1, sizeof *base, what);
  int *run = mem_calloc((size_t)ndev, sizeof *run, what);
  int *idx = NULL, *order = NULL, *sfirst = NULL;
  bool *reach = NULL;
  int *queue = NULL;
  bool ok = true;
  /* each device's unit tasks: units 0, 1, ... in order, each of per[d] tasks */
  for (int t = 0; t < n; t++) {
    int d = dev[t] = sim_stream_device(g, sim_task_stream(g, t)), u = tl->info[t].unit;
    if (u < 0) continue;
    if (u + 1 > nu[d]) nu[d] = u + 1;
    per[d] += u == 0;
    tot[d]++;
  }
  int umin = INT32_MAX;
  for (int d = 0; d < ndev; d++) {
    if (nu[d] == 0 || per[d] == 0 || tot[d] != nu[d] * per[d]) ok = false;
    if (nu[d] < umin) umin = nu[d];
    base[d + 1] = base[d] + tot[d];
  }
  if (!ok || umin <= c) goto done;
  idx = mem_alloc(sizeof *idx * (size_t)base[ndev], what);
  for (int t = 0; t < n && ok; t++) {
    int d = dev[t], u = tl->info[t].unit;
    if (u < 0) continue;
    int k = run[d]++;
    if (k / per[d] != u) ok = false;
    else idx[base[d] + k] = t;
  }
  if (!ok) goto done;
#define UNIT_TASK(d, u, i) idx[base[d] + (u) * per[d] + (i)]
  /* the periodic run: units u of [j, j2) are units u + c moved by one shift (the first units warm
   * up; the last may differ too, with nothing after them to compete with on a stream) */
  int j = 0, j2 = 0;
  double shift = 0;
  for (int u = 0, start = 0; u < umin - c; u++) {
    double su = sim_task_start(g, UNIT_TASK(0, u + c, 0)) - sim_task_start(g, UNIT_TASK(0, u, 0));
    bool same = u == start || fabs(su - shift) <= tol;
    for (int d = 0; d < ndev && same; d++)
      for (int i = 0; i < per[d] && same; i++) {
        int x = UNIT_TASK(d, u, i), y = UNIT_TASK(d, u + c, i);
        same = fabs(sim_task_start(g, y) - sim_task_start(g, x) - su) <= tol &&
               fabs(sim_task_end(g, y) - sim_task_end(g, x) - su) <= tol;
      }
    if (!same) { /* a run may start at the next unit */
      start = u + 1;
      continue;
    }
    if (u == start) shift = su;
    if (u + 1 - start > j2 - j) j = start, j2 = u + 1;
  }
  /* D: the dependencies, and the tasks each stream runs one after the other */
  order = mem_alloc(sizeof *order * (size_t)n, what);
  sfirst = mem_calloc((size_t)nstreams + 1, sizeof *sfirst, what);
  for (int t = 0; t < n; t++) sfirst[sim_task_stream(g, t) + 1]++;
  for (int s = 0; s < nstreams; s++) sfirst[s + 1] += sfirst[s];
  {
    int *fill = mem_alloc(sizeof *fill * (size_t)(nstreams + 1), what);
    StartKey *keys = mem_alloc(sizeof *keys * (size_t)n, what);
    memcpy(fill, sfirst, sizeof *fill * (size_t)(nstreams + 1));
    for (int t = 0; t < n; t++) keys[fill[sim_task_stream(g, t)]++] = (StartKey){sim_task_start(g, t), t};
    for (int s = 0; s < nstreams; s++) qsort(keys + sfirst[s], (size_t)(sfirst[s + 1] - sfirst[s]), sizeof *keys, cmp_start);
    for (int k = 0; k < n; k++) order[k] = keys[k].task;
    free(keys);
    free(fill);
  }
  int D = 0;
  for (int e = 0; e < sim_dep_count(g); e++) {
    int a, b;
    sim_dep_get(g, e, &a, &b);
    int ua = tl->info[a].unit, ub = tl->info[b].unit;
    if (ua >= 0 && ub >= 0 && abs(ua - ub) > D) D = abs(ua - ub);
  }
  for (int s = 0; s < nstreams; s++)
    for (int k = sfirst[s] + 1; k < sfirst[s + 1]; k++) {
      int ua = tl->info[order[k - 1]].unit, ub = tl->info[order[k]].unit;
      if (ua >= 0 && ub >= 0 && abs(ua - ub) > D) D = abs(ua - ub);
    }

  if (j2 - j < 2 * D + c + 1) {
    ok = false;
    goto done;
  }
  /* the copies go in after unit ins - 1: D periodic units before the block [ins - c, ins) they copy,
   * D after */
  int ins = j + D + c;
  /* what moves: units from ins on, and what waits for them (dependencies, streams, joins) */
  reach = mem_calloc((size_t)n, sizeof *reach, what);
  queue = mem_alloc(sizeof *queue * (size_t)n, what);
  int *succ_off = mem_calloc((size_t)n + 1, sizeof *succ_off, what), *succ, *at = mem_alloc(sizeof *at * (size_t)n, what);
  int *jhead = mem_alloc(sizeof *jhead * (size_t)n, what), *jnext = mem_alloc(sizeof *jnext * (size_t)n, what);
  for (int e = 0; e < sim_dep_count(g); e++) {
    int x, y;
    sim_dep_get(g, e, &x, &y);
    succ_off[x + 1]++;
  }
  for (int t = 0; t < n; t++) succ_off[t + 1] += succ_off[t];
  succ = mem_alloc(sizeof *succ * (size_t)(succ_off[n] + 1), what);
  memcpy(at, succ_off, sizeof *at * (size_t)n);
  for (int e = 0; e < sim_dep_count(g); e++) {
    int x, y;
    sim_dep_get(g, e, &x, &y);
    succ[at[x]++] = y;
  }
  for (int k = 0; k < n; k++) at[order[k]] = k; /* position in its stream's order */
  for (int t = 0; t < n; t++) jhead[t] = -1;
  for (int t = n - 1; t >= 0; t--) {
    int r = sim_task_join_group(g, t);
    jnext[t] = jhead[r], jhead[r] = t;
  }
  int qh = 0, qt = 0;
  for (int t = 0; t < n; t++)
    if (tl->info[t].unit >= ins) reach[t] = true, queue[qt++] = t;
#define VISIT(x)                                                                                       \
  do {                                                                                                 \
    int x_ = (x);                                                                                      \
    if (x_ >= 0 && tl->info[x_].unit < 0 && !reach[x_]) reach[x_] = true, queue[qt++] = x_;           \
  } while (0)
  while (qh < qt) {
    int t = queue[qh++], st = sim_task_stream(g, t), k = at[t];
    if (k + 1 < sfirst[st + 1]) VISIT(order[k + 1]);
    for (int m = jhead[sim_task_join_group(g, t)]; m >= 0; m = jnext[m]) VISIT(m);
    for (int i = succ_off[t]; i < succ_off[t + 1]; i++) VISIT(succ[i]);
  }
#undef VISIT
  /* on each device, what stays ends before what moves starts */
  double *lo = mem_alloc(sizeof *lo * (size_t)ndev, what), *hi = mem_alloc(sizeof *hi * (size_t)ndev, what);
  for (int d = 0; d < ndev; d++) lo[d] = INFINITY, hi[d] = -INFINITY;
  for (int t = 0; t < n; t++) {
    int d = dev[t], u = tl->info[t].unit;
    if (u >= ins || (u < 0 && reach[t])) lo[d] = fmin(lo[d], sim_task_start(g, t));
    else if (u < ins - c) hi[d] = fmax(hi[d], sim_task_end(g, t));
  }
  for (int d = 0; d < ndev && ok; d++) ok = hi[d] <= lo[d] + tol;
  free(lo), free(hi), free(succ_off), free(succ), free(at), free(jhead), free(jnext);
#undef UNIT_TASK
done:
  free(dev), free(nu), free(per), free(tot), free(base), free(run), free(idx), free(order), free(sfirst);
  free(reach), free(queue);
  return ok;
}

/* a + m (b - a): a figure at k, moved m periods along the line through its value at k + c. */
static double extrapolate(double a, double b, double m) { return a + m * (b - a); }

/* ---- the translation ---- */

static void build_func(Sim *S, Timeline *tl, Dev *d, const IrFunc *f, int stage, const LoopCtx *lc);

static bool on_stage(const Sim *S, const IrFunc *f, const Op *op, int stage) {
  return !(S->pi && f == S->m->main && stage >= 0) || dev_stage_runs(dev_op_runs(op), stage, S->pi->stages);
}

/* The period of a loop's timeline in iterations: a pipeline's permute inside it moves once every
 * DevColl.period iterations (devprog.h), else 1. 0 when a few periods would be too many iterations. */
static int64_t loop_period(const Op *loop) {
  int64_t P = 1;
  for (const Op *op = loop->body->first; op; op = op->next) {
    int64_t per = dev_op_period(op);
    if (op->kind != OP_PERMUTE || per <= 1) continue;
    int64_t a = P, b = per;
    while (b) {
      int64_t t = a % b;
      a = b, b = t;
    }
    P = P / a * per;
    if (P > 4096) return 0;
  }
  return P;
}

/* Iterations a block simulates, about: a probe of STEADY_UNITS periods, then k and k + cP. */
static double block_iterations(int64_t P) { return 3.0 * (STEADY_UNITS + STEADY_MAX_CYCLE) * (double)P; }

/* Tasks simulating f takes: each loop unrolled, or as a block when that is fewer (a pipeline is
 * never inside). An estimate, to decide what runs as a block. */
static double tasks_of(const Sim *S, const IrFunc *f) {
  double n = 0;
  for (const Op *op = f->first; op; op = op->next) {
    if (op->kind == OP_LOOP && op->body) {
      double it = (double)(op->count > 0 ? op->count : 1), P = (double)loop_period(op);
      if (P > 0 && block_iterations((int64_t)P) < it) it = block_iterations((int64_t)P);
      n += it * tasks_of(S, op->body);
      continue;
    }
    const SimKernel *k = sim_costs_kernel(&S->c, op);
    n += k && k->anchor == op && k->kind != SIMK_VIEW;
  }
  return n;
}

/* By value id of f's values: needs nothing an iteration computes (a loop body's stacked slices and
 * invariants, and what only they feed). */
static bool *hoistable(Sim *S, const Op *loop) {
  const IrFunc *b = loop->body;
  bool *h = ARENA_ARRAY(S->a, bool, S->m->nvalues + 1);
  for (int j = 0; j < b->ninputs; j++)
    h[b->inputs[j]->id] = j < loop->nslices || j >= loop->nslices + loop->ncarried;
  for (const Op *op = b->first; op; op = op->next) {
    if (op->kind == OP_LOOP || op->kind == OP_PIPELINE) continue;
    bool ok = op->kind != OP_INPUT;
    for (int i = 0; i < op->noperands && ok; i++) ok = h[op->operands[i]->id];
    for (int r = 0; r < op->nresults; r++) h[op->results[r]->id] = ok;
  }
  return h;
}

/* The iteration ends a gradient's pieces wait for, when loop issues some (DevWindow.piece_loop). */
static int32_t *piece_ends(Sim *S, const Op *loop) {
  for (int i = 0; i < S->npiece_loops; i++)
    if (S->piece_loop[i] == loop) return S->piece_end[i];
  return NULL;
}

static void piece_loops_find(Sim *S, const IrFunc *f) {
  for (const Op *op = f->first; op; op = op->next) {
    if (op->kind == OP_LOOP && op->body) piece_loops_find(S, op->body);
    const DevWindow *w = op->dev ? op->dev->win : NULL;
    if (!w || w->pieces < 2 || !w->piece_loop || piece_ends(S, w->piece_loop)) continue;
    const Op **pl = ARENA_ARRAY(S->a, const Op *, S->npiece_loops + 1);
    int32_t **pe = ARENA_ARRAY(S->a, int32_t *, S->npiece_loops + 1);
    if (S->npiece_loops) {
      memcpy(pl, S->piece_loop, sizeof *pl * (size_t)S->npiece_loops);
      memcpy(pe, S->piece_end, sizeof *pe * (size_t)S->npiece_loops);
    }
    pl[S->npiece_loops] = w->piece_loop;
    pe[S->npiece_loops] = ARENA_ARRAY(S->a, int32_t, w->piece_loop->count);
    for (int64_t i = 0; i < w->piece_loop->count; i++) pe[S->npiece_loops][i] = -1;
    S->piece_loop = pl, S->piece_end = pe, S->npiece_loops++;
  }
}

/* The loop's first n iterations, unrolled into tl. */
static void unroll(Sim *S, Timeline *tl, Dev *d, const Op *op, int stage, int64_t n) {
  const IrFunc *b = op->body;
  int nc = op->ncarried, ns = op->nslices;
  bool *h = hoistable(S, op);
  int32_t *carried = ARENA_ARRAY(S->a, int32_t, nc + 1);
  for (int j = 0; j < nc; j++) carried[j] = prod_of(S, op->operands[ns + j]);
  int marker_prev = d->last_compute;
  int32_t *ends = piece_ends(S, op);
  if (ends)
    for (int64_t i = 0; i < op->count; i++) ends[i] = -1;
  double outer = S->outer_runs;
  S->outer_runs = outer * (double)n;
  for (int64_t i = 0; i < n; i++) {
    for (int j = 0; j < b->ninputs && j < op->noperands; j++)
      S->prod[b->inputs[j]->id] = (j >= ns && j < ns + nc) ? carried[j - ns] : prod_of(S, op->operands[j]);
    int marker_now = d->last_compute;
    if (op == S->unit_loop) S->cur_unit = (int)(i / S->unit_period);
    LoopCtx lc = {.iter = i, .hoist = h, .marker = i == 0 ? marker_now : marker_prev};
    marker_prev = marker_now;
    build_func(S, tl, d, b, stage, &lc);
    for (int j = 0; j < nc; j++) carried[j] = prod_of(S, b->outputs[j]);
    if (ends && i < op->count) ends[i] = d->last_compute;
  }
  S->outer_runs = outer;
  if (op == S->unit_loop) S->cur_unit = -1;
  for (int r = 0; r < op->nresults && r < b->noutputs; r++)
    S->prod[op->results[r]->id] = r < nc ? carried[r] : prod_of(S, b->outputs[r]);
}

/* The f32 accumulation a pipeline region adds into its carried results (POUT_ACC): each run reads
 * the accumulator and the gradient and writes the accumulator back, one fused kernel each. */
static double accumulation_time(const Mesh *mesh, const Value *g, bool ideal) {
  double elems = sim_value_bytes(g) / (dtype_bytes(g->type.dtype) > 0 ? dtype_bytes(g->type.dtype) : 1);
  return cost_fused_chain(mesh->target, sim_value_bytes(g) + 2 * 4 * elems, 2, ideal, NULL);
}

double sim_pipe_accumulate_seconds(const Mesh *mesh, const PipeInfo *pi, int r, bool ideal) {
  const IrFunc *R = r >= 0 && r < PR__COUNT ? pi->region[r] : NULL;
  double t = 0;
  for (int i = 0; R && i < R->noutputs; i++)
    if (pi->out[r][i].kind == POUT_ACC) t += accumulation_time(mesh, R->outputs[i], ideal);
  return t;
}

static void build_accumulation(Sim *S, Sub *sb) {
  const PipeInfo *pi = sb->op->pipe;
  const IrFunc *R = sb->f;
  for (int i = 0; i < R->noutputs; i++) {
    if (pi->out[sb->region][i].kind != POUT_ACC) continue;
    const Value *g = R->outputs[i];
    double t = accumulation_time(S->mesh, g, S->ideal);
    int x = tl_add(S, &sb->tl, sb->d.compute, t,
                   arena_printf(S->a, "accumulate %s (f32)", g->name ? g->name : "gradient"), sb->op->loc,
                   (TaskInfo){sb->op, -1, -1, 0, 0, TAG_ACCUM, -1, 0});
    dep(&sb->tl, prod_of(S, g), x);
  }
}

static Sub *sub_new(const Sim *S, const IrFunc *f, const Op *op, int region, const char *name) {
  Sub *sb = mem_calloc(1, sizeof *sb, "a region's timeline");
  sb->f = f, sb->op = op, sb->region = region;
  sb->tl.g = sim_graph_new();
  sb->tl.contention = contention_of(S->mesh, S->ideal);
  dev_init(&sb->tl, &sb->d, name, 1);
  return sb;
}

/* Runs a sub's timeline and files it in S->subs. */
static void sub_finish(Sim *S, Sub *sb, const char *what) {
  if (!sim_run(sb->tl.g)) {
    diag_error(sb->op->loc, "internal error: the simulated timeline of %s cannot be scheduled (%d tasks wait)", what,
               sim_unscheduled(sb->tl.g));
    S->failed = true;
  }
  sb->time_s = sim_makespan(sb->tl.g);
  sim_device_stats(sb->tl.g, sb->d.dev, &sb->st);
  for (int c = 0; c < NLINK; c++) sb->link_used[c] = sb->d.comm[c] >= 0;
  tl_exposure(&sb->tl, 1, NULL, NULL, NULL, NULL);
  if (S->nsubs == S->capsubs) {
    S->capsubs = S->capsubs ? 2 * S->capsubs : 8;
    S->subs = mem_realloc(S->subs, sizeof *S->subs * (size_t)S->capsubs, "the simulated regions");
  }
  sb->index = S->nsubs;
  S->subs[S->nsubs++] = sb;
}

/* A pipeline region, simulated once. */
static Sub *region_sub(Sim *S, const IrFunc *f, const Op *op, int region) {
  for (int k = 0; k < S->nsubs; k++)
    if (S->subs[k]->f == f) return S->subs[k];
  static const char *const rnames[PR__COUNT] = {"region first", "region chunk forward", "region last",
                                                "region chunk backward", "region first backward"};
  Sub *sb = sub_new(S, f, op, region, rnames[region]);
  for (int j = 0; j < f->ninputs; j++) S->prod[f->inputs[j]->id] = -1;
  int was_unit = S->cur_unit;
  S->cur_unit = -1;
  build_func(S, &sb->tl, &sb->d, f, -1, NULL);
  S->cur_unit = was_unit;
  build_accumulation(S, sb);
  sub_finish(S, sb, "a pipeline region");
  return sb;
}

/* The loop alone with `iters` iterations, its operands there from the start; each run of P
 * iterations a unit (steady_period). */
static Sub *block_sub(Sim *S, const Op *loop, int stage, int64_t iters, int64_t P) {
  Sub *sb = sub_new(S, NULL, loop, -1, "loop block");
  sb->iters = iters;
  int32_t *saved = ARENA_ARRAY(S->a, int32_t, loop->noperands + 1);
  for (int i = 0; i < loop->noperands; i++) saved[i] = prod_of(S, loop->operands[i]);
  for (int i = 0; i < loop->noperands; i++) S->prod[loop->operands[i]->id] = -1;
  const Op *was_loop = S->unit_loop;
  int64_t was_period = S->unit_period;
  int was_unit = S->cur_unit;
  double was_runs = S->outer_runs; /* (built once, whatever runs it) */
  S->unit_loop = loop, S->unit_period = P, S->cur_unit = -1, S->outer_runs = 1;
  unroll(S, &sb->tl, &sb->d, loop, stage, iters);
  S->unit_loop = was_loop, S->unit_period = was_period, S->cur_unit = was_unit, S->outer_runs = was_runs;
  for (int i = 0; i < loop->noperands; i++) S->prod[loop->operands[i]->id] = saved[i];
  sub_finish(S, sb, "a loop");
  return sb;
}

/* Frees the last subs made (a steady state not found), when nothing made after them remains. */
static void subs_drop(Sim *S, Sub *const *sb, int n) {
  for (int i = n - 1; i >= 0; i--) {
    if (!sb[i] || sb[i]->index != S->nsubs - 1) continue;
    tl_free(&S->subs[--S->nsubs]->tl);
    free(S->subs[S->nsubs]);
  }
}

/* The cycle (in units, 1 .. STEADY_MAX_CYCLE) of a timeline's steady state, 0 none. */
static int steady_cycle(const Timeline *tl) {
  for (int c = 1; c <= STEADY_MAX_CYCLE; c++)
    if (steady_period(tl, c)) return c;
  return 0;
}

/* A loop of n iterations as one block (file comment): simulated alone with k0 = STEADY_UNITS P
 * iterations (k0 doubling while no steady state shows), its cycle c read off that, then with
 * k = n mod cP and k + cP iterations, both in their steady state, and its figures extrapolated to
 * n; or the whole loop simulated once that is cheaper. NULL after a located error (no steady
 * state within the budget). */
static Sub *block_for(Sim *S, const Op *loop, int stage, int64_t P) {
  int64_t n = loop->count;
  double body = tasks_of(S, loop->body), spent = 0;
  if (S->full) return block_sub(S, loop, stage, n, P);
  for (int64_t k0 = STEADY_UNITS * P; !S->failed; k0 *= 2) {
    if (3 * (k0 + STEADY_MAX_CYCLE * P) >= n) { /* the whole loop costs no more */
      if ((double)n * body > (double)S->budget) break;
      return block_sub(S, loop, stage, n, P);
    }
    spent += (double)k0 * body;
    if (spent > (double)S->budget) break;
    Sub *probe = block_sub(S, loop, stage, k0, P);
    int c = S->failed ? 0 : steady_cycle(&probe->tl);
    if (!c) {
      subs_drop(S, &probe, 1);
      continue;
    }
    int64_t step = c * P, k = k0 + (n - k0) % step;
    if (k != k0) subs_drop(S, &probe, 1);
    spent += (double)(k + step) * body + (k != k0 ? (double)k * body : 0);
    if (spent > (double)S->budget) break;
    Sub *a = k == k0 ? probe : block_sub(S, loop, stage, k, P), *b = block_sub(S, loop, stage, k + step, P);
    if (S->failed) return NULL;
    if (steady_period(&a->tl, c) && steady_period(&b->tl, c)) {
      double m = (double)(n - k) / (double)step;
      a->lin = b, a->lin_m = m;
      a->time_s = extrapolate(a->time_s, b->time_s, m);
      a->st.step_s = extrapolate(a->st.step_s, b->st.step_s, m);
      a->st.last_end_s = extrapolate(a->st.last_end_s, b->st.last_end_s, m);
      a->st.compute_s = extrapolate(a->st.compute_s, b->st.compute_s, m);
      a->st.comm_s = extrapolate(a->st.comm_s, b->st.comm_s, m);
      a->st.exposed_comm_s = extrapolate(a->st.exposed_comm_s, b->st.exposed_comm_s, m);
      a->st.idle_s = fmax(0, extrapolate(a->st.idle_s, b->st.idle_s, m));
      return a;
    }
    Sub *t[2] = {a, b};
    subs_drop(S, t, 2);
  }
  if (!S->failed)
    diag_error(loop->loc,
               "sim: this loop of %lld iterations (%.0f tasks each) shows no steady state within the %lld tasks sim "
               "simulates, and is too long to simulate whole (docs/sim.md, Limits)",
               (long long)n, body, (long long)S->budget);
  S->failed = true;
  return NULL;
}

static LoopMode *loop_mode(Sim *S, const Op *loop) {
  for (int i = 0; i < S->nmodes; i++)
    if (S->modes[i].loop == loop) return &S->modes[i];
  return NULL;
}

static void build_loop(Sim *S, Timeline *tl, Dev *d, const Op *op, int stage) {
  int64_t n = op->count > 0 ? op->count : 1;
  LoopMode *lm = loop_mode(S, op);
  if (!lm) { /* decided once: unrolled while the budget lasts, else a block */
    int64_t P = loop_period(op);
    /* (unrolled inside unrolled loops, it runs once per iteration of each) */
    double want = (double)n * tasks_of(S, op->body) * S->outer_runs;
    bool block = n > 1 && want > (double)(S->max_tasks - S->ntasks_total) && (P == 0 || (double)n > block_iterations(P));
    Sub *sb = NULL;
    if (block && P == 0) {
      diag_error(op->loc, "sim: this loop of %lld iterations moves a pipeline transfer too rarely to find its steady state",
                 (long long)n);
      S->failed = true;
      return;
    }
    if (block && !(sb = block_for(S, op, stage, P))) return;
    if (S->nmodes == S->capmodes) {
      S->capmodes = S->capmodes ? 2 * S->capmodes : 16;
      S->modes = mem_realloc(S->modes, sizeof *S->modes * (size_t)S->capmodes, "the simulated loops");
    }
    S->modes[S->nmodes] = (LoopMode){op, sb, -1, -1};
    lm = &S->modes[S->nmodes++];
    if (sb) S->blocks++;
  }
  if (!lm->block) {
    unroll(S, tl, d, op, stage, n);
    return;
  }
  Sub *sb = lm->block;
  const char *name =
      sb->lin ? arena_printf(S->a, "loop of %lld iterations (steady state from %lld simulated)", (long long)n, (long long)sb->iters)
              : arena_printf(S->a, "loop of %lld iterations", (long long)n);
  int prev = d->last_compute;
  int t = tl_add(S, tl, d->compute, sb->time_s, name, op->loc, (TaskInfo){op, -1, sb->index, 0, 0, TAG_REPEAT, -1, 0});
  for (int i = 0; i < op->noperands; i++) dep(tl, prod_of(S, op->operands[i]), t);
  lm->task = t, lm->prev = prev;
  d->last_compute = t;
  for (int r = 0; r < op->nresults; r++) S->prod[op->results[r]->id] = t;
}

/* ---- pipelines ---- */

static int region_of(int kind) {
  switch (kind) {
  case PA_FIRST: return PR_FIRST;
  case PA_FWD: return PR_CHUNK_FWD;
  case PA_LAST: return PR_LAST;
  case PA_BWD: return PR_CHUNK_BWD;
  case PA_FIRST_BWD: return PR_FIRST_BWD;
  default: return -1;
  }
}

static int64_t send_key(const PipeInfo *sched, bool backward, int mb, int chunk) {
  int64_t pv = (int64_t)sched->stages * sched->chunks;
  return ((int64_t)(backward ? 1 : 0) * sched->microbatches + mb) * pv + chunk;
}

/* The activation (or gradient) region r sends: its POUT_ACT output. */
static const Value *act_out(const PipeInfo *pi, int r) {
  const IrFunc *R = pi->region[r];
  if (!R) return NULL;
  for (int i = 0; i < R->noutputs; i++)
    if (pi->out[r][i].kind == POUT_ACT) return R->outputs[i];
  return NULL;
}

/* A transfer: the send over the stage axes, and under Megatron's scatter-gather (PipeInfo.send_split)
 * 1/n of it followed by the receiving stage's AllGather over the split axes. */
double sim_pipe_transfer_seconds(const Mesh *mesh, const PipeInfo *pi, int r, bool ideal) {
  const Value *v = r >= 0 && r < PR__COUNT ? act_out(pi, r) : NULL;
  if (!v) return 0;
  uint16_t stages = 0;
  for (int k = 0; k < pi->nstage_axes; k++) stages |= (uint16_t)(1u << pi->stage_axes[k]);
  double bytes = sim_value_bytes(v);
  uint16_t sp = pi->send_split;
  if (!sp) return cost_collective(mesh, COLL_PERMUTE, stages, bytes, ideal, NULL);
  double n = (double)sharding_axes_product(mesh, sp);
  return cost_collective(mesh, COLL_PERMUTE, stages, bytes / n, ideal, NULL) +
         cost_collective(mesh, COLL_ALL_GATHER, sp, bytes, ideal, NULL);
}

static double transfer_time(Sim *S, int r) { return sim_pipe_transfer_seconds(S->mesh, S->pi, r, S->ideal); }

/* What a stage's actions leave for the next ones. */
typedef struct PipeWalk {
  int last_region, first_region;
  int64_t pending[8]; /* receives not yet matched to the region that reads them */
  int npending;
  double xt[PR__COUNT];
} PipeWalk;

/* One action of stage d's schedule. */
static void pipe_action(Sim *S, Timeline *tl, Dev *d, const Op *op, const PipeAction *a, PipeWalk *w) {
  const PipeInfo *pi = op->pipe, *sched = S->sched;
  static const char *const rnames[PR__COUNT] = {"first", "forward", "last", "backward", "first backward"};
  int r = region_of(a->kind);
  if (r >= 0 && pi->region[r]) {
    Sub *sb = region_sub(S, pi->region[r], op, r);
    for (int c = 0; c < NLINK; c++)
      if (sb->link_used[c]) comm_stream(S, tl, d, c);
    const char *name = r == PR_CHUNK_FWD || r == PR_CHUNK_BWD
                           ? arena_printf(S->a, "%s chunk %d, microbatch %d", rnames[r], a->chunk, a->mb)
                           : arena_printf(S->a, "%s, microbatch %d", rnames[r], a->mb);
    int t = tl_add(S, tl, d->compute, sb->time_s, name, op->loc,
                   (TaskInfo){op, -1, sb->index, a->mb, a->chunk, TAG_REGION, -1, 0});
    if (w->first_region < 0) {
      w->first_region = t;
      for (int k = 0; k < op->noperands; k++) dep(tl, prod_of(S, op->operands[k]), t);
    }
    /* the region reads what was received for its own microbatch and chunk (a forward the
     * activation, a backward the gradient) */
    int64_t mine = send_key(sched, r == PR_CHUNK_BWD || r == PR_FIRST_BWD, a->mb, a->chunk);
    for (int k = 0; k < w->npending; k++) {
      if (w->pending[k] != mine) continue;
      if (S->nrecv == S->caprecv) {
        S->caprecv = S->caprecv ? 2 * S->caprecv : 1024;
        S->recv_wait = mem_realloc(S->recv_wait, sizeof *S->recv_wait * (size_t)S->caprecv, "the pipeline's receives");
        S->recv_task = mem_realloc(S->recv_task, sizeof *S->recv_task * (size_t)S->caprecv, "the pipeline's receives");
      }
      S->recv_wait[S->nrecv] = (int)mine, S->recv_task[S->nrecv++] = t;
      w->pending[k--] = w->pending[--w->npending];
    }
    w->last_region = t;
    d->last_compute = t;
    return;
  }
  if (a->kind == PA_SEND) {
    /* what the last region ran sends: a forward sends its activation, a backward its gradient */
    int rr = w->last_region >= 0 ? S->subs[tl->info[w->last_region].sub]->region : (a->backward ? PR_LAST : PR_FIRST);
    int x = tl_add(S, tl, p2p_stream(tl, d), w->xt[rr],
                   arena_printf(S->a, "send %s, microbatch %d, to stage %d", a->backward ? "gradient" : "activation",
                                a->mb, a->peer),
                   op->loc, (TaskInfo){op, -1, -1, a->mb, a->chunk, a->backward ? TAG_SEND_GRAD : TAG_SEND_ACT, -1, 0});
    dep(tl, w->last_region, x);
    S->send_task[send_key(sched, a->backward, a->mb, a->chunk)] = x;
  } else if (a->kind == PA_RECV && w->npending < (int)(sizeof w->pending / sizeof *w->pending)) {
    w->pending[w->npending++] = send_key(sched, a->backward, a->mb, a->chunk);
  }
}

/* Stage s's actions of the schedule being simulated (S->sched), on the stage's device, read off
 * its bounded form: each run of its steady span is a unit (steady_period; gpipe's two spans are
 * not one unit). */
static void build_pipeline(Sim *S, Timeline *tl, Dev *d, const Op *op, int s) {
  const PipeInfo *sched = S->sched;
  PipeWalk w = {.last_region = -1, .first_region = -1};
  for (int r = 0; r < PR__COUNT; r++) w.xt[r] = transfer_time(S, r);
  bool units = sched->schedule != SCHED_GPIPE;
  for (int i = sched->first_form[s]; i < sched->first_form[s + 1] && !S->failed;) {
    const PipeSpan *sp = schedule_span_at(sched, s, i);
    int len = sp ? sp->len : 1, reps = sp ? sp->reps : 1, stride = sp ? sp->stride : 0;
    for (int run = 0; run < reps && !S->failed; run++) {
      S->cur_unit = units && sp ? run : -1;
      for (int t = 0; t < len && !S->failed; t++) {
        PipeAction a = sched->form[i + t];
        a.mb += run * stride;
        pipe_action(S, tl, d, op, &a, &w);
      }
    }
    S->cur_unit = -1;
    i += len;
  }
  for (int r = 0; r < op->nresults; r++) S->prod[op->results[r]->id] = w.last_region;
  S->top->pipe_first[d - S->top->devs] = w.first_region;
  S->top->pipe_last[d - S->top->devs] = w.last_region;
}

/* ---- a function's ops ---- */

/* A gradient reduction issued where its window says (dpwin.h): after the value `after` is made (in
 * its last run: the last microbatch), or in pieces, piece i after iteration i of the piece loop,
 * each of the collective's bytes / pieces. Returns its (last) task; -2 when the window is not one of
 * those or cannot be read on this timeline (the loop that makes `after`, or the piece loop, ran
 * as a block: its tasks are another timeline's), and the collective waits for its operands. */
static int window_tasks(Sim *S, Timeline *tl, Dev *d, const Op *op, int ki, const DevWindow *w) {
  const SimKernel *k = &S->c.kernels[ki];
  if (w->kind != DPW_GRADIENT || !w->after) return -2;
  if (w->via) {
    const LoopMode *lm = loop_mode(S, w->via);
    if (!lm || lm->block) return -2;
  }
  int32_t *ends = w->pieces > 1 && w->piece_loop ? piece_ends(S, w->piece_loop) : NULL;
  const LoopMode *plm = ends ? loop_mode(S, w->piece_loop) : NULL;
  if (ends && plm && plm->block && plm->task >= 0) {
    /* the piece loop ran as a block (one task): the first pieces - 1 pieces issued beside it from
     * its start (each behind an iteration, as unrolled when a piece is shorter than an iteration),
     * the last after it */
    double piece = cost_collective_group(S->mesh, k->coll_kind, op->axes, op->coll ? op->coll->ngroup : 0,
                                         k->bytes / (double)w->pieces, S->ideal, NULL);
    int stream = comm_stream(S, tl, d, link_class(k));
    int a = tl_add(S, tl, stream, piece * (double)(w->pieces - 1),
                   arena_printf(S->a, "%s, pieces 1 to %lld (beside the loop run as a block)", kernel_label(S, ki),
                                (long long)w->pieces - 1),
                   op->loc, (TaskInfo){op, ki, -1, (int)(w->pieces - 1), 0, TAG_KERNEL, -1, (int)w->pieces});
    dep(tl, plm->prev, a);
    for (int i = 0; i < w->piece_loop->noperands; i++) dep(tl, prod_of(S, w->piece_loop->operands[i]), a);
    int b = tl_add(S, tl, stream, piece,
                   arena_printf(S->a, "%s, piece %lld of %lld", kernel_label(S, ki), (long long)w->pieces, (long long)w->pieces),
                   op->loc, (TaskInfo){op, ki, -1, 1, 0, TAG_KERNEL, -1, (int)w->pieces});
    dep(tl, plm->task, b);
    dep(tl, a, b);
    return b;
  }
  if (ends && (!plm || plm->block)) ends = NULL;
  for (int64_t i = 0; ends && i < w->pieces; i++)
    if (ends[i] < 0) ends = NULL;
  int stream = comm_stream(S, tl, d, link_class(k));
  if (!ends) {
    int t = tl_add(S, tl, stream, k->time_s, kernel_label(S, ki), op->loc, (TaskInfo){op, ki, -1, 0, 0, TAG_KERNEL, -1, 0});
    dep(tl, prod_of(S, w->after), t);
    return t;
  }
  double piece = cost_collective_group(S->mesh, k->coll_kind, op->axes, op->coll ? op->coll->ngroup : 0,
                                       k->bytes / (double)w->pieces, S->ideal, NULL);
  int t = -1;
  for (int64_t i = 0; i < w->pieces; i++) {
    t = tl_add(S, tl, stream, piece,
               arena_printf(S->a, "%s, piece %lld of %lld", kernel_label(S, ki), (long long)i + 1, (long long)w->pieces),
               op->loc, (TaskInfo){op, ki, -1, 1, 0, TAG_KERNEL, -1, (int)w->pieces});
    dep(tl, ends[i], t);
  }
  return t;
}

static void build_func(Sim *S, Timeline *tl, Dev *d, const IrFunc *f, int stage, const LoopCtx *lc) {
  for (const Op *op = f->first; op && !S->failed; op = op->next) {
    if (!on_stage(S, f, op, stage)) continue;
    if (op->kind == OP_LOOP && op->body) {
      build_loop(S, tl, d, op, stage);
      continue;
    }
    if (op->kind == OP_PIPELINE && op->pipe) {
      if (stage >= 0) build_pipeline(S, tl, d, op, stage);
      continue;
    }
    int ki = op->nresults ? S->c.kernel_of[op->results[0]->id] : -1;
    if (ki < 0) {
      for (int r = 0; r < op->nresults; r++) S->prod[op->results[r]->id] = -1;
      continue;
    }
    const SimKernel *k = &S->c.kernels[ki];
    if (k->kind == SIMK_VIEW) {
      S->prod[op->results[0]->id] = prod_of(S, op->operands[0]);
      continue;
    }
    /* a pipeline's stage-to-stage permute inside a loop moves once every DevColl.period iterations */
    if (op->kind == OP_PERMUTE && dev_op_period(op) > 1 && lc && (lc->iter + 1) % dev_op_period(op) != 0) {
      S->prod[op->results[0]->id] = prod_of(S, op->operands[0]);
      continue;
    }
    if (k->anchor == op) {
      bool coll = k->kind == SIMK_COLLECTIVE;
      /* a data-parallel collective's overlap window (dpwin.h); without one, the rule of the file
       * comment: one whose operand the iteration does not compute is prefetched an iteration ahead */
      const DevWindow *w = coll && !k->blocking && op->dev ? op->dev->win : NULL;
      bool prefetch = w ? w->kind == DPW_PREFETCH : lc && lc->hoist && lc->hoist[op->operands[0]->id] && !k->blocking;
      int t = w ? window_tasks(S, tl, d, op, ki, w) : -2;
      if (t == -2) {
        int stream = coll ? comm_stream(S, tl, d, link_class(k)) : d->compute;
        t = tl_add(S, tl, stream, k->time_s, kernel_label(S, ki), op->loc, (TaskInfo){op, ki, -1, 0, 0, TAG_KERNEL, -1, 0});
        for (int i = 0; i < k->nins; i++) dep(tl, prod_of(S, k->ins[i]), t);
      }
      if (coll && prefetch && lc) dep(tl, lc->marker, t);
      if (coll && k->blocking) { /* dp_overlap = off (overlap.c) */
        dep(tl, d->last_compute, t);
        d->block = t;
      }
      if (!coll && d->block >= 0) {
        dep(tl, d->block, t);
        d->block = -1;
      }
      if (!coll) d->last_compute = t;
      if (coll && S->pi && f == S->m->main && (op->axes & S->stage_mask)) {
        if (S->njoins == S->capjoins) {
          S->capjoins = S->capjoins ? 2 * S->capjoins : 16;
          S->joins = mem_realloc(S->joins, sizeof *S->joins * (size_t)S->capjoins, "the simulated step's joins");
        }
        S->joins[S->njoins++] = (JoinRec){op, t};
      }
      S->ktask[ki] = t;
    } else if (k->kind == SIMK_FUSED) {
      continue; /* a member before its group's root: read only inside the group */
    }
    for (int r = 0; r < op->nresults; r++) S->prod[op->results[r]->id] = S->ktask[ki];
  }
}

/* ---- tokens ---- */

static double global_elements(const TensorType *t, int skip_last) {
  double n = 1;
  for (int i = 0; i < t->rank - skip_last; i++) n *= (double)t->dims[i]->size;
  return n;
}

/* Tokens a step processes: the labels' elements (cross entropy: one per token), the rows of mse
 * labels (all dims but the last), or for a forward alone its first input's elements (token ids)
 * or rows (embeddings: all dims but the last). */
static double tokens_per_step(const IrModule *m) {
  const IrFunc *f = m->main;
  if (m->step && m->step->in_labels >= 0 && m->step->in_labels < f->ninputs) {
    const Value *l = f->inputs[m->step->in_labels];
    return global_elements(&l->type, dtype_is_int(l->type.dtype) ? 0 : 1);
  }
  if (f->ninputs == 0) return 0;
  const Value *x = f->inputs[0];
  return global_elements(&x->type, dtype_is_int(x->type.dtype) ? 0 : 1);
}


/* ---- the step ---- */

typedef struct Detail { /* what sim_trace_write needs */
  Timeline top;
  Sub **subs;
  int nsubs;
  const Mesh *mesh;
  Dev *devs;
  int ndevs;
  SimReport summary; /* the figures (otherData) */
  BufPlan plan;      /* with each stage's memory profile (the trace's counter tracks), in m's arena */
} Detail;

static void top_free(Top *T) {
  tl_free(&T->tl);
  free(T->devs);
  free(T->pipe_first);
  free(T->pipe_last);
  free(T->stages);
  memset(T, 0, sizeof *T);
}

/* The step with schedule `sched` (S->pi at its own or at fewer microbatches; NULL without a
 * pipeline): built, run, and its figures per simulated device. */
static void top_build(Sim *S, Top *T, const PipeInfo *sched) {
  const IrModule *m = S->m;
  int64_t devices = S->mesh->devices;
  memset(T, 0, sizeof *T);
  S->top = T, S->sched = sched;
  T->tl.g = sim_graph_new();
  T->tl.contention = contention_of(S->mesh, S->ideal);
  T->ndevs = S->pi ? S->pi->stages : 1;
  T->devs = mem_calloc((size_t)T->ndevs, sizeof *T->devs, "the simulated devices");
  T->pipe_first = mem_alloc(sizeof(int) * (size_t)T->ndevs, "the simulated devices");
  T->pipe_last = mem_alloc(sizeof(int) * (size_t)T->ndevs, "the simulated devices");
  for (int s = 0; s < T->ndevs; s++) T->pipe_first[s] = T->pipe_last[s] = -1;
  for (int i = 0; i <= m->nvalues; i++) S->prod[i] = -1;
  S->nrecv = S->njoins = 0;
  if (S->pi) {
    T->nmb = sched->microbatches;
    int64_t nkeys = 2 * (int64_t)sched->microbatches * sched->stages * sched->chunks;
    S->send_task = mem_alloc(sizeof *S->send_task * (size_t)nkeys, "the pipeline's sends");
    for (int64_t i = 0; i < nkeys; i++) S->send_task[i] = -1;
    for (int s = 0; s < T->ndevs && !S->failed; s++) {
      dev_init(&T->tl, &T->devs[s],
               arena_printf(S->a, "stage %d (%lld devices)", s, (long long)(devices / T->ndevs)), devices / T->ndevs);
      for (int j = 0; j < m->main->ninputs; j++) S->prod[m->main->inputs[j]->id] = -1;
      build_func(S, &T->tl, &T->devs[s], m->main, s, NULL);
    }
    for (int i = 0; i < S->nrecv; i++) dep(&T->tl, S->send_task[S->recv_wait[i]], S->recv_task[i]);
    for (int i = 0; i < S->njoins; i++)
      for (int j = i + 1; j < S->njoins; j++)
        if (S->joins[j].op == S->joins[i].op) sim_task_join(T->tl.g, S->joins[i].task, S->joins[j].task);
    free(S->send_task);
    S->send_task = NULL;
  } else {
    dev_init(&T->tl, &T->devs[0], arena_printf(S->a, "every device (%lld)", (long long)devices), devices);
    build_func(S, &T->tl, &T->devs[0], m->main, -1, NULL);
  }
  if (S->failed) return;
  T->ok = sim_run(T->tl.g);
  if (!T->ok)
    diag_error(S->p->entry ? S->p->entry->loc : (SrcLoc){0},
               "internal error: the simulated step cannot be scheduled (%d tasks wait forever)", sim_unscheduled(T->tl.g));

  /* figures per simulated device */
  int nd = T->ndevs;
  Iv **all = mem_calloc((size_t)nd, sizeof *all, "the simulated devices' busy intervals");
  int *nall = mem_calloc((size_t)nd, sizeof *nall, "the simulated devices' busy intervals");
  tl_exposure(&T->tl, nd, NULL, NULL, all, nall);
  int *dfirst, *dorder;
  tl_by_device(&T->tl, nd, &dfirst, &dorder);
  T->step_s = sim_makespan(T->tl.g);
  T->stages = mem_calloc((size_t)nd, sizeof *T->stages, "the simulated devices");
  /* the pipeline runs from the first stage's first region to the last region any stage runs */
  double pipe_t0 = INFINITY, pipe_t1 = -INFINITY;
  for (int s = 0; S->pi && s < nd; s++)
    if (T->pipe_first[s] >= 0) {
      pipe_t0 = fmin(pipe_t0, sim_task_start(T->tl.g, T->pipe_first[s]));
      pipe_t1 = fmax(pipe_t1, sim_task_end(T->tl.g, T->pipe_last[s]));
    }
  for (int s = 0; s < nd; s++) {
    SimDeviceStats st;
    sim_device_stats(T->tl.g, T->devs[s].dev, &st);
    SimStageStats *x = &T->stages[s];
    x->stage = S->pi ? s : -1;
    x->represents = st.represents;
    x->compute_s = st.compute_s;
    x->comm_s = st.comm_s;
    x->exposed_comm_s = st.exposed_comm_s;
    x->end_s = st.last_end_s;
    double idle = st.idle_s;
    /* a region or block counts as compute on this timeline: what it held that was not compute is
     * its own exposed communication (and idle, none on one device) */
    for (int k = dfirst[T->devs[s].dev]; k < dfirst[T->devs[s].dev + 1]; k++) {
      const TaskInfo *in = &T->tl.info[dorder[k]];
      if (in->sub < 0) continue;
      const Sub *sb = S->subs[in->sub];
      x->compute_s -= sb->time_s - sb->st.compute_s;
      x->exposed_comm_s += sb->st.exposed_comm_s;
      x->comm_s += sb->st.comm_s;
      idle += sb->st.idle_s;
    }
    if (S->pi && pipe_t1 > pipe_t0) { /* idle while the pipeline runs: its fill and drain */
      x->bubble_s = (pipe_t1 - pipe_t0) - iv_cover(all[s], nall[s], pipe_t0, pipe_t1);
      if (x->bubble_s < 0) x->bubble_s = 0;
    }
    x->idle_s = idle - x->bubble_s;
    if (x->idle_s < 0) x->idle_s = 0;
    free(all[s]);
  }
  free(all);
  free(nall);
  free(dfirst);
  free(dorder);
}

/* a's figures moved to k + m P microbatches along the line through b. */
static void top_extrapolate(Top *a, const Top *b, double m) {
  a->step_s = extrapolate(a->step_s, b->step_s, m);
  for (int s = 0; s < a->ndevs; s++) {
    SimStageStats *x = &a->stages[s];
    const SimStageStats *y = &b->stages[s];
    x->compute_s = extrapolate(x->compute_s, y->compute_s, m);
    x->comm_s = extrapolate(x->comm_s, y->comm_s, m);
    x->exposed_comm_s = extrapolate(x->exposed_comm_s, y->exposed_comm_s, m);
    x->bubble_s = fmax(0, extrapolate(x->bubble_s, y->bubble_s, m)); /* (rounding: never below 0) */
    x->idle_s = fmax(0, extrapolate(x->idle_s, y->idle_s, m));
    x->end_s = extrapolate(x->end_s, y->end_s, m);
  }
}

/* pi's schedule at n microbatches (the regions are pi's). */
static const PipeInfo *schedule_at(Sim *S, int n) {
  if (n == S->pi->microbatches) return S->pi;
  PipeInfo *q = ARENA_NEW(S->a, PipeInfo);
  *q = *S->pi;
  q->microbatches = n;
  const char *why = NULL;
  return schedule_build(S->a, q, S->pi->region[PR_CHUNK_BWD] != NULL, &why) ? q : NULL;
}

static SrcLoc schedule_loc(const Sim *S) {
  const Step *st = S->p->step;
  if (st && st->key_loc[SK_MICROBATCHES].file) return st->key_loc[SK_MICROBATCHES];
  if (st && st->key_loc[SK_SCHEDULE].file) return st->key_loc[SK_SCHEDULE];
  return S->m->pipeline ? S->m->pipeline->loc : (SrcLoc){0};
}

/* Tasks the step takes at this schedule: its actions, roughly (receives are none, main's ops a
 * few). Past the budget: a located error at `microbatches`. */
static bool schedule_affordable(Sim *S, const PipeInfo *sched, bool searched) {
  if ((double)sched->nactions <= (double)WHOLE_PIPELINE_BUDGETS * (double)S->budget) return true;
  diag_error(schedule_loc(S),
             "sim: microbatches = %d on a pipeline of %d stages x %d chunk%s is too large to simulate: its schedule "
             "takes about %.3g tasks, more than the %lld sim simulates%s (docs/sim.md, Limits)",
             sched->microbatches, sched->stages, sched->chunks, sched->chunks == 1 ? "" : "s", (double)sched->nactions,
             (long long)(WHOLE_PIPELINE_BUDGETS * S->budget), searched ? " (and no steady state was found)" : "");
  S->failed = true;
  return false;
}

/* The step, simulated in full or, for a 1f1b or interleaved pipeline of many microbatches, from
 * its steady state (file comment): a probe at k0 microbatches (STEADY_UNITS units on every stage;
 * k0 doubling while none shows) gives the cycle c, then k = N mod cP and k + cP microbatches, both
 * certified by steady_period, give the figures of N. On return T holds the step (at k when
 * extrapolated), *items the items, *simulated k (0: all simulated) and *period cP. */
static void simulate_step(Sim *S, Top *T, Items *items, int *simulated, int *period, bool full) {
  *simulated = *period = 0;
  const PipeInfo *pi = S->pi;
  bool searched = false;
  if (pi && pi->region[PR_CHUNK_BWD] && pi->schedule != SCHED_GPIPE && !full) {
    int64_t N = pi->microbatches, p = pi->stages, V = pi->chunks;
    bool il = pi->schedule == SCHED_INTERLEAVED && V > 1;
    int64_t P = il ? p : 1, warm = il ? 2 * (p - 1) + (V - 1) * p : p - 1, unit = il ? p * V : 1;
    int64_t k0 = P * ((warm + STEADY_UNITS * unit + P * V - 1) / (P * V));
    double spent = 0;
    for (; !S->failed && 3 * (k0 + STEADY_MAX_CYCLE * P) < N; k0 *= 2) {
      searched = true;
      const PipeInfo *probe = schedule_at(S, (int)k0);
      /* (a search that could not afford the two simulations after its probe is not started) */
      if (!probe || (spent += (double)probe->nactions) > (double)S->budget / 3) break;
      top_build(S, T, probe);
      int c = S->failed || !T->ok ? 0 : steady_cycle(&T->tl);
      if (!c) {
        top_free(T);
        continue;
      }
      int64_t step = c * P, k = k0 + (N - k0) % step;
      const PipeInfo *sa = schedule_at(S, (int)k), *sb = schedule_at(S, (int)(k + step));
      if (!sa || !sb) break;
      if (k != k0) {
        top_free(T);
        if ((spent += (double)sa->nactions) > (double)S->budget) break;
        top_build(S, T, sa);
      }
      if ((spent += (double)sb->nactions) > (double)S->budget) break;
      Top B;
      top_build(S, &B, sb);
      bool ok = !S->failed && T->ok && B.ok && steady_period(&T->tl, c) && steady_period(&B.tl, c);
      if (ok) {
        double m = (double)(N - k) / (double)step, w = 1.0 / T->ndevs;
        const Timeline *tls[2] = {&T->tl, &B.tl};
        double ws[2] = {w * (1 - m), w * m};
        *items = items_table(S, tls, ws, 2, true);
        top_extrapolate(T, &B, m);
        *simulated = (int)k;
        *period = (int)step;
      }
      top_free(&B);
      if (ok || S->failed) return;
      top_free(T);
    }
    top_free(T);
  }
  if (S->failed || (pi && !S->full && !schedule_affordable(S, pi, searched))) return;
  top_build(S, T, pi);
  if (S->failed) return;
  const Timeline *tl = &T->tl;
  double w = 1.0 / T->ndevs;
  *items = items_table(S, &tl, &w, 1, true);
}

bool sim_program(const Program *p, const IrModule *m, const SimOptions *o, SimReport *out) {
  memset(out, 0, sizeof *out);
  if (!p || !m || !m->main || !p->mesh) return false;
  const char *was = mem_activity("simulating the step");
  Sim S = {.p = p, .m = m, .mesh = p->mesh, .a = m->arena, .ideal = o && o->ideal};
  S.max_tasks = o && o->max_tasks > 0 ? o->max_tasks : DEFAULT_MAX_TASKS;
  S.budget = S.max_tasks > DEFAULT_MAX_TASKS ? S.max_tasks : DEFAULT_MAX_TASKS;
  S.full = o && o->full;
  S.cur_unit = -1;
  S.outer_runs = 1;
  sim_costs_build(S.a, m, S.mesh, S.ideal, &S.c);
  sim_costs_apply_step(&S.c, m, p->step);
  S.prod = mem_alloc(sizeof *S.prod * (size_t)(m->nvalues + 1), "the simulated step");
  S.ktask = mem_alloc(sizeof *S.ktask * (size_t)(S.c.nkernels + 1), "the simulated step");
  S.kname = mem_calloc((size_t)S.c.nkernels + 1, sizeof *S.kname, "the simulated step");
  for (int i = 0; i <= S.c.nkernels; i++) S.ktask[i] = -1;
  piece_loops_find(&S, m->main);
  S.pi = m->pipeline ? m->pipeline->pipe : NULL;
  for (int k = 0; S.pi && k < S.pi->nstage_axes; k++) S.stage_mask |= (uint16_t)(1u << S.pi->stage_axes[k]);
  int64_t devices = S.mesh->devices;

  Top T = {0};
  Items I = {0};
  int simulated = 0, period = 0;
  simulate_step(&S, &T, &I, &simulated, &period, S.full);
  bool ok = !S.failed && T.ok;
  out->ideal = S.ideal;
  out->devices = devices;
  if (ok) {
    out->step_s = T.step_s;
    out->nstages = T.ndevs;
    out->stages = T.stages;
    T.stages = NULL;
    for (int s = 0; s < T.ndevs; s++) {
      const SimStageStats *x = &out->stages[s];
      out->compute_s += x->compute_s / T.ndevs;
      out->comm_s += x->comm_s / T.ndevs;
      out->exposed_comm_s += x->exposed_comm_s / T.ndevs;
      out->bubble_s += x->bubble_s / T.ndevs;
      out->idle_s += x->idle_s / T.ndevs;
    }
    if (I.n > 1) qsort(I.v, (size_t)I.n, sizeof *I.v, item_cmp); /* (no items: I.v is NULL) */
    out->items = I.v;
    out->nitems = I.n;
    I.v = NULL;
  }
  items_free(&I);

  /* FLOPs (memory.c's count, check's flops_per_step), MFU, tokens */
  StepFlops fl;
  step_flops(m, &fl);
  bool training = m->step != NULL;
  out->model_flops_per_step = (training ? 3 : 1) * fl.forward;
  out->flops_per_step = out->model_flops_per_step + (training ? fl.recompute : 0);
  out->peak_flops = cost_peak_flops(S.mesh->target, DT_BF16, true);
  out->mfu = sim_mfu(out->model_flops_per_step, out->step_s, (double)devices, out->peak_flops);
  out->hfu = sim_mfu(out->flops_per_step, out->step_s, (double)devices, out->peak_flops);
  out->tokens_per_step = tokens_per_step(m);
  out->tokens_per_s = out->step_s > 0 ? out->tokens_per_step / out->step_s : 0;
  out->tasks = S.ntasks_total;
  out->steady_loops = S.blocks;
  out->microbatches = S.pi ? S.pi->microbatches : 0;
  out->microbatches_simulated = simulated;
  out->microbatches_period = period;

  if (ok && o && o->keep_graph) {
    Detail *dt = mem_calloc(1, sizeof *dt, "the trace");
    dt->top = T.tl;
    dt->subs = S.subs;
    dt->nsubs = S.nsubs;
    dt->mesh = S.mesh;
    dt->devs = T.devs;
    dt->ndevs = T.ndevs;
    dt->summary = *out;
    bufplan_build_profile(m->arena, m, p, &dt->plan);
    out->detail = dt;
    T.devs = NULL;
    memset(&T.tl, 0, sizeof T.tl);
  } else {
    for (int k = 0; k < S.nsubs; k++) {
      tl_free(&S.subs[k]->tl);
      free(S.subs[k]);
    }
    free(S.subs);
  }
  top_free(&T);
  free(S.prod);
  free(S.ktask);
  free(S.kname);
  free(S.send_task);
  free(S.recv_wait);
  free(S.recv_task);
  free(S.joins);
  free(S.modes);
  mem_activity(was);
  return ok;
}

void sim_report_free(SimReport *r) {
  if (!r) return;
  free(r->stages);
  free(r->items);
  Detail *dt = r->detail;
  if (dt) {
    tl_free(&dt->top);
    for (int k = 0; k < dt->nsubs; k++) {
      tl_free(&dt->subs[k]->tl);
      free(dt->subs[k]);
    }
    free(dt->subs);
    free(dt->devs);
    free(dt);
  }
  memset(r, 0, sizeof *r);
}

double sim_days_for_tokens(double tokens, double tokens_per_s) {
  return tokens_per_s > 0 ? tokens / tokens_per_s / 86400.0 : 0;
}

/* ---- the Chrome trace ----
 * Written as a stream (a large pipeline has hundreds of thousands of slices): the Trace Event
 * Format's {"traceEvents": [...]}, one process per simulated device, one thread per stream,
 * complete ("X") events in microseconds. A region or repeated block is a slice on the compute
 * thread; its own kernels nest under it (and its collectives on the device's comm threads) for
 * every run when that stays under TRACE_NEST_MAX slices, else for the first microbatch's (or
 * iteration's) runs only. */

enum { TRACE_NEST_MAX = 200000 };

static void json_str(FILE *f, const char *s) {
  fputc('"', f);
  for (; s && *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
    else if (c < 0x20) fprintf(f, "\\u%04x", c);
    else fputc(c, f);
  }
  fputc('"', f);
}

static const char *base_name(const char *path) {
  const char *s = strrchr(path, '/');
  return s ? s + 1 : path;
}

static void trace_event(FILE *f, bool *first, const SimGraph *g, int task, double t0, int pid, int tid,
                        int64_t represents, const char *extra) {
  const char *file;
  int line;
  const char *name = sim__task_name(g, task, &file, &line);
  double dur = sim_task_end(g, task) - sim_task_start(g, task);
  fputs(*first ? "\n" : ",\n", f);
  *first = false;
  fputs("{\"name\":", f);
  char where[320] = "";
  if (file && line > 0) snprintf(where, sizeof where, "%s:%d", base_name(file), line);
  if (where[0]) {
    char label[600];
    snprintf(label, sizeof label, "%s (%s)", name, where);
    json_str(f, label);
  } else {
    json_str(f, name);
  }
  fprintf(f, ",\"cat\":\"%s\",\"ph\":\"X\",\"ts\":%.6f,\"dur\":%.6f,\"pid\":%d,\"tid\":%d,\"args\":{",
          sim_stream_kind_name(sim_stream_kind(g, sim_task_stream(g, task))), t0 * 1e6, (dur > 0 ? dur : 0) * 1e6, pid,
          tid);
  bool comma = false;
  if (where[0]) {
    fputs("\"loc\":", f);
    json_str(f, where);
    comma = true;
  }
  if (represents > 1) fprintf(f, "%s\"represents\":%lld", comma ? "," : "", (long long)represents), comma = true;
  if (extra) fprintf(f, "%s%s", comma ? "," : "", extra);
  fputs("}}", f);
}

static void trace_meta(FILE *f, bool *first, const char *what, int pid, int tid, const char *key, const char *sval,
                       double nval) {
  fputs(*first ? "\n" : ",\n", f);
  *first = false;
  fprintf(f, "{\"name\":\"%s\",\"ph\":\"M\",\"pid\":%d", what, pid);
  if (tid >= 0) fprintf(f, ",\"tid\":%d", tid);
  fprintf(f, ",\"args\":{\"%s\":", key);
  if (sval) json_str(f, sval);
  else fprintf(f, "%.0f", nval);
  fputs("}}", f);
}

/* A collective's args in the trace: its kind, the bytes cost.h takes (the gathered array for an
 * all-gather, else the operand, per device), the link class it rides and its mesh axes. */
static void coll_args(const Detail *dt, const Op *op, char *buf, size_t n) {
  buf[0] = 0;
  if (!op || !ir_op_is_collective(op->kind) || op->noperands < 1 || op->nresults < 1 || !dt->mesh) return;
  CollKind k = op->kind == OP_ALL_GATHER ? COLL_ALL_GATHER : op->kind == OP_REDUCE_SCATTER ? COLL_REDUCE_SCATTER
             : op->kind == OP_ALL_REDUCE ? COLL_ALL_REDUCE : op->kind == OP_ALL_TO_ALL ? COLL_ALL_TO_ALL : COLL_PERMUTE;
  double bytes = sim_value_bytes(k == COLL_ALL_GATHER ? op->results[0] : op->operands[0]);
  CollCost cc;
  cost_collective(dt->mesh, k, op->axes, bytes, dt->summary.ideal, &cc);
  int w = snprintf(buf, n, "\"collective\":\"%s\",\"bytes\":%.0f,\"link\":\"%s\",\"axes\":[", ir_op_name(op->kind), bytes,
                   cc.link_name ? cc.link_name : "?");
  bool c = false;
  for (int a = 0; a < dt->mesh->naxes && w > 0 && w < (int)n - 40; a++)
    if ((op->axes >> a) & 1) {
      w += snprintf(buf + w, n - (size_t)w, "%s\"%s\"", c ? "," : "", dt->mesh->axes[a].name);
      c = true;
    }
  if (w > 0 && w < (int)n - 2) snprintf(buf + w, n - (size_t)w, "]");
  else buf[0] = 0;
}

/* Flow events from each collective to the compute task that waits for it (a dependency of the
 * timeline g, shown at offset t0 on device pid, or each stream's own device for pid < 0; tid_of maps
 * g's streams to the trace's threads, NULL: the same ids). */
static void trace_flows(FILE *f, bool *first, const SimGraph *g, const TaskInfo *info, double t0, int pid,
                        const int *tid_of, int *next_id) {
  for (int e = 0; e < sim_dep_count(g); e++) {
    int a, b;
    if (!sim_dep_get(g, e, &a, &b)) continue;
    const Op *op = info[a].op;
    if (!op || info[a].tag != TAG_KERNEL || !ir_op_is_collective(op->kind)) continue;
    int sa = sim_task_stream(g, a), sb = sim_task_stream(g, b);
    if (sim_stream_kind(g, sb) != SIM_STREAM_COMPUTE || sim_stream_kind(g, sa) == SIM_STREAM_COMPUTE) continue;
    double a0 = sim_task_start(g, a), b0 = sim_task_start(g, b);
    if (!(a0 == a0) || !(b0 == b0)) continue;
    int id = (*next_id)++;
    fprintf(f, "%s{\"name\":\"waits for\",\"cat\":\"flow\",\"ph\":\"s\",\"id\":%d,\"pid\":%d,\"tid\":%d,\"ts\":%.6f}",
            *first ? "\n" : ",\n", id, pid >= 0 ? pid : sim_stream_device(g, sa), tid_of ? tid_of[sa] : sa, (t0 + a0) * 1e6);
    *first = false;
    fprintf(f, ",\n{\"name\":\"waits for\",\"cat\":\"flow\",\"ph\":\"f\",\"bp\":\"e\",\"id\":%d,\"pid\":%d,\"tid\":%d,\"ts\":%.6f}",
            id, pid >= 0 ? pid : sim_stream_device(g, sb), tid_of ? tid_of[sb] : sb, (t0 + b0) * 1e6);
  }
}

/* ---- memory counter tracks ----
 * Per simulated device a counter "memory" ("ph": "C") with one series per class (params, grads,
 * optimizer, activations, temporaries): the bytes live as the buffer plan walks the stage's ops of
 * main (bufplan_build_profile, the figures of `check`), each at the start of the op's task on the
 * device's compute stream; an op without one there (a collective, a fused group's other ops, an
 * unrolled loop: its body's peak) at the end of the task before it. Ops that fall at one time keep
 * the largest, so the track's largest total is check's peak for the stage (ring attention's
 * arriving block aside). A loop's or a pipeline's peak is held across its whole span. */
typedef struct OpSpan { const Op *op; double t0, t1; } OpSpan;

static int span_cmp(const void *a, const void *b) {
  uintptr_t x = (uintptr_t)((const OpSpan *)a)->op, y = (uintptr_t)((const OpSpan *)b)->op;
  return x < y ? -1 : x > y;
}

static void counter_event(FILE *f, bool *first, int pid, double ts, const int64_t c[BUF__COUNT]) {
  fprintf(f, "%s{\"name\":\"memory\",\"cat\":\"memory\",\"ph\":\"C\",\"pid\":%d,\"ts\":%.6f,\"args\":{", *first ? "\n" : ",\n",
          pid, ts * 1e6);
  *first = false;
  for (int k = 0; k < BUF__COUNT; k++) fprintf(f, "%s\"%s\":%lld", k ? "," : "", bufplan_class_name(k), (long long)c[k]);
  fputs("}}", f);
}

static void trace_memory(FILE *f, bool *first, const Detail *dt, int d) {
  const SimGraph *g = dt->top.g;
  const BufPlan *bp = &dt->plan;
  int s = bp->nstages == sim_device_count(g) ? d : 0;
  if (s >= bp->nstages || !bp->stages[s].prof) return;
  const BufStage *st = &bp->stages[s];
  OpSpan *sp = malloc(sizeof *sp * (size_t)(sim_task_count(g) + 1));
  if (!sp) return;
  int n = 0;
  for (int t = 0; t < sim_task_count(g); t++) {
    int ss = sim_task_stream(g, t);
    double t0 = sim_task_start(g, t);
    if (sim_stream_device(g, ss) != d || sim_stream_kind(g, ss) != SIM_STREAM_COMPUTE || !(t0 == t0) || !dt->top.info[t].op)
      continue;
    sp[n++] = (OpSpan){dt->top.info[t].op, t0, sim_task_end(g, t)};
  }
  qsort(sp, (size_t)n, sizeof *sp, span_cmp);
  int k = 0; /* one span per op: its first start, its last end */
  for (int i = 0; i < n; i++) {
    if (k > 0 && sp[k - 1].op == sp[i].op) {
      sp[k - 1].t0 = fmin(sp[k - 1].t0, sp[i].t0), sp[k - 1].t1 = fmax(sp[k - 1].t1, sp[i].t1);
      continue;
    }
    sp[k++] = sp[i];
  }
  double prev_end = 0, ts = -1;
  int64_t cur[BUF__COUNT] = {0}, curtot = -1;
  for (int i = 0; i < st->nprof; i++) {
    OpSpan key = {st->prof_ops[i], 0, 0};
    const OpSpan *hit = k ? bsearch(&key, sp, (size_t)k, sizeof *sp, span_cmp) : NULL;
    double at = fmax(hit ? hit->t0 : prev_end, ts);
    int64_t tot = 0;
    const int64_t *u = st->prof + (size_t)i * BUF__COUNT;
    for (int c = 0; c < BUF__COUNT; c++) tot += u[c];
    if (at != ts) { /* a new time: the values at the last one are final */
      if (curtot >= 0) counter_event(f, first, d, ts, cur);
      ts = at, curtot = -1;
    }
    if (tot > curtot) memcpy(cur, u, sizeof cur), curtot = tot;
    if (hit) prev_end = fmax(prev_end, hit->t1);
  }
  if (curtot >= 0) counter_event(f, first, d, ts, cur);
  free(sp);
}

static bool trace_write_to(const SimReport *r, FILE *f) {
  const Detail *dt = r->detail;
  if (!dt) return false;
  const SimGraph *g = dt->top.g;
  bool first = true;
  fputs("{\"traceEvents\":[", f);
  for (int d = 0; d < sim_device_count(g); d++) {
    trace_meta(f, &first, "process_name", d, -1, "name", sim__device_name(g, d), 0);
    trace_meta(f, &first, "process_sort_index", d, -1, "sort_index", NULL, d);
  }
  for (int s = 0; s < sim_stream_count(g); s++) {
    int d = sim_stream_device(g, s);
    trace_meta(f, &first, "thread_name", d, s, "name", sim__stream_name(g, s), 0);
    trace_meta(f, &first, "thread_sort_index", d, s, "sort_index", NULL, s);
  }
  int n = sim_task_count(g);
  double nested = 0;
  for (int t = 0; t < n; t++)
    if (dt->top.info[t].sub >= 0) nested += sim_task_count(dt->subs[dt->top.info[t].sub]->tl.g);
  bool nest_all = nested <= TRACE_NEST_MAX;
  int flow_id = 1;
  for (int t = 0; t < n; t++) {
    double t0 = sim_task_start(g, t);
    if (!(t0 == t0)) continue;
    int s = sim_task_stream(g, t), d = sim_stream_device(g, s);
    const TaskInfo *in = &dt->top.info[t];
    char extra[512] = "";
    if (in->tag == TAG_REGION) snprintf(extra, sizeof extra, "\"microbatch\":%d,\"chunk\":%d", in->mb, in->chunk);
    else if (in->tag == TAG_KERNEL) coll_args(dt, in->op, extra, sizeof extra);
    trace_event(f, &first, g, t, t0, d, s, sim__device_represents(g, d), extra[0] ? extra : NULL);
    if (in->sub < 0 || !(nest_all || in->mb == 0)) continue;
    const Sub *sb = dt->subs[in->sub];
    const Dev *dv = &dt->devs[d];
    const SimGraph *sg = sb->tl.g;
    for (int u = 0; u < sim_task_count(sg); u++) {
      double u0 = sim_task_start(sg, u);
      if (!(u0 == u0)) continue;
      int ss = sim_task_stream(sg, u), tid = dv->compute;
      for (int c = 0; c < NLINK; c++)
        if (ss == sb->d.comm[c] && dv->comm[c] >= 0) tid = dv->comm[c];
      char ex[512];
      coll_args(dt, sb->tl.info[u].tag == TAG_KERNEL ? sb->tl.info[u].op : NULL, ex, sizeof ex);
      trace_event(f, &first, sg, u, t0 + u0, d, tid, 0, ex[0] ? ex : NULL);
    }
    int *tid_of = malloc(sizeof(int) * (size_t)(sim_stream_count(sg) > 0 ? sim_stream_count(sg) : 1));
    if (tid_of) {
      for (int ss = 0; ss < sim_stream_count(sg); ss++) {
        tid_of[ss] = dv->compute;
        for (int c = 0; c < NLINK; c++)
          if (ss == sb->d.comm[c] && dv->comm[c] >= 0) tid_of[ss] = dv->comm[c];
      }
      trace_flows(f, &first, sg, sb->tl.info, t0, d, tid_of, &flow_id);
      free(tid_of);
    }
  }
  trace_flows(f, &first, g, dt->top.info, 0, -1, NULL, &flow_id);
  for (int d = 0; d < sim_device_count(g); d++) trace_memory(f, &first, dt, d);
  const SimReport *x = &dt->summary;
  fprintf(f, "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{\"generator\":\"shardc sim\",\"ideal\":%s,"
             "\"step_time_s\":%.9g,\"mfu\":%.6g,\"devices\":%lld,\"simulated_devices\":%d",
          x->ideal ? "true" : "false", x->step_s, x->mfu, (long long)x->devices, x->nstages);
  if (x->microbatches_simulated) /* the trace holds k microbatches; the figures are N's */
    fprintf(f, ",\"microbatches\":%d,\"microbatches_simulated\":%d", x->microbatches, x->microbatches_simulated);
  fputs("}}\n", f);
  return !ferror(f);
}

bool sim_report_trace_write(const SimReport *r, const char *path, char *err, size_t n) {
  if (!r || !r->detail || !path) {
    snprintf(err, n, "no trace was kept");
    return false;
  }
  OutFile *f = outfile_open(path, OUTFILE_DATA, err, n);
  if (!f) return false;
  trace_write_to(r, outfile_stream(f)); /* a write error is sticky: outfile_commit reports it */
  return outfile_commit(f, err, n);
}

char *sim_report_trace_text(const SimReport *r) {
  if (!r || !r->detail) return NULL;
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  if (!f) return NULL;
  bool ok = trace_write_to(r, f);
  fclose(f);
  if (!ok) {
    free(buf);
    return NULL;
  }
  return buf;
}
