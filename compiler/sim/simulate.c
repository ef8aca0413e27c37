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
 * further (the gathered weights of two layers at most, as FSDP and XLA bound them). Gradient
 * reductions wait only for their gradient, so they overlap the rest of the backward. What a
 * collective leaves exposed is whatever of it no compute overlaps.
 *
 * Pipelines. Each region (ir.h's PipeRegion) is simulated alone once (its ops, its loop of layers
 * and its collectives, and the f32 accumulation of the gradients it yields), and each stage runs
 * the schedule's actions: a region as one task of that duration, a send as a transfer on the p2p
 * stream (cost_collective(COLL_PERMUTE) over the stage axes), which the receiving stage's next
 * region waits for. A loop whose unrolling would pass the task limit is simulated the same way:
 * its body alone, then each iteration one task.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "diag.h"
#include "opcost.h"
#include "outfile.h"
#include "partition.h"
#include "route.h"
#include "sim.h"
#include "sim_int.h"
#include "stages.h"
#include "step.h"

enum { TAG_KERNEL, TAG_ACCUM, TAG_SEND_ACT, TAG_SEND_GRAD, TAG_REGION, TAG_REPEAT };
enum { LINK_FAST, LINK_SLOW, NLINK };
enum { DEFAULT_MAX_TASKS = 4000000 };

typedef struct TaskInfo {
  const Op *op;    /* the kernel's anchor; the pipeline op or the loop for the others */
  int kernel;      /* TAG_KERNEL: its kernel, else -1 */
  int sub;         /* TAG_REGION, TAG_REPEAT: the sub-timeline it runs, else -1 */
  int mb, chunk;   /* TAG_REGION, sends: microbatch and model chunk */
  uint8_t tag;
} TaskInfo;

/* One timeline and what each of its tasks stands for. */
typedef struct Timeline {
  SimGraph *g;
  TaskInfo *info;
  int n, cap;
  double *exposed; /* after the run, by task: the part of a comm task no compute overlaps */
} Timeline;

typedef struct Dev {
  int dev, compute, p2p, comm[NLINK];
  int last_compute; /* the last compute task added, -1 */
} Dev;

/* A function simulated alone: a pipeline region, or the body of a loop run as repeated blocks. */
typedef struct Sub {
  const IrFunc *f;
  const Op *op;        /* the pipeline or the loop */
  int region;          /* PR_* or -1 */
  Timeline tl;
  Dev d;
  double time_s;       /* its makespan */
  SimDeviceStats st;
  bool link_used[NLINK];
  double mult;         /* runs per step over all simulated devices (the items' weights) */
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
  int64_t max_tasks, ntasks_total;
  Sub **subs;
  int nsubs, capsubs;
  Timeline top;
  Dev *devs;
  int ndevs;
  const PipeInfo *pi;
  uint16_t stage_mask;
  /* pipeline, while building */
  int32_t *send_task;  /* by (backward, mb, chunk) */
  int *recv_wait, *recv_task; /* pairs: key, region task that waits for it */
  int nrecv, caprecv;
  double *pipe_t0, *pipe_t1; /* by simulated device: its first region's start, last one's end */
  int *pipe_first, *pipe_last; /* the tasks */
  JoinRec *joins;
  int njoins, capjoins;
  int repeated;
} Sim;

static void *xrealloc(void *p, size_t n) {
  void *q = realloc(p, n ? n : 1);
  if (!q) abort();
  return q;
}

/* ---- timelines ---- */

static int tl_add(Sim *S, Timeline *tl, int stream, double dur, const char *name, SrcLoc loc, TaskInfo info) {
  int t = sim_task_add(tl->g, stream, dur, name, loc);
  if (t < 0) return -1;
  if (t >= tl->cap) {
    tl->cap = tl->cap ? 2 * tl->cap : 1024;
    while (tl->cap <= t) tl->cap *= 2;
    tl->info = xrealloc(tl->info, sizeof *tl->info * (size_t)tl->cap);
  }
  tl->info[t] = info;
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

static void dev_init(Timeline *tl, Dev *d, const char *name, int64_t represents) {
  d->dev = sim_device_add(tl->g, name, represents);
  d->compute = sim_stream_add(tl->g, d->dev, SIM_STREAM_COMPUTE, "compute");
  d->p2p = -1;
  d->comm[LINK_FAST] = d->comm[LINK_SLOW] = -1;
  d->last_compute = -1;
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

/* ---- the translation ---- */

static void build_func(Sim *S, Timeline *tl, Dev *d, const IrFunc *f, int stage, const LoopCtx *lc);
static Sub *sub_for(Sim *S, const IrFunc *f, const Op *op, int region);
static int sub_index(const Sim *S, const Sub *sb);

static bool on_stage(const Sim *S, const IrFunc *f, const Op *op, int stage) {
  return !(S->pi && f == S->m->main && stage >= 0) || stages_runs_on(op->place, stage, S->pi->stages);
}

/* Tasks the unrolled body of f would add (loops at their trips; a pipeline is never inside). */
static double tasks_of(const Sim *S, const IrFunc *f) {
  double n = 0;
  for (const Op *op = f->first; op; op = op->next) {
    if (op->kind == OP_LOOP && op->body) {
      n += (double)(op->count > 0 ? op->count : 1) * tasks_of(S, op->body);
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

static void build_loop(Sim *S, Timeline *tl, Dev *d, const Op *op, int stage) {
  const IrFunc *b = op->body;
  int64_t n = op->count > 0 ? op->count : 1;
  int nc = op->ncarried, ns = op->nslices;
  if ((double)n * tasks_of(S, b) > (double)(S->max_tasks - S->ntasks_total) && n > 1) {
    /* repeated blocks: the body simulated alone, each iteration one task of its time */
    Sub *sb = sub_for(S, b, op, -1);
    const char *name = arena_printf(S->a, "loop iteration (x%lld, repeated)", (long long)n);
    int first = -1, t = -1;
    for (int64_t i = 0; i < n; i++) {
      t = tl_add(S, tl, d->compute, sb->time_s, name, op->loc, (TaskInfo){op, -1, sub_index(S, sb), (int)i, 0, TAG_REPEAT});
      if (first < 0) first = t;
    }
    for (int i = 0; i < op->noperands; i++) dep(tl, prod_of(S, op->operands[i]), first);
    d->last_compute = t;
    for (int r = 0; r < op->nresults; r++) S->prod[op->results[r]->id] = t;
    S->repeated++;
    return;
  }
  bool *h = hoistable(S, op);
  int32_t *carried = ARENA_ARRAY(S->a, int32_t, nc + 1);
  for (int j = 0; j < nc; j++) carried[j] = prod_of(S, op->operands[ns + j]);
  int marker_prev = d->last_compute;
  for (int64_t i = 0; i < n; i++) {
    for (int j = 0; j < b->ninputs && j < op->noperands; j++)
      S->prod[b->inputs[j]->id] = (j >= ns && j < ns + nc) ? carried[j - ns] : prod_of(S, op->operands[j]);
    int marker_now = d->last_compute;
    LoopCtx lc = {.iter = i, .hoist = h, .marker = i == 0 ? marker_now : marker_prev};
    marker_prev = marker_now;
    build_func(S, tl, d, b, stage, &lc);
    for (int j = 0; j < nc; j++) carried[j] = prod_of(S, b->outputs[j]);
  }
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
                   (TaskInfo){sb->op, -1, -1, 0, 0, TAG_ACCUM});
    dep(&sb->tl, prod_of(S, g), x);
  }
}

static Sub *sub_for(Sim *S, const IrFunc *f, const Op *op, int region) {
  for (int k = 0; k < S->nsubs; k++)
    if (S->subs[k]->f == f) return S->subs[k];
  Sub *sb = calloc(1, sizeof *sb);
  if (!sb) abort();
  sb->f = f, sb->op = op, sb->region = region;
  sb->tl.g = sim_graph_new();
  static const char *const rnames[PR__COUNT] = {"region first", "region chunk forward", "region last",
                                                "region chunk backward", "region first backward"};
  dev_init(&sb->tl, &sb->d, region >= 0 ? rnames[region] : "loop body", 1);
  for (int j = 0; j < f->ninputs; j++) S->prod[f->inputs[j]->id] = -1;
  build_func(S, &sb->tl, &sb->d, f, -1, NULL);
  if (region >= 0) build_accumulation(S, sb);
  if (!sim_run(sb->tl.g)) {
    diag_error(op->loc, "internal error: the simulated timeline of %s cannot be scheduled (%d tasks wait)",
               region >= 0 ? "a pipeline region" : "a loop body", sim_unscheduled(sb->tl.g));
  }
  sb->time_s = sim_makespan(sb->tl.g);
  sim_device_stats(sb->tl.g, sb->d.dev, &sb->st);
  for (int c = 0; c < NLINK; c++) sb->link_used[c] = sb->d.comm[c] >= 0;
  if (S->nsubs == S->capsubs) {
    S->capsubs = S->capsubs ? 2 * S->capsubs : 8;
    S->subs = xrealloc(S->subs, sizeof *S->subs * (size_t)S->capsubs);
  }
  S->subs[S->nsubs++] = sb;
  return sb;
}

static int sub_index(const Sim *S, const Sub *sb) {
  for (int k = 0; k < S->nsubs; k++)
    if (S->subs[k] == sb) return k;
  return -1;
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

static int64_t send_key(const PipeInfo *pi, bool backward, int mb, int chunk) {
  int64_t pv = (int64_t)pi->stages * pi->chunks;
  return ((int64_t)(backward ? 1 : 0) * pi->microbatches + mb) * pv + chunk;
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

static void build_pipeline(Sim *S, Timeline *tl, Dev *d, const Op *op, int s) {
  const PipeInfo *pi = op->pipe;
  static const char *const rnames[PR__COUNT] = {"first", "forward", "last", "backward", "first backward"};
  int last_region = -1, first_region = -1;
  int64_t pending[8]; /* receives not yet matched to the region that reads them */
  int npending = 0;
  double xt[PR__COUNT];
  for (int r = 0; r < PR__COUNT; r++) xt[r] = transfer_time(S, r);
  for (int i = pi->first_action[s]; i < pi->first_action[s + 1]; i++) {
    const PipeAction *a = &pi->actions[i];
    int r = region_of(a->kind);
    if (r >= 0 && pi->region[r]) {
      Sub *sb = sub_for(S, pi->region[r], op, r);
      for (int c = 0; c < NLINK; c++)
        if (sb->link_used[c]) comm_stream(S, tl, d, c);
      const char *name = r == PR_CHUNK_FWD || r == PR_CHUNK_BWD
                             ? arena_printf(S->a, "%s chunk %d, microbatch %d", rnames[r], a->chunk, a->mb)
                             : arena_printf(S->a, "%s, microbatch %d", rnames[r], a->mb);
      int t = tl_add(S, tl, d->compute, sb->time_s, name, op->loc,
                     (TaskInfo){op, -1, sub_index(S, sb), a->mb, a->chunk, TAG_REGION});
      if (first_region < 0) {
        first_region = t;
        for (int k = 0; k < op->noperands; k++) dep(tl, prod_of(S, op->operands[k]), t);
      }
      /* the region reads what was received for its own microbatch and chunk (a forward the
       * activation, a backward the gradient) */
      int64_t mine = send_key(pi, r == PR_CHUNK_BWD || r == PR_FIRST_BWD, a->mb, a->chunk);
      for (int k = 0; k < npending; k++) {
        if (pending[k] != mine) continue;
        if (S->nrecv == S->caprecv) {
          S->caprecv = S->caprecv ? 2 * S->caprecv : 1024;
          S->recv_wait = xrealloc(S->recv_wait, sizeof *S->recv_wait * (size_t)S->caprecv);
          S->recv_task = xrealloc(S->recv_task, sizeof *S->recv_task * (size_t)S->caprecv);
        }
        S->recv_wait[S->nrecv] = (int)mine, S->recv_task[S->nrecv++] = t;
        pending[k--] = pending[--npending];
      }
      last_region = t;
      d->last_compute = t;
      continue;
    }
    if (a->kind == PA_SEND) {
      /* what the last region ran sends: a forward sends its activation, a backward its gradient */
      int rr = last_region >= 0 ? S->subs[tl->info[last_region].sub]->region : (a->backward ? PR_LAST : PR_FIRST);
      int x = tl_add(S, tl, p2p_stream(tl, d), xt[rr],
                     arena_printf(S->a, "send %s, microbatch %d, to stage %d", a->backward ? "gradient" : "activation",
                                  a->mb, a->peer),
                     op->loc, (TaskInfo){op, -1, -1, a->mb, a->chunk, a->backward ? TAG_SEND_GRAD : TAG_SEND_ACT});
      dep(tl, last_region, x);
      S->send_task[send_key(pi, a->backward, a->mb, a->chunk)] = x;
    } else if (a->kind == PA_RECV && npending < (int)(sizeof pending / sizeof *pending)) {
      pending[npending++] = send_key(pi, a->backward, a->mb, a->chunk);
    }
  }
  for (int r = 0; r < op->nresults; r++) S->prod[op->results[r]->id] = last_region;
  S->pipe_first[d - S->devs] = first_region;
  S->pipe_last[d - S->devs] = last_region;
}

/* ---- a function's ops ---- */

static void build_func(Sim *S, Timeline *tl, Dev *d, const IrFunc *f, int stage, const LoopCtx *lc) {
  for (const Op *op = f->first; op; op = op->next) {
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
    /* a pipeline's stage-to-stage permute inside a loop moves once every coll_period iterations */
    if (op->kind == OP_PERMUTE && op->coll_period > 1 && lc && (lc->iter + 1) % op->coll_period != 0) {
      S->prod[op->results[0]->id] = prod_of(S, op->operands[0]);
      continue;
    }
    if (k->anchor == op) {
      bool coll = k->kind == SIMK_COLLECTIVE;
      int stream = coll ? comm_stream(S, tl, d, link_class(k)) : d->compute;
      int t = tl_add(S, tl, stream, k->time_s, kernel_label(S, ki), op->loc, (TaskInfo){op, ki, -1, 0, 0, TAG_KERNEL});
      for (int i = 0; i < k->nins; i++) dep(tl, prod_of(S, k->ins[i]), t);
      if (coll && lc && lc->hoist && lc->hoist[op->operands[0]->id]) dep(tl, lc->marker, t);
      if (!coll) d->last_compute = t;
      if (coll && S->pi && f == S->m->main && (op->axes & S->stage_mask)) {
        if (S->njoins == S->capjoins) {
          S->capjoins = S->capjoins ? 2 * S->capjoins : 16;
          S->joins = xrealloc(S->joins, sizeof *S->joins * (size_t)S->capjoins);
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
  int *first = calloc((size_t)ndev + 1, sizeof *first), *order = malloc(sizeof *order * (size_t)(n > 0 ? n : 1));
  int *fill = malloc(sizeof *fill * ((size_t)ndev + 1));
  if (!first || !order || !fill) abort();
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
  tl->exposed = xrealloc(tl->exposed, sizeof *tl->exposed * (size_t)(n > 0 ? n : 1));
  int *first, *order;
  tl_by_device(tl, ndev, &first, &order);
  for (int dv = 0; dv < ndev; dv++) {
    int m = first[dv + 1] - first[dv];
    Iv *cv = malloc(sizeof *cv * (size_t)(m > 0 ? m : 1)), *av = malloc(sizeof *av * (size_t)(m > 0 ? m : 1));
    if (!cv || !av) abort();
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
    int *h = malloc(sizeof *h * (size_t)nh);
    if (!h) abort();
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
    I->v = xrealloc(I->v, sizeof *I->v * (size_t)I->cap);
    I->key = xrealloc(I->key, sizeof *I->key * (size_t)I->cap);
  }
  I->hash[j] = I->n;
  I->key[I->n] = (ItemKey){op, tag};
  SimItem *it = &I->v[I->n++];
  memset(it, 0, sizeof *it);
  return it;
}

static void items_add(Sim *S, Items *I, Timeline *tl, double weight, double *sub_mult) {
  int n = sim_task_count(tl->g);
  for (int t = 0; t < n; t++) {
    const TaskInfo *in = &tl->info[t];
    double dur = sim_task_end(tl->g, t) - sim_task_start(tl->g, t);
    if (in->tag == TAG_REGION || in->tag == TAG_REPEAT) {
      if (in->sub >= 0) sub_mult[in->sub] += weight;
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
    it->runs += weight;
    it->time_s += weight * (dur > 0 ? dur : 0);
    if (tl->exposed) it->exposed_s += weight * tl->exposed[t];
    if (in->tag == TAG_KERNEL) it->flops += weight * S->c.kernels[in->kernel].flops;
  }
}

static int item_cmp(const void *pa, const void *pb) {
  const SimItem *a = pa, *b = pb;
  return a->time_s > b->time_s ? -1 : a->time_s < b->time_s;
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
} Detail;

bool sim_program(const Program *p, const IrModule *m, const SimOptions *o, SimReport *out) {
  memset(out, 0, sizeof *out);
  if (!p || !m || !m->main || !p->mesh) return false;
  Sim S = {.p = p, .m = m, .mesh = p->mesh, .a = m->arena, .ideal = o && o->ideal};
  S.max_tasks = o && o->max_tasks > 0 ? o->max_tasks : DEFAULT_MAX_TASKS;
  sim_costs_build(S.a, m, S.mesh, S.ideal, &S.c);
  S.prod = malloc(sizeof *S.prod * (size_t)(m->nvalues + 1));
  S.ktask = malloc(sizeof *S.ktask * (size_t)(S.c.nkernels + 1));
  S.kname = calloc((size_t)S.c.nkernels + 1, sizeof *S.kname);
  if (!S.prod || !S.ktask || !S.kname) abort();
  for (int i = 0; i <= m->nvalues; i++) S.prod[i] = -1;
  for (int i = 0; i <= S.c.nkernels; i++) S.ktask[i] = -1;
  S.pi = m->pipeline ? m->pipeline->pipe : NULL;
  int64_t devices = S.mesh->devices;
  S.top.g = sim_graph_new();
  S.ndevs = S.pi ? S.pi->stages : 1;
  S.devs = calloc((size_t)S.ndevs, sizeof *S.devs);
  S.pipe_first = malloc(sizeof(int) * (size_t)S.ndevs);
  S.pipe_last = malloc(sizeof(int) * (size_t)S.ndevs);
  if (!S.devs || !S.pipe_first || !S.pipe_last) abort();
  for (int s = 0; s < S.ndevs; s++) S.pipe_first[s] = S.pipe_last[s] = -1;
  if (S.pi) {
    for (int k = 0; k < S.pi->nstage_axes; k++) S.stage_mask |= (uint16_t)(1u << S.pi->stage_axes[k]);
    int64_t nkeys = 2 * (int64_t)S.pi->microbatches * S.pi->stages * S.pi->chunks;
    S.send_task = malloc(sizeof *S.send_task * (size_t)(nkeys > 0 ? nkeys : 1));
    if (!S.send_task) abort();
    for (int64_t i = 0; i < nkeys; i++) S.send_task[i] = -1;
    for (int s = 0; s < S.ndevs; s++) {
      dev_init(&S.top, &S.devs[s],
               arena_printf(S.a, "stage %d (%lld devices)", s, (long long)(devices / S.ndevs)), devices / S.ndevs);
      for (int j = 0; j < m->main->ninputs; j++) S.prod[m->main->inputs[j]->id] = -1;
      build_func(&S, &S.top, &S.devs[s], m->main, s, NULL);
    }
    for (int i = 0; i < S.nrecv; i++) dep(&S.top, S.send_task[S.recv_wait[i]], S.recv_task[i]);
    for (int i = 0; i < S.njoins; i++)
      for (int j = i + 1; j < S.njoins; j++)
        if (S.joins[j].op == S.joins[i].op) sim_task_join(S.top.g, S.joins[i].task, S.joins[j].task);
  } else {
    dev_init(&S.top, &S.devs[0], arena_printf(S.a, "every device (%lld)", (long long)devices), devices);
    build_func(&S, &S.top, &S.devs[0], m->main, -1, NULL);
  }
  bool ok = sim_run(S.top.g);
  if (!ok)
    diag_error(p->entry ? p->entry->loc : (SrcLoc){0},
               "internal error: the simulated step cannot be scheduled (%d tasks wait forever)", sim_unscheduled(S.top.g));

  /* figures per simulated device */
  Iv **all = calloc((size_t)S.ndevs, sizeof *all);
  int *nall = calloc((size_t)S.ndevs, sizeof *nall);
  if (!all || !nall) abort();
  tl_exposure(&S.top, S.ndevs, NULL, NULL, all, nall);
  int *dfirst, *dorder;
  tl_by_device(&S.top, S.ndevs, &dfirst, &dorder);
  for (int k = 0; k < S.nsubs; k++) tl_exposure(&S.subs[k]->tl, 1, NULL, NULL, NULL, NULL);
  out->ideal = S.ideal;
  out->step_s = sim_makespan(S.top.g);
  out->devices = devices;
  out->nstages = S.ndevs;
  out->stages = calloc((size_t)S.ndevs, sizeof *out->stages);
  if (!out->stages) abort();
  /* the pipeline runs from the first stage's first region to the last region any stage runs */
  double pipe_t0 = INFINITY, pipe_t1 = -INFINITY;
  for (int s = 0; S.pi && s < S.ndevs; s++)
    if (S.pipe_first[s] >= 0) {
      pipe_t0 = fmin(pipe_t0, sim_task_start(S.top.g, S.pipe_first[s]));
      pipe_t1 = fmax(pipe_t1, sim_task_end(S.top.g, S.pipe_last[s]));
    }
  for (int s = 0; s < S.ndevs; s++) {
    SimDeviceStats st;
    sim_device_stats(S.top.g, S.devs[s].dev, &st);
    SimStageStats *x = &out->stages[s];
    x->stage = S.pi ? s : -1;
    x->represents = st.represents;
    x->compute_s = st.compute_s;
    x->comm_s = st.comm_s;
    x->exposed_comm_s = st.exposed_comm_s;
    x->end_s = st.last_end_s;
    double idle = st.idle_s;
    /* a region or repeated block counts as compute on this timeline: what it held that was not
     * compute is its own exposed communication (and idle, none on one device) */
    for (int k = dfirst[S.devs[s].dev]; k < dfirst[S.devs[s].dev + 1]; k++) {
      int t = dorder[k];
      const TaskInfo *in = &S.top.info[t];
      if (in->sub < 0) continue;
      const Sub *sb = S.subs[in->sub];
      x->compute_s -= sb->time_s - sb->st.compute_s;
      x->exposed_comm_s += sb->st.exposed_comm_s;
      x->comm_s += sb->st.comm_s;
      idle += sb->st.idle_s;
    }
    if (S.pi && pipe_t1 > pipe_t0) { /* idle while the pipeline runs: its fill and drain */
      x->bubble_s = (pipe_t1 - pipe_t0) - iv_cover(all[s], nall[s], pipe_t0, pipe_t1);
      if (x->bubble_s < 0) x->bubble_s = 0;
    }
    x->idle_s = idle - x->bubble_s;
    if (x->idle_s < 0) x->idle_s = 0;
    out->compute_s += x->compute_s / S.ndevs;
    out->comm_s += x->comm_s / S.ndevs;
    out->exposed_comm_s += x->exposed_comm_s / S.ndevs;
    out->bubble_s += x->bubble_s / S.ndevs;
    out->idle_s += x->idle_s / S.ndevs;
    free(all[s]);
  }
  free(all);
  free(nall);
  free(dfirst);
  free(dorder);

  /* items: every task weighted 1 / simulated devices (per device, averaged); a sub's tasks by the
   * runs of it, subs made later first (a sub may repeat the subs made while it was built) */
  Items I = {0};
  double *mult = calloc((size_t)S.nsubs + 1, sizeof *mult);
  if (!mult) abort();
  items_add(&S, &I, &S.top, 1.0 / S.ndevs, mult);
  for (int k = S.nsubs - 1; k >= 0; k--) {
    S.subs[k]->mult = mult[k];
    if (mult[k] > 0) items_add(&S, &I, &S.subs[k]->tl, mult[k], mult);
  }
  free(mult);
  if (I.n > 1) qsort(I.v, (size_t)I.n, sizeof *I.v, item_cmp); /* (no items: I.v is NULL) */
  out->items = I.v;
  out->nitems = I.n;
  free(I.key);
  free(I.hash);

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
  out->repeated_loops = S.repeated;

  if (o && o->keep_graph) {
    Detail *dt = calloc(1, sizeof *dt);
    if (!dt) abort();
    dt->top = S.top;
    dt->subs = S.subs;
    dt->nsubs = S.nsubs;
    dt->mesh = S.mesh;
    dt->devs = S.devs;
    dt->ndevs = S.ndevs;
    dt->summary = *out;
    out->detail = dt;
    S.devs = NULL;
  } else {
    tl_free(&S.top);
    for (int k = 0; k < S.nsubs; k++) {
      tl_free(&S.subs[k]->tl);
      free(S.subs[k]);
    }
    free(S.subs);
  }
  free(S.prod);
  free(S.ktask);
  free(S.kname);
  free(S.devs);
  free(S.pipe_first);
  free(S.pipe_last);
  free(S.send_task);
  free(S.recv_wait);
  free(S.recv_task);
  free(S.joins);
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
  for (int t = 0; t < n; t++) {
    double t0 = sim_task_start(g, t);
    if (!(t0 == t0)) continue;
    int s = sim_task_stream(g, t), d = sim_stream_device(g, s);
    const TaskInfo *in = &dt->top.info[t];
    char extra[96] = "";
    if (in->tag == TAG_REGION) snprintf(extra, sizeof extra, "\"microbatch\":%d,\"chunk\":%d", in->mb, in->chunk);
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
      trace_event(f, &first, sg, u, t0 + u0, d, tid, 0, NULL);
    }
  }
  const SimReport *x = &dt->summary;
  fprintf(f, "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{\"generator\":\"shardc sim\",\"ideal\":%s,"
             "\"step_time_s\":%.9g,\"mfu\":%.6g,\"devices\":%lld,\"simulated_devices\":%d}}\n",
          x->ideal ? "true" : "false", x->step_s, x->mfu, (long long)x->devices, x->nstages);
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
