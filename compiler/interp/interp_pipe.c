/* interp_pipe.c: an OP_PIPELINE run stage by stage in its schedule's order (ir.h, stages.h).
 *
 * In an SPMD run each stage's devices run the stage's actions in lockstep; the stages advance in
 * turn, each as far as it can: a receive waits until its send has run. A region's inputs are
 * bound per device (the microbatch's row of a sliced operand, the chunk's rows of a stacked one,
 * the activation that arrived, the residuals its forward kept), its body is walked like any
 * function, and its outputs go where its PipeSlots say: the activation to the mailbox of the
 * region that reads it (a send moves it to the same device of the peer stage), residuals to the
 * stage's store, gradients added (in f32) into the accumulators, which are the pipeline's
 * results. A global run is the same with one device playing every stage. The stacked dim of a
 * pipeline over V > 1 chunks is held in storage order (stage-major; the device program's
 * RT_ORDER_INTERLEAVED): bind and reassemble permute it (interp_storage_permute). */
#include <stdlib.h>
#include <string.h>

#include "interp_int.h"

typedef struct PipeRun {
  Interp *I;
  const Op *op;
  const PipeInfo *pi;
  int nd;               /* devices (1 in a global run) */
  int G;                /* model chunks: p V */
  Tensor ***acc;        /* [d][k] accumulators, then (forward alone) results */
  Tensor ***mail;       /* [d][(dir (G + 1) + slot) N + mb] an activation (dir 0) or gradient */
  Tensor ***saved;      /* [d][(mb G + g) nsave + k] the residuals a chunk's forward kept */
  int nsave;
} PipeRun;

static int mail_index(const PipeRun *P, bool bwd, int slot, int mb) {
  return ((bwd ? P->G + 1 : 0) + slot) * P->pi->microbatches + mb;
}

static bool on_stage(const PipeRun *P, int d, int s) {
  return !P->I->spmd || dev_stage(P->I->dev, d) == s;
}

/* The device of stage `s` with the same coordinates as d on every other axis: its stage group's
 * member of rank s. */
static int peer_device(const PipeRun *P, int d, int s) {
  if (!P->I->spmd) return d;
  const DevGroups *g = P->I->dev->pipe->stages;
  return g->members[g->group_of[d] * g->size + s];
}

/* Rows [r0, r0 + n) of stacked tensor t, as a tensor of type ty (the chunk dim in front). */
static Tensor *chunk_rows(const Tensor *t, const TensorType *ty, int64_t r0, int64_t n) {
  int64_t start[MAX_RANK], shape[MAX_RANK];
  for (int i = 0; i < t->type.rank; i++) start[i] = t->start[i], shape[i] = t->shape[i];
  start[0] = 0, shape[0] = n;
  Tensor *r = tensor_new_block(ty, start, shape);
  if (!r) return NULL;
  int64_t row = t->shape[0] > 0 ? t->n / t->shape[0] : 0;
  if (r0 < 0 || r0 + n > t->shape[0]) {
    tensor_free(r);
    return NULL;
  }
  memcpy(r->data, t->data + r0 * row, sizeof(double) * (size_t)(n * row));
  return r;
}

/* The local rows of model chunk g on its stage (the device program's storage order). */
static int64_t chunk_row0(const PipeRun *P, int g) { return dev_chunk_row0(P->I->dev, g); }

static void add_into(Interp *I, Tensor *acc, const Tensor *g, int64_t row0) {
  int64_t off = row0 * (acc->type.rank > 0 && acc->shape[0] > 0 ? acc->n / acc->shape[0] : 0);
  for (int64_t i = 0; i < g->n && off + i < acc->n; i++) acc->data[off + i] += g->data[i];
  interp_round(I, acc);
}

/* Runs region r for (mb, g) on stage s: bind, walk, route the outputs. */
static bool run_region(PipeRun *P, int r, int s, int mb, int g) {
  Interp *I = P->I;
  const PipeInfo *pi = P->pi;
  const IrFunc *R = pi->region[r];
  const Op *op = P->op;
  if (!R) return interp_fail(I, op, "the schedule runs a region the pipeline lacks");
  bool bwd = r == PR_CHUNK_BWD || r == PR_FIRST_BWD;
  for (int d = 0; d < P->nd; d++) {
    I->active[d] = on_stage(P, d, s);
    if (!I->active[d]) continue;
    for (int i = 0; i < R->ninputs; i++) {
      PipeSlot sl = pi->in[r][i];
      const Value *in = R->inputs[i];
      Tensor *x = NULL;
      switch (sl.kind) {
      case PIN_ENV: {
        const Tensor *t = interp_val(I, d, op->operands[sl.index]);
        x = !t ? NULL : sl.index < pi->nslices ? iop_unstack(t, t->start[0] + mb) : tensor_copy(t);
        break;
      }
      case PIN_CHUNK: {
        const Tensor *t = interp_val(I, d, op->operands[sl.index]);
        x = t ? chunk_rows(t, &in->type, chunk_row0(P, g), pi->chunk_layers) : NULL;
        break;
      }
      case PIN_ACT: {
        /* forward: the input of chunk g (PR_LAST: slot G); backward: of chunk g's backward, slot
         * g + 1 (PR_FIRST_BWD: slot 0) */
        int slot = r == PR_LAST ? P->G : r == PR_FIRST_BWD ? 0 : bwd ? g + 1 : g;
        Tensor **box = &P->mail[d][mail_index(P, bwd, slot, mb)];
        x = *box;
        *box = NULL;
        break;
      }
      case PIN_SAVED:
        x = tensor_copy(P->saved[d][(mb * P->G + g) * P->nsave + sl.index]);
        break;
      }
      if (!x) return interp_fail(I, op, "stage %d, microbatch %d, chunk %d: region input %d has no value", s, mb, g, i);
      /* the chunk dim replaces the stacked dim's name in a chunk input: retype */
      x->type = in->type;
      interp_set(I, d, in, x);
    }
  }
  if (!interp_eval_func(I, R)) return false;
  for (int d = 0; d < P->nd; d++) {
    if (!I->active[d]) continue;
    for (int i = 0; i < R->noutputs; i++) {
      PipeSlot sl = pi->out[r][i];
      Tensor *y = interp_val(I, d, R->outputs[i]);
      if (!y) return interp_fail(I, op, "stage %d: region output %d has no value on device %d", s, i, d);
      switch (sl.kind) {
      case POUT_ACT: {
        int slot = r == PR_FIRST ? 0 : r == PR_CHUNK_FWD ? g + 1 : r == PR_LAST ? P->G : g;
        Tensor **box = &P->mail[d][mail_index(P, r != PR_FIRST && r != PR_CHUNK_FWD, slot, mb)];
        tensor_free(*box);
        *box = tensor_copy(y);
        break;
      }
      case POUT_SAVE: {
        Tensor **slotp = &P->saved[d][(mb * P->G + g) * P->nsave + sl.index];
        tensor_free(*slotp);
        *slotp = tensor_copy(y);
        break;
      }
      case POUT_ACC: {
        Tensor *a = P->acc[d][sl.index];
        if (!a) return interp_fail(I, op, "accumulator %d has no value on device %d", sl.index, d);
        add_into(I, a, y, r == PR_CHUNK_BWD ? chunk_row0(P, g) : 0);
        break;
      }
      case POUT_RESULT:
        tensor_free(P->acc[d][sl.index]);
        P->acc[d][sl.index] = tensor_copy(y);
        break;
      }
    }
  }
  return true;
}

/* A send: the value leaves this stage's mailbox for the peer stage's (same slot). */
static bool transfer(PipeRun *P, const PipeAction *a, int s) {
  int slot = a->backward ? a->chunk + 1 : a->chunk;
  int k = mail_index(P, a->backward, slot, a->mb);
  for (int d = 0; d < P->nd; d++) {
    if (!on_stage(P, d, s)) continue;
    int e = peer_device(P, d, a->peer);
    if (e == d) continue;
    if (!P->mail[d][k]) return interp_fail(P->I, P->op, "stage %d sends what it does not hold", s);
    tensor_free(P->mail[e][k]);
    P->mail[e][k] = P->mail[d][k];
    P->mail[d][k] = NULL;
    P->I->st->ops++;
  }
  return true;
}

static bool arrived(const PipeRun *P, const PipeAction *a, int s) {
  int slot = a->backward ? a->chunk + 1 : a->chunk;
  int k = mail_index(P, a->backward, slot, a->mb);
  for (int d = 0; d < P->nd; d++)
    if (on_stage(P, d, s)) return P->mail[d][k] != NULL;
  return true;
}

static bool run_action(PipeRun *P, const PipeAction *a, int s) {
  switch (a->kind) {
  case PA_FIRST: return run_region(P, PR_FIRST, s, a->mb, a->chunk);
  case PA_FWD: return run_region(P, PR_CHUNK_FWD, s, a->mb, a->chunk);
  case PA_LAST: return run_region(P, PR_LAST, s, a->mb, a->chunk);
  case PA_BWD: return run_region(P, PR_CHUNK_BWD, s, a->mb, a->chunk);
  case PA_FIRST_BWD: return run_region(P, PR_FIRST_BWD, s, a->mb, a->chunk);
  case PA_SEND: return transfer(P, a, s);
  case PA_RECV: return true; /* runnable only once arrived */
  }
  return interp_fail(P->I, P->op, "an unknown pipeline action");
}

bool interp_pipeline(Interp *I, const Op *op) {
  const PipeInfo *pi = op->pipe;
  if (!pi) return interp_fail(I, op, "a pipeline without its info");
  PipeRun P = {.I = I, .op = op, .pi = pi, .nd = I->ndev, .G = pi->stages * pi->chunks};
  const IrFunc *cf = pi->region[PR_CHUNK_FWD];
  P.nsave = cf ? cf->noutputs : 0;
  int nmail = 2 * (P.G + 1) * pi->microbatches, nsaved = pi->microbatches * P.G * (P.nsave > 0 ? P.nsave : 1);
  P.acc = calloc((size_t)P.nd, sizeof *P.acc);
  P.mail = calloc((size_t)P.nd, sizeof *P.mail);
  P.saved = calloc((size_t)P.nd, sizeof *P.saved);
  bool *was = malloc(sizeof(bool) * (size_t)P.nd);
  bool ok = P.acc && P.mail && P.saved && was;
  for (int d = 0; ok && d < P.nd; d++) {
    was[d] = I->active[d];
    P.acc[d] = calloc((size_t)op->nresults + 1, sizeof(Tensor *));
    P.mail[d] = calloc((size_t)nmail, sizeof(Tensor *));
    P.saved[d] = calloc((size_t)nsaved, sizeof(Tensor *));
    ok = P.acc[d] && P.mail[d] && P.saved[d];
    /* accumulators start as the carried operands (zeros) */
    for (int k = 0; ok && k < pi->ncarried; k++) {
      const Tensor *t = interp_val(I, d, op->operands[pi->nslices + k]);
      if (t) P.acc[d][k] = tensor_copy(t);
    }
  }
  if (!ok) interp_fail(I, op, "out of memory");
  /* every stage as far as it can, in turn, until all are done */
  int p = pi->stages;
  int *pos = calloc((size_t)p, sizeof(int));
  if (!pos) ok = interp_fail(I, op, "out of memory");
  for (int s = 0; ok && s < p; s++) pos[s] = pi->first_action[s];
  for (bool busy = true; ok && busy;) {
    busy = false;
    bool progress = false;
    for (int s = 0; ok && s < p; s++) {
      while (ok && pos[s] < pi->first_action[s + 1]) {
        const PipeAction *a = &pi->actions[pos[s]];
        if (a->kind == PA_RECV && !arrived(&P, a, s)) break;
        ok = run_action(&P, a, s);
        pos[s]++;
        progress = true;
      }
      if (pos[s] < pi->first_action[s + 1]) busy = true;
    }
    if (ok && busy && !progress) ok = interp_fail(I, op, "the schedule deadlocks: every stage waits for a receive");
  }
  free(pos);
  for (int d = 0; d < P.nd; d++) I->active[d] = was ? was[d] : true;
  /* results: the accumulators (a forward's results) on the stages that hold them */
  for (int d = 0; d < P.nd; d++) {
    for (int k = 0; k < op->nresults; k++) {
      bool here = !I->spmd || !pi->result_place || dev_runs_on(I->dev, pi->result_place[k], d);
      if (ok && here && P.acc[d][k]) interp_set(I, d, op->results[k], P.acc[d][k]);
      else tensor_free(P.acc[d][k]);
    }
    for (int i = 0; P.mail && P.mail[d] && i < nmail; i++) tensor_free(P.mail[d][i]);
    for (int i = 0; P.saved && P.saved[d] && i < nsaved; i++) tensor_free(P.saved[d][i]);
    if (P.acc) free(P.acc[d]);
    if (P.mail) free(P.mail[d]);
    if (P.saved) free(P.saved[d]);
  }
  free(P.acc);
  free(P.mail);
  free(P.saved);
  free(was);
  if (ok) I->st->ops++;
  return ok;
}
