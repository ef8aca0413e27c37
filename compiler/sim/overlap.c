/* overlap.c: what the train step's overlap keys do to the kernels' prices (sim.h's
 * sim_costs_overlap; language.md, Steps: tp_overlap, dp_overlap, grad_reduce).
 *
 * Which collective is which. A collective whose axes include an axis that shards `batch`
 * (ir_batch_axes) is data-parallel (a gradient reduction, an FSDP / ZeRO gather or reduce-scatter);
 * one over other axes only, none of them a pipeline's stage axes, is tensor-parallel.
 *
 * tp_overlap = on: an AllGather the device program runs as a collective matmul (devprog.h's
 * DevCmm, chosen by shard/cmm.c; the book's "collective matmuls"; Megatron-Core's
 * --tp-comm-overlap; XLA's windowed einsum) is priced as the program runs it: the contraction cut
 * into n chunks (n the group's size), n - 1 permutes of a block each overlapped with the chunk
 * before. An AllGather the program runs whole (not chosen: a reader that is not a contraction,
 * a reader's operand made after the first reader, or it does not pay) is priced whole. So is the
 * ReduceScatter side: a ReduceScatter (or AllReduce) the program runs as the reduce-scatter ring
 * at the contraction that makes its operand (DevCmm.scatter) overlaps it, one it runs whole (its
 * operand a sum of contractions, as the backward's input gradients are, or it does not pay) does
 * not. With C the contractions' time and A the collective's, the pair takes
 *     C / n + (n - 1) max(C / n, A / (n - 1))
 * (the formula ring attention uses, kernels.c's ring_seconds): the first chunk waits for nothing,
 * then each step is the longer of a chunk's compute and one permute. What exceeds C is the
 * collective's exposed part, the time the kernel keeps (SimKernel.time_s); the rest is
 * SimKernel.hidden_s. An AllReduce the program runs as the ring then an AllGather of the blocks
 * overlaps its ReduceScatter half (A / 2) this way; its AllGather half stays exposed. The chunks' smaller matmuls
 * are priced at the whole contraction's efficiency (an assumption: no wave quantization per chunk).
 *
 * dp_overlap = off: data-parallel collectives block the compute stream (SimKernel.blocking:
 * simulate.c starts one only after the compute before it and starts no compute until it ends),
 * as software before bucketed overlap ran them (the device program's window says `blocking`,
 * shard/dpwin.h). On (the default) they are asynchronous, issued where the device program's
 * overlap window says (simulate.c's window_tasks: a gradient reduction during the last
 * microbatch's backward, in per-layer pieces; an FSDP gather prefetched a layer ahead).
 *
 * grad_reduce = DT: a data-parallel AllReduce or ReduceScatter of a floating-point value in
 * another dtype is priced at DT's bytes (the gradients cast for the reduction and back). */
#include <stdlib.h>
#include <string.h>

#include "bufplan.h"
#include "devprog.h"
#include "sim.h"

static const Value *view_source(const Value *v) {
  for (int guard = 0; v && v->def && bufplan_is_view(v->def) && v->def->noperands > 0 && guard < 64; guard++)
    v = v->def->operands[0];
  return v;
}

static SimKernel *producer(SimCosts *c, const Value *v) {
  v = view_source(v);
  if (!v || v->id < 0 || v->id >= c->nvalues || c->kernel_of[v->id] < 0) return NULL;
  return &c->kernels[c->kernel_of[v->id]];
}

static bool is_tp(const SimKernel *k, uint16_t batch, uint16_t stage) {
  return k && k->kind == SIMK_COLLECTIVE && k->anchor && k->anchor->axes && !(k->anchor->axes & batch) &&
         !(k->anchor->axes & stage) && !(dev_op_subset(k->anchor) > 1);
}

static double collective_matmul(double c, double a, double n) {
  if (n < 2) return c + a;
  double chunk = c / n, step = a / (n - 1);
  return chunk + (n - 1) * (chunk > step ? chunk : step);
}

void sim_costs_overlap(SimCosts *c, const IrModule *m, const SimOverlap *o) {
  if (!c || !m || !o || !c->mesh) return;
  uint16_t batch = ir_batch_axes(m), stage = 0;
  if (m->pipeline && m->pipeline->pipe)
    for (int k = 0; k < m->pipeline->pipe->nstage_axes; k++) stage |= (uint16_t)(1u << m->pipeline->pipe->stage_axes[k]);
  int n = c->nkernels;
  double *feeds = calloc((size_t)n + 1, sizeof *feeds); /* by AllGather kernel: the contractions it feeds */
  if (!feeds) return;
  for (int i = 0; i < n; i++) {
    SimKernel *k = &c->kernels[i];
    if (k->kind != SIMK_MATMUL) continue;
    for (int j = 0; j < k->nins; j++) {
      SimKernel *p = producer(c, k->ins[j]);
      /* the contraction the program's collective matmul runs (its DevCmm) */
      const DevCmm *cm = p && p->anchor && p->anchor->dev ? p->anchor->dev->cmm : NULL;
      if (p && p->coll_kind == COLL_ALL_GATHER && is_tp(p, batch, stage) && cm && cm->coll == p->anchor && k->anchor &&
          k->anchor->dev && k->anchor->dev->cmm == cm)
        feeds[p - c->kernels] += k->time_s;
    }
  }
  for (int i = 0; i < n; i++) {
    SimKernel *k = &c->kernels[i];
    if (k->kind != SIMK_COLLECTIVE || !k->anchor) continue;
    bool dp = (k->anchor->axes & batch) != 0;
    /* grad_reduce: the reduction's bytes in the stated dtype */
    if (dp && o->grad_reduce != DT_NONE && (k->coll_kind == COLL_ALL_REDUCE || k->coll_kind == COLL_REDUCE_SCATTER) &&
        k->anchor->noperands > 0) {
      DType have = k->anchor->operands[0]->type.dtype;
      if (have != o->grad_reduce && !dtype_is_int(have) && dtype_bytes(have) > 0) {
        k->bytes *= (double)dtype_bytes(o->grad_reduce) / dtype_bytes(have);
        k->time_s = cost_collective_group(c->mesh, k->coll_kind, k->anchor->axes,
                                          dev_op_subset(k->anchor), k->bytes, c->ideal, &k->coll);
      }
    }
    if (dp && !o->dp_overlap) k->blocking = true;
    if (!o->tp_overlap || !is_tp(k, batch, stage)) continue;
    double nn = (double)k->coll.n, cm = 0, a = k->time_s;
    if (k->coll_kind == COLL_ALL_GATHER) {
      cm = feeds[i];
    } else if ((k->coll_kind == COLL_REDUCE_SCATTER || k->coll_kind == COLL_ALL_REDUCE) && k->nins > 0) {
      /* the ReduceScatter side: the contraction the program's ring runs (its DevCmm) */
      SimKernel *p = producer(c, k->ins[0]);
      const DevCmm *dc = k->anchor->dev ? k->anchor->dev->cmm : NULL;
      if (p && p->kind == SIMK_MATMUL && dc && dc->scatter && dc->coll == k->anchor && p->anchor && p->anchor->dev &&
          p->anchor->dev->cmm == dc)
        cm = p->time_s;
      if (k->coll_kind == COLL_ALL_REDUCE) a = k->time_s / 2; /* its ReduceScatter half; the AllGather stays */
    }
    if (!(cm > 0) || nn < 2) continue;
    double exposed = collective_matmul(cm, a, nn) - cm;
    if (exposed < 0) exposed = 0;
    if (exposed >= a) continue; /* nothing to gain: stays an ordinary collective */
    k->overlapped = true;
    k->hidden_s = a - exposed;
    k->time_s -= k->hidden_s;
  }
  free(feeds);
}

void sim_costs_apply_step(SimCosts *c, const IrModule *m, const Step *st) {
  if (!st || st->kind != STEP_TRAIN) return;
  SimOverlap ov = {st->tp_overlap, st->dp_overlap, st->grad_reduce};
  sim_costs_overlap(c, m, &ov);
}
