/* fitsearch.c: the suggestions' search (see fitsearch.h).
 *
 * 1. Anchors: programs checked in full whose buffers live at the peak the estimates rescale: the
 *    program itself, and for a train step the same under each other `remat` (remat changes what
 *    the backward keeps in a way no rescaling sees).
 * 2. Beam search: from the program, each level adds one change to each of the BEAM best programs
 *    not yet estimated to fit. A program is estimated from its anchor's peak: what it holds of
 *    params, gradients and optimizer state, each scaled as the class shrinks under the candidate
 *    (each param's type under the candidate's rules, the way layout_apply reads them, `zero`
 *    dividing by the batch axes); each other live buffer divided by the axes a change adds to one
 *    of its dims (times a padding's growth, divided by more microbatches where it holds `batch`);
 *    plus the gathered weights an FSDP rule brings (two layers' worth) and the f32 accumulators
 *    of a first split into microbatches.
 * 3. Checks: the candidates estimated to fit, cheapest first by the time their changes are
 *    estimated to add, are checked in full (a padded dim re-checks the declarations with -D) until
 *    FIT_MAX_PLANS fit or the budget runs out; then the best plan's prefixes, so that each change
 *    has its own figures. Where none fits, the candidates estimated smallest are checked instead.
 * Every figure printed is a checked program's; the estimates only choose what to check. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bufplan.h"
#include "checked.h"
#include "cost.h"
#include "diag.h"
#include "fitsearch.h"
#include "opcost.h"
#include "partition.h"

enum {
  BEAM = 6,          /* programs expanded per level */
  MAX_CHECKS = 10,   /* programs checked in full, anchors included */
  CLOSEST_CHECKS = 4, /* of which for the closest programs, where none is estimated to fit */
};
/* The search's budget is work, not time, so that its advice is the same on any machine and under
 * any load: a full check's work is the IR values it builds (a deterministic measure of the
 * program's size after the pass pipeline). No check starts that would take the work past
 * BUDGET_WORK once a program fits, nor past HARD_WORK at all. A check takes about 14 us per value
 * (llama3_8b.shard on h100[data: 8]: 410 values in 5.5 ms on the 2-core reference machine), so these
 * are about 1 s and 1.5 s there; they bind only on programs written out layer by layer. */
#define BUDGET_WORK 70000.0
#define HARD_WORK 105000.0

/* A layout rule with its axes resolved on the mesh; nax 0: layout_apply skips it (an axis the
 * mesh lacks, or more axes than a dim takes). */
typedef struct FRule {
  Name dim;
  int8_t ax[MAX_AXES_PER_DIM];
  int nax;
  uint16_t mask;
  int64_t prod;
} FRule;

/* A buffer live at an anchor's peak other than params, gradients and optimizer state. Dims by
 * name: inside a microbatch loop `batch` is another Dim of the same name. */
typedef struct FLive {
  Name dims[MAX_RANK];
  int64_t ext[MAX_RANK];       /* local extents */
  int rank;
  uint16_t used;               /* the axes on its dims, and its partial-sum axes */
  double bytes;                /* per device, all its copies */
} FLive;

typedef struct Anchor {
  int remat;                   /* RematKind */
  FitFigures fig;
  double states[3];            /* the model's params, grads, optimizer for it, all held at once */
  FLive *live;
  int nlive;
} Anchor;

typedef struct Cand {
  FitChange ch[FIT_MAX_CHANGES];
  int n;
  double est;                  /* bytes per device */
  double proxy;                /* seconds added per step */
} Cand;

typedef struct Search {
  const CheckedProgram *cp;
  const Program *p;
  const IrModule *m;
  const Mesh *mesh;
  Arena *a;
  FitAdvice *out;
  FRule *rules;                /* the layout's, in order */
  int nrules;
  const Step *step;            /* a train step, or NULL */
  double compute_s;            /* the program's ideal compute per device per step */
  double tokens_local;         /* rows of the entry's first input per device (TP estimates) */
  double input_bytes;          /* the entry's first input per device */
  int64_t layers;              /* the largest stacking dim (1 without) */
  const Dim **dims;            /* dims a rule may shard: those of params and inputs */
  int ndims;
  Anchor anchor[REMAT_SELECTIVE + 1]; /* the program, and each remat it may try instead (NONE..DOTS) */
  int nanchor;
  uint64_t *seen;              /* candidates estimated, by key (open addressing; 0 empty) */
  int seen_cap, seen_len;
  struct timespec t0;
  double work;                 /* values built by the full checks so far */
} Search;

static double elapsed(const Search *S) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)(t.tv_sec - S->t0.tv_sec) + 1e-9 * (double)(t.tv_nsec - S->t0.tv_nsec);
}

static int popcount16(uint16_t x) {
  int n = 0;
  for (; x; x &= (uint16_t)(x - 1)) n++;
  return n;
}

static int64_t axes_prod(const Mesh *m, uint16_t mask) {
  int64_t p = 1;
  for (int a = 0; a < m->naxes; a++)
    if ((mask >> a) & 1) p = sat_mul(p, m->axes[a].size);
  return p;
}

/* Would a check started now (as much work as the checks so far, on average) end within `limit`? */
static bool work_for_check(const Search *S, double limit) {
  double avg = S->out->checked > 0 ? S->work / S->out->checked : 0;
  return S->work + avg <= limit;
}

/* ---- a candidate's layout, applied the way layout_apply does ---- */

static const FitChange *change_on(const Cand *c, const Dim *d) {
  for (int i = 0; i < c->n; i++)
    if ((c->ch[i].kind == FIT_RULE || c->ch[i].kind == FIT_PAD) && c->ch[i].dim == d) return &c->ch[i];
  return NULL;
}

static int64_t dim_size(const Cand *c, const Dim *d) {
  const FitChange *ch = change_on(c, d);
  return ch && ch->pad_to > 0 ? ch->pad_to : d->size;
}

/* The first rule layout_apply would use for a dim (index in S->rules), or -1. */
static int rule_for(const Search *S, Name dim) {
  for (int r = 0; r < S->nrules; r++)
    if (S->rules[r].dim == dim && S->rules[r].nax > 0) return r;
  return -1;
}

/* The candidate's rules: the layout's with its rule changes (a grown rule in place, a new one
 * last). `out` holds S->nrules + FIT_MAX_CHANGES. */
static int cand_rules(const Search *S, const Cand *c, FRule *out) {
  memcpy(out, S->rules, sizeof(FRule) * (size_t)S->nrules);
  int n = S->nrules;
  for (int i = 0; i < c->n; i++) {
    const FitChange *ch = &c->ch[i];
    if (ch->kind != FIT_RULE) continue;
    int r = ch->extends ? rule_for(S, ch->dim->name) : -1;
    FRule *f = r >= 0 ? &out[r] : &out[n++];
    f->dim = ch->dim->name;
    f->nax = ch->naxes;
    f->mask = 0;
    for (int k = 0; k < ch->naxes; k++) f->ax[k] = ch->axes[k], f->mask |= (uint16_t)(1u << ch->axes[k]);
    f->prod = axes_prod(S->mesh, f->mask);
  }
  return n;
}

/* A candidate's rules, in a buffer of the caller's (the search's arena for a long layout). */
typedef struct RuleSet {
  FRule *r;
  int n;
  FRule local[64 + FIT_MAX_CHANGES];
} RuleSet;

static void rule_set(const Search *S, const Cand *c, RuleSet *rs) {
  rs->r = S->nrules <= 64 ? rs->local : ARENA_ARRAY(S->a, FRule, S->nrules + FIT_MAX_CHANGES);
  rs->n = cand_rules(S, c, rs->r);
}

/* A spec's sharding under rules: per dim its axes' mask; returns the local elements. */
static double apply_rules(const Search *S, const FRule *rules, int nrules, const Cand *c, const TypeSpec *spec,
                          uint16_t dim_mask[MAX_RANK], uint16_t *used_out) {
  uint16_t used = 0;
  int rank = spec->rank < 0 ? 0 : spec->rank > MAX_RANK ? MAX_RANK : spec->rank;
  bool set[MAX_RANK] = {0};
  for (int i = 0; i < rank; i++) {
    dim_mask[i] = 0;
    if (spec->nat[i] <= 0) continue;
    set[i] = true;
    for (int j = 0; j < spec->nat[i] && j < MAX_MESH_AXES; j++) {
      int a = mesh_axis_index(S->mesh, spec->at[i][j]);
      if (a >= 0) dim_mask[i] |= (uint16_t)(1u << a);
    }
    used |= dim_mask[i];
  }
  for (int r = 0; r < nrules; r++) {
    const FRule *f = &rules[r];
    /* a multi-axis rule keeps those of its axes the tensor does not use yet (none: skipped) */
    uint16_t keep = (uint16_t)(f->mask & ~used);
    if (f->nax == 0 || !keep) continue;
    int i = 0;
    while (i < rank && !(spec->dims[i] && spec->dims[i]->name == f->dim)) i++;
    if (i == rank || set[i] || dim_size(c, spec->dims[i]) % axes_prod(S->mesh, keep) != 0) continue;
    set[i] = true;
    dim_mask[i] = keep;
    used |= keep;
  }
  double elems = 1;
  for (int i = 0; i < rank; i++)
    elems *= spec->dims[i] ? (double)dim_size(c, spec->dims[i]) / (double)axes_prod(S->mesh, dim_mask[i]) : 1;
  if (used_out) *used_out = used;
  return elems;
}

/* The axes that shard `batch` in the entry's inputs under the candidate's rules (zero shards by
 * them; microbatches must divide by them). */
static uint16_t batch_axes(const Search *S, const FRule *rules, int nrules, const Cand *c) {
  const FnDecl *e = S->p->entry;
  Name batch = intern_cstr("batch");
  for (int i = 0; e && i < e->nargs; i++) {
    const TypeSpec *t = &e->args[i].type;
    uint16_t dm[MAX_RANK];
    apply_rules(S, rules, nrules, c, t, dm, NULL);
    for (int d = 0; d < t->rank; d++)
      if (t->dims[d] && t->dims[d]->name == batch) return dm[d];
  }
  return 0;
}

static int cand_value(const Search *S, const Cand *c, FitKind k) {
  for (int i = 0; i < c->n; i++)
    if (c->ch[i].kind == k) return c->ch[i].value;
  if (!S->step) return k == FIT_MICRO ? 1 : 0;
  return k == FIT_REMAT ? (int)S->step->remat : k == FIT_ZERO ? S->step->zero : S->step->microbatches;
}

/* Params, gradients and optimizer state per device under the candidate, as if all were held at
 * once (out[0..2]); the f32 microbatch accumulators into *acc. */
static void states(const Search *S, const Cand *c, double out[3], double *acc) {
  RuleSet rs;
  rule_set(S, c, &rs);
  const FRule *rp = rs.r;
  int nr = rs.n;
  uint16_t zaxes = batch_axes(S, rp, nr, c);
  int zero = cand_value(S, c, FIT_ZERO);
  bool adam = S->step && S->step->optimizer == OPT_ADAM, master = S->step && S->step->master != DT_NONE;
  double a = 0;
  out[0] = out[1] = out[2] = 0;
  for (int i = 0; i < S->m->nparams; i++) {
    const IrParam *ip = &S->m->params[i];
    uint16_t dm[MAX_RANK], used;
    double elems = apply_rules(S, rp, nr, c, &ip->spec, dm, &used);
    double zs = (double)axes_prod(S->mesh, (uint16_t)(zaxes & ~used));
    double b = dtype_bytes(ip->type.dtype);
    out[0] += elems * b;
    if (!S->step) continue;
    out[1] += elems * b / (zero >= 2 ? zs : 1);
    out[2] += elems * ((adam ? 8 : 0) + (master && ip->type.dtype != DT_F32 ? 4 : 0)) / (zero >= 1 ? zs : 1);
    a += 4 * elems / (zero >= 2 ? zs : 1);
  }
  if (acc) *acc = a;
}

static const Anchor *anchor_for(const Search *S, const Cand *c) {
  int remat = cand_value(S, c, FIT_REMAT);
  for (int i = 0; i < S->nanchor; i++)
    if (S->anchor[i].remat == remat) return &S->anchor[i];
  return &S->anchor[0];
}

/* The largest layer of a param on one device under the candidate (its rows of one stacked layer). */
static double layer_bytes(const Search *S, const IrParam *ip, double local_elems, const uint16_t *dm, const Cand *c) {
  double b = local_elems * dtype_bytes(ip->type.dtype);
  for (int k = 0; k < ip->stack_depth && k < ip->spec.rank; k++)
    b /= (double)dim_size(c, ip->spec.dims[k]) / (double)axes_prod(S->mesh, dm[k]);
  return b;
}

static void estimate(const Search *S, Cand *c) {
  const Anchor *A = anchor_for(S, c);
  double acc = 0, st[3];
  states(S, c, st, &acc);
  /* what of each class the anchor holds at its peak (the gradients may be one layer's), scaled as
   * the class shrinks or grows */
  const int64_t held[3] = {A->fig.params, A->fig.grads, A->fig.optimizer};
  double est = (double)(A->fig.total - held[0] - held[1] - held[2]);
  for (int k = 0; k < 3; k++) est += A->states[k] > 0 ? (double)held[k] * st[k] / A->states[k] : st[k];
  if (cand_value(S, c, FIT_MICRO) > 1 && (!S->step || S->step->microbatches <= 1)) est += acc;
  /* the other buffers at the peak, rescaled */
  int m0 = S->step ? S->step->microbatches : 1, m1 = cand_value(S, c, FIT_MICRO);
  Name batch = intern_cstr("batch");
  for (int i = 0; i < A->nlive; i++) {
    const FLive *l = &A->live[i];
    double f = l->bytes;
    uint16_t used = l->used;
    for (int k = 0; k < c->n; k++) {
      const FitChange *ch = &c->ch[k];
      if (ch->kind != FIT_RULE && ch->kind != FIT_PAD) continue;
      int pos = -1;
      for (int d = 0; d < l->rank; d++)
        if (l->dims[d] == ch->dim->name) pos = d;
      if (pos < 0) continue;
      double ext = (double)l->ext[pos];
      if (ch->pad_to > 0) {
        f *= (double)ch->pad_to / (double)ch->dim->size;
        ext *= (double)ch->pad_to / (double)ch->dim->size;
      }
      if (ch->kind == FIT_RULE && !(ch->added & used)) {
        double pr = (double)axes_prod(S->mesh, ch->added);
        if (fmod(ext, pr) == 0) f /= pr, used |= ch->added;
      }
    }
    if (m1 != m0)
      for (int d = 0; d < l->rank; d++)
        if (l->dims[d] == batch) f *= (double)m0 / m1;
    est += f - l->bytes;
  }
  /* an FSDP rule gathers its weights before use: about two layers' worth at a time */
  RuleSet rs;
  rule_set(S, c, &rs);
  const FRule *rp = rs.r;
  int nr = rs.n;
  uint16_t bax = batch_axes(S, rp, nr, c);
  double gathered = 0;
  for (int k = 0; k < c->n; k++) {
    const FitChange *ch = &c->ch[k];
    if (ch->kind != FIT_RULE || !(ch->added & bax)) continue;
    for (int i = 0; i < S->m->nparams; i++) {
      const IrParam *ip = &S->m->params[i];
      int pos = -1;
      for (int d = 0; d < ip->spec.rank; d++)
        if (ip->spec.dims[d] == ch->dim) pos = d;
      if (pos < 0) continue;
      uint16_t dm[MAX_RANK];
      double el = apply_rules(S, rp, nr, c, &ip->spec, dm, NULL);
      double g = layer_bytes(S, ip, el, dm, c) * (double)axes_prod(S->mesh, (uint16_t)(dm[pos] & ch->added));
      if (g > gathered) gathered = g;
    }
  }
  c->est = est + 2 * gathered;
}

/* Does an input of the entry have d (batch, seq: the rows every op computes)? */
static bool is_input_dim(const Search *S, const Dim *d) {
  for (int i = 0; S->p->entry && i < S->p->entry->nargs; i++)
    for (int k = 0; k < S->p->entry->args[i].type.rank; k++)
      if (S->p->entry->args[i].type.dims[k] == d) return true;
  return false;
}

/* ---- what a change is estimated to add (ranking only; the printed figures are checked) ---- */

static double change_proxy(const Search *S, const Cand *c, const FitChange *ch) {
  switch (ch->kind) {
  case FIT_REMAT: {
    for (int i = 0; i < S->nanchor; i++)
      if (S->anchor[i].remat == ch->value) {
        double peak = cost_peak_flops(S->mesh->target, DT_BF16, true) * (double)S->mesh->devices;
        return peak > 0 ? (S->anchor[i].fig.flops - S->anchor[0].fig.flops) / peak : 0;
      }
    return 0;
  }
  case FIT_ZERO: return 0; /* a ReduceScatter and an AllGather move what the AllReduce moved */
  case FIT_MICRO: break;
  case FIT_PAD: return ((double)ch->pad_to / (double)ch->dim->size - 1) * S->compute_s;
  case FIT_RULE: break;
  }
  RuleSet rs;
  rule_set(S, c, &rs);
  const FRule *rp = rs.r;
  int nr = rs.n;
  uint16_t bax = batch_axes(S, rp, nr, c);
  if (ch->kind == FIT_MICRO) { /* weights gathered over the batch axes are gathered for each microbatch */
    double more = (double)ch->value / (S->step ? S->step->microbatches : 1) - 1, t = 1e-9 * ch->value;
    for (int i = 0; i < S->m->nparams; i++) {
      const IrParam *ip = &S->m->params[i];
      uint16_t dm[MAX_RANK], used;
      double el = apply_rules(S, rp, nr, c, &ip->spec, dm, &used);
      uint16_t got = (uint16_t)(used & bax);
      if (got) t += more * 2 * cost_collective(S->mesh, COLL_ALL_GATHER, got, el * dtype_bytes(ip->type.dtype) *
                                               (double)axes_prod(S->mesh, got), true, NULL);
    }
    return t;
  }
  double t = ch->pad_to > 0 ? ((double)ch->pad_to / (double)ch->dim->size - 1) * S->compute_s : 0;
  bool in_params = false;
  for (int i = 0; i < S->m->nparams; i++) {
    const IrParam *ip = &S->m->params[i];
    int pos = -1;
    for (int d = 0; d < ip->spec.rank; d++)
      if (ip->spec.dims[d] == ch->dim) pos = d;
    if (pos < 0) continue;
    in_params = true;
    uint16_t dm[MAX_RANK];
    double el = apply_rules(S, rp, nr, c, &ip->spec, dm, NULL);
    uint16_t got = (uint16_t)(dm[pos] & ch->added);
    if (!got) continue;
    double bytes = el * dtype_bytes(ip->type.dtype);
    if (got & bax) { /* FSDP: gathered in the forward and the backward, gradients reduce-scattered */
      double g = bytes * (double)axes_prod(S->mesh, got);
      t += 2 * cost_collective(S->mesh, COLL_ALL_GATHER, got, g, true, NULL) +
           cost_collective(S->mesh, COLL_REDUCE_SCATTER, got, g, true, NULL);
    } else { /* tensor parallel: a partial sum of the activation it makes, reduced forward and back */
      double per_layer = layer_bytes(S, ip, el, dm, c) * (double)axes_prod(S->mesh, got);
      double other = per_layer / dtype_bytes(ip->type.dtype) / (double)dim_size(c, ch->dim);
      double act = S->tokens_local * other * 2, layers = el * dtype_bytes(ip->type.dtype) / layer_bytes(S, ip, el, dm, c);
      t += layers * cost_collective(S->mesh, COLL_ALL_REDUCE, got, act, true, NULL);
    }
  }
  if (!in_params) /* an input's dim (seq): activations gathered where ops need it whole */
    t += 2 * (double)S->layers * cost_collective(S->mesh, COLL_ALL_GATHER, ch->added, S->input_bytes, true, NULL);
  if (is_input_dim(S, ch->dim)) /* the activations' dim: each device computes a share of the rows */
    t -= S->compute_s * (1 - 1 / (double)axes_prod(S->mesh, ch->added));
  return t;
}

/* ---- candidates ---- */

static int change_order(const FitChange *a, const FitChange *b) {
  if (a->kind != b->kind) return a->kind < b->kind ? -1 : 1;
  int da = a->dim ? a->dim->id : -1, db = b->dim ? b->dim->id : -1;
  return da < db ? -1 : da > db;
}

static uint64_t cand_key(const Cand *c) {
  uint64_t h = 1469598103934665603ull;
  for (int i = 0; i < c->n; i++) {
    const FitChange *ch = &c->ch[i];
    uint64_t parts[5] = {(uint64_t)ch->kind, ch->dim ? (uint64_t)ch->dim->id + 1 : 0, (uint64_t)ch->pad_to,
                         (uint64_t)ch->value, 0};
    for (int k = 0; k < ch->naxes; k++) parts[4] = parts[4] * 16 + (uint64_t)ch->axes[k] + 1;
    for (int k = 0; k < 5; k++) h = (h ^ parts[k]) * 1099511628211ull;
  }
  return h ? h : 1;
}

/* True the first time a candidate is seen. */
static bool first_seen(Search *S, uint64_t key) {
  if (2 * (S->seen_len + 1) > S->seen_cap) {
    int ncap = S->seen_cap ? 2 * S->seen_cap : 1024;
    uint64_t *ns = ARENA_ARRAY(S->a, uint64_t, ncap);
    for (int i = 0; i < S->seen_cap; i++) {
      if (!S->seen[i]) continue;
      unsigned j = (unsigned)(S->seen[i] & (uint64_t)(ncap - 1));
      while (ns[j]) j = (j + 1) & (unsigned)(ncap - 1);
      ns[j] = S->seen[i];
    }
    S->seen = ns, S->seen_cap = ncap;
  }
  unsigned j = (unsigned)(key & (uint64_t)(S->seen_cap - 1));
  while (S->seen[j]) {
    if (S->seen[j] == key) return false;
    j = (j + 1) & (unsigned)(S->seen_cap - 1);
  }
  S->seen[j] = key;
  S->seen_len++;
  return true;
}

typedef VEC(Cand) CandVec;

static bool same_change(const FitChange *a, const FitChange *b) {
  return a->kind == b->kind && a->dim == b->dim && a->naxes == b->naxes && a->pad_to == b->pad_to &&
         a->value == b->value && memcmp(a->axes, b->axes, (size_t)a->naxes) == 0;
}

/* Does c make every change of a candidate that had errors? */
static bool contains_invalid(const Cand *c, const CandVec *invalid) {
  for (int i = 0; i < invalid->len; i++) {
    const Cand *x = &invalid->data[i];
    bool all = true;
    for (int k = 0; k < x->n && all; k++) {
      bool has = false;
      for (int j = 0; j < c->n && !has; j++) has = same_change(&x->ch[k], &c->ch[j]);
      all = has;
    }
    if (all) return true;
  }
  return false;
}

/* c plus one change, in canonical order; its estimate and cost, unless seen before. */
static void try_move(Search *S, const Cand *c, const FitChange *mv, CandVec *into) {
  if (c->n >= FIT_MAX_CHANGES) return;
  Cand d = *c;
  int i = d.n++;
  d.ch[i] = *mv;
  for (; i > 0 && change_order(&d.ch[i], &d.ch[i - 1]) < 0; i--) {
    FitChange t = d.ch[i];
    d.ch[i] = d.ch[i - 1];
    d.ch[i - 1] = t;
  }
  if (!first_seen(S, cand_key(&d))) return;
  estimate(S, &d);
  if (d.est >= c->est * (1 - 1e-3) && c->n > 0) return; /* saves nothing on top of c: only costs */
  d.proxy = 0;
  for (int k = 0; k < d.n; k++) d.proxy += d.ch[k].proxy_s = change_proxy(S, &d, &d.ch[k]);
  S->out->candidates++;
  VEC_PUSH(S->a, *into, d);
}

/* The padded size that makes `prod` divide d: a multiple of lcm(prod, 64) at most 1% larger; 0 if
 * none. */
/* The padded size that makes `prod` divide d (layout_pad_size); 0 if none. */
static int64_t pad_size(const Dim *d, int64_t prod) { return layout_pad_size(d->size, prod); }

static bool is_stack_dim(const Search *S, const Dim *d) {
  for (int i = 0; i < S->m->nparams; i++)
    for (int k = 0; k < S->m->params[i].stack_depth && k < S->m->params[i].spec.rank; k++)
      if (S->m->params[i].spec.dims[k] == d) return true;
  return false;
}

static void expand(Search *S, const Cand *c, CandVec *into) {
  const Mesh *M = S->mesh;
  RuleSet rs;
  rule_set(S, c, &rs);
  uint16_t bax = batch_axes(S, rs.r, rs.n, c);
  for (int di = 0; di < S->ndims; di++) {
    const Dim *d = S->dims[di];
    if (change_on(c, d)) continue;
    int r = rule_for(S, d->name);
    const FRule *R = r >= 0 ? &S->rules[r] : NULL;
    uint16_t have = R ? R->mask : 0;
    int64_t have_prod = R ? R->prod : 1;
    if (R && d->size % have_prod != 0) { /* the rule is skipped: pad the dim so that it applies */
      FitChange mv = {.kind = FIT_PAD, .dim = d, .pad_to = pad_size(d, have_prod)};
      if (mv.pad_to > 0) try_move(S, c, &mv, into);
    }
    for (int a = 0; a < M->naxes; a++)
      for (int b = a; b < M->naxes; b++) {
        uint16_t add = (uint16_t)((1u << a) | (1u << b));
        if ((add & have) || M->axes[a].size <= 1 || M->axes[b].size <= 1) continue;
        if (is_stack_dim(S, d) && (add & bax)) continue; /* a pipeline over the batch's own axes */
        int n = R ? R->nax : 0;
        if (n + popcount16(add) > MAX_AXES_PER_DIM) continue;
        FitChange mv = {.kind = FIT_RULE, .dim = d, .added = add, .extends = R != NULL};
        for (int k = 0; k < n; k++) mv.axes[k] = R->ax[k];
        mv.axes[n++] = (int8_t)a;
        if (b != a) mv.axes[n++] = (int8_t)b;
        mv.naxes = n;
        int64_t prod = have_prod * axes_prod(M, add);
        if (d->size % prod != 0 && !(mv.pad_to = pad_size(d, prod))) continue;
        try_move(S, c, &mv, into);
      }
  }
  if (!S->step) return;
  for (int i = 1; i < S->nanchor; i++) {
    FitChange mv = {.kind = FIT_REMAT, .value = S->anchor[i].remat};
    if (cand_value(S, c, FIT_REMAT) == (int)S->step->remat) try_move(S, c, &mv, into);
  }
  if (cand_value(S, c, FIT_ZERO) == S->step->zero)
    for (int z = S->step->zero + 1; z <= 2; z++) {
      FitChange mv = {.kind = FIT_ZERO, .value = z};
      try_move(S, c, &mv, into);
    }
  const Dim *batch = program_find_dim(S->p, intern_cstr("batch"));
  int64_t shards = axes_prod(M, bax);
  if (batch && cand_value(S, c, FIT_MICRO) == S->step->microbatches)
    for (int k = 2; k <= 32; k *= 2) {
      int64_t mb = (int64_t)S->step->microbatches * k;
      if (batch->size % mb != 0 || (batch->size / mb) % shards != 0) break;
      FitChange mv = {.kind = FIT_MICRO, .value = (int)mb};
      try_move(S, c, &mv, into);
    }
}

/* ---- checking a candidate in full ---- */

static void take_live(Search *S, const IrModule *m, const Program *q, Arena *scratch, Anchor *A) {
  BufPlan bp;
  bufplan_build_live(scratch, m, q, true, &bp);
  const BufStage *st = &bp.stages[bp.worst];
  A->live = ARENA_ARRAY(S->a, FLive, st->nlive + 1);
  A->nlive = 0;
  for (int i = 0; i < st->nlive; i++) {
    const BufLive *b = &st->live[i];
    if (b->cls == BUF_PARAM || b->cls == BUF_GRAD || b->cls == BUF_OPT) continue;
    const Value *v = b->v;
    FLive *l = &A->live[A->nlive++];
    l->rank = v->type.rank;
    l->bytes = (double)b->bytes;
    l->used = v->sharding.partial;
    for (int d = 0; d < v->type.rank; d++) {
      l->dims[d] = v->type.dims[d]->name;
      l->ext[d] = sharding_local_extent(&v->type, &v->sharding, q->mesh, d);
      for (int k = 0; k < v->sharding.naxes[d]; k++) l->used |= (uint16_t)(1u << v->sharding.axes[d][k]);
    }
  }
}

static void figures_of(const MemoryReport *r, const IrModule *m, const Mesh *mesh, FitFigures *f) {
  f->valid = true;
  f->fits = r->fits;
  f->total = r->total;
  f->params = r->params, f->grads = r->grads, f->optimizer = r->optimizer;
  f->activations = r->activations, f->temporaries = r->temporaries;
  f->flops = r->flops_per_step;
  f->comm_s = step_comm_seconds(m, mesh);
  f->compute_s = step_compute_seconds(m, mesh);
}

/* The program c proposes, checked: the declarations again where a dim is padded, then the layout
 * and step changed, the IR, the pass pipeline and the buffer plan. With `A`, its live buffers. */
static void check_full(Search *S, const Cand *c, FitFigures *f, Anchor *A) {
  memset(f, 0, sizeof *f);
  S->out->checked++;
  Arena scratch;
  arena_init(&scratch);
  diag_push_quiet();
  int errors = diag_quiet_error_count();
  const Program *prog = S->p;
  int npad = 0;
  for (int i = 0; i < c->n; i++) npad += c->ch[i].pad_to > 0;
  CheckedProgram cp2;
  if (npad > 0) {
    SemaOptions so = S->cp->so;
    so.overrides = ARENA_ARRAY(&scratch, DimOverride, so.noverrides + npad);
    memcpy(so.overrides, S->cp->so.overrides, sizeof(DimOverride) * (size_t)so.noverrides);
    for (int i = 0; i < c->n; i++)
      if (c->ch[i].pad_to > 0) so.overrides[so.noverrides++] = (DimOverride){c->ch[i].dim->name, c->ch[i].pad_to};
    memset(&cp2, 0, sizeof cp2);
    if (check_program(&scratch, S->cp->parsed, &so, &cp2) != EXIT_OK || !cp2.prog || !cp2.prog->mesh ||
        diag_quiet_error_count() != errors)
      goto done;
    prog = cp2.prog;
  }
  Program q = *prog;
  q.diag_once = NULL;
  /* the layout: the program's rules, a grown rule in place, new rules last */
  const Layout *L0 = prog->layout;
  Layout L = {.name = L0 ? L0->name : intern_cstr("suggested"), .loc = L0 ? L0->loc : (SrcLoc){0}};
  L.rules = ARENA_ARRAY(&scratch, LayoutRule, (L0 ? L0->nrules : 0) + FIT_MAX_CHANGES);
  if (L0) memcpy(L.rules, L0->rules, sizeof(LayoutRule) * (size_t)L0->nrules), L.nrules = L0->nrules;
  for (int i = 0; i < c->n; i++) {
    const FitChange *ch = &c->ch[i];
    if (ch->kind != FIT_RULE) continue;
    int r = ch->extends ? rule_for(S, ch->dim->name) : -1; /* the same index in L0 */
    LayoutRule *lr = r >= 0 ? &L.rules[r] : &L.rules[L.nrules++];
    lr->dim = ch->dim->name;
    lr->naxes = ch->naxes;
    for (int k = 0; k < ch->naxes; k++) lr->axes[k] = S->mesh->axes[ch->axes[k]].name;
    if (r < 0) lr->loc = L.loc;
  }
  q.layout = &L;
  Step st;
  if (prog->step) {
    st = *prog->step;
    st.remat = (RematKind)cand_value(S, c, FIT_REMAT);
    st.zero = cand_value(S, c, FIT_ZERO);
    st.microbatches = cand_value(S, c, FIT_MICRO);
    q.step = &st;
  }
  IrModule *mq = check_build_ir(&scratch, &q);
  bool built = mq && pipeline_run(mq, &q);
  if (mq) S->work += mq->nvalues;
  if (!built || diag_quiet_error_count() != errors) goto done;
  MemoryReport r;
  memory_estimate(&q, mq, &r);
  if (diag_quiet_error_count() != errors) goto done;
  figures_of(&r, mq, q.mesh, f);
  if (A) take_live(S, mq, &q, &scratch, A);
done:
  diag_pop_quiet();
  if (!f->valid) S->out->invalid++;
  arena_free(&scratch);
}

/* ---- the search ---- */

static void setup(Search *S) {
  const Program *p = S->p;
  const IrModule *m = S->m;
  const Layout *L = p->layout;
  S->rules = ARENA_ARRAY(S->a, FRule, (L ? L->nrules : 0) + 1);
  for (int r = 0; L && r < L->nrules; r++) {
    const LayoutRule *lr = &L->rules[r];
    FRule *f = &S->rules[S->nrules++];
    f->dim = lr->dim;
    bool ok = lr->naxes >= 1 && lr->naxes <= MAX_AXES_PER_DIM;
    for (int k = 0; ok && k < lr->naxes; k++) {
      int a = mesh_axis_index(S->mesh, lr->axes[k]);
      if (a < 0) ok = false;
      else f->ax[k] = (int8_t)a, f->mask |= (uint16_t)(1u << a);
    }
    f->nax = ok ? lr->naxes : 0;
    f->prod = axes_prod(S->mesh, f->mask);
  }
  S->step = p->step && p->step->kind == STEP_TRAIN ? p->step : NULL;
  /* dims a rule may shard: those of the params and of the entry's inputs */
  S->dims = ARENA_ARRAY(S->a, const Dim *, p->ndims + 1);
  S->layers = 1;
  for (int di = 0; di < p->ndims; di++) {
    const Dim *d = p->dims[di];
    bool used = false;
    for (int i = 0; !used && i < m->nparams; i++) used = tensor_type_find(&m->params[i].type, d) >= 0;
    for (int i = 0; !used && p->entry && i < p->entry->nargs; i++)
      for (int k = 0; k < p->entry->args[i].type.rank; k++) used |= p->entry->args[i].type.dims[k] == d;
    if (used && d->size > 1) S->dims[S->ndims++] = d;
    if (is_stack_dim(S, d) && d->size > S->layers) S->layers = d->size;
  }
  /* the entry's first input on one device: its rows (all dims but a float input's features) */
  const IrFunc *f = m->main;
  if (f->ninputs > 0) {
    const Value *x = f->inputs[0];
    int ntok = dtype_is_int(x->type.dtype) ? x->type.rank : x->type.rank - 1;
    S->tokens_local = 1;
    for (int d = 0; d < ntok; d++) S->tokens_local *= (double)sharding_local_extent(&x->type, &x->sharding, S->mesh, d);
    S->input_bytes = (double)sharding_local_bytes(&x->type, &x->sharding, S->mesh);
  }
  S->compute_s = S->out->base.compute_s;
}

/* Params, gradients and optimizer state of the whole model, and the devices they need at least. */
static void bound(Search *S) {
  FitAdvice *o = S->out;
  bool adam = S->step && S->step->optimizer == OPT_ADAM, master = S->step && S->step->master != DT_NONE;
  for (int i = 0; i < S->m->nparams; i++) {
    const IrParam *ip = &S->m->params[i];
    double el = (double)tensor_type_elements(&ip->type), b = dtype_bytes(ip->type.dtype);
    o->state_params += el * b;
    if (!S->step) continue;
    o->state_grads += el * b;
    o->state_optimizer += el * ((adam ? 8 : 0) + (master && ip->type.dtype != DT_F32 ? 4 : 0));
  }
  double cap = S->mesh->target->hbm, all = o->state_params + o->state_grads + o->state_optimizer;
  o->min_devices = cap > 0 ? (int64_t)ceil(all / cap) : 0;
}

static int by_est(const void *a, const void *b) {
  const Cand *x = a, *y = b;
  return x->est < y->est ? -1 : x->est > y->est ? 1 : x->n - y->n;
}

/* Cheapest first: the time the changes are estimated to add; then fewer changes; then smaller. */
static int by_cost(const void *a, const void *b) {
  const Cand *x = a, *y = b;
  if (x->proxy != y->proxy) return x->proxy < y->proxy ? -1 : 1;
  if (x->n != y->n) return x->n - y->n;
  return x->est < y->est ? -1 : x->est > y->est;
}

/* The time a checked plan adds per step and device (ideal): its ops' and its collectives', over
 * the program's (a rule that shards the batch takes compute off each device). */
static double plan_cost(const Search *S, const FitFigures *f) {
  return (f->compute_s - S->out->base.compute_s) + (f->comm_s - S->out->base.comm_s);
}

static void add_plan(Search *S, const Cand *c, const FitFigures *f) {
  FitAdvice *o = S->out;
  if (o->nplans == FIT_MAX_PLANS) return;
  FitPlan *pl = &o->plans[o->nplans++];
  memset(pl, 0, sizeof *pl);
  pl->n = c->n;
  memcpy(pl->change, c->ch, sizeof(FitChange) * (size_t)c->n);
  pl->after[c->n - 1] = *f;
  pl->added_s = plan_cost(S, f);
}

/* The programs of a plan's first changes, checked, so that each change has its own figures (within
 * the budget). A change in the middle that saves nothing by itself goes when the plan without it,
 * checked in full, is as small and fits as well (the search met it beside a change that saves
 * enough alone); where the plan needs it, it stays, marked `enabling`. */
static void check_prefixes(Search *S, FitPlan *pl) {
  memset(pl->enabling, 0, sizeof pl->enabling);
  for (int i = 0; i + 1 < pl->n && work_for_check(S, HARD_WORK); i++) {
    Cand c = {.n = i + 1};
    memcpy(c.ch, pl->change, sizeof(FitChange) * (size_t)(i + 1));
    check_full(S, &c, &pl->after[i], NULL);
  }
  for (int i = 0; i + 1 < pl->n; i++) {
    const FitFigures *before = i ? &pl->after[i - 1] : &S->out->base, *at = &pl->after[i];
    const FitFigures *end = &pl->after[pl->n - 1];
    if (!before->valid || !at->valid || at->total < before->total) continue;
    if (!work_for_check(S, HARD_WORK)) break;
    Cand c = {.n = 0};
    for (int k = 0; k < pl->n; k++)
      if (k != i) c.ch[c.n++] = pl->change[k];
    FitFigures f;
    check_full(S, &c, &f, NULL);
    if (f.valid && f.total <= end->total && (f.fits || !end->fits)) {
      memmove(&pl->change[i], &pl->change[i + 1], sizeof(FitChange) * (size_t)(pl->n - i - 1));
      pl->n--;
      pl->after[pl->n - 1] = f;
      check_prefixes(S, pl); /* the programs after i lost a change: their figures again */
      return;
    }
    pl->enabling[i] = true;
  }
  /* a plan ends at its first program that fits (the changes after it are not needed), and last
   * changes that save nothing go (the program before them is as small, and checked) */
  for (int i = 0; i + 1 < pl->n; i++)
    if (pl->after[i].valid && pl->after[i].fits) {
      pl->n = i + 1;
      break;
    }
  while (pl->n > 1) {
    const FitFigures *before = &pl->after[pl->n - 2], *last = &pl->after[pl->n - 1];
    if (!before->valid || before->total > last->total || before->fits != last->fits) break;
    pl->n--;
  }
  pl->added_s = plan_cost(S, &pl->after[pl->n - 1]);
}

/* A checked plan no smaller than one already kept whose changes it all makes (a change that
 * saved nothing). */
static bool dominated(const FitPlan *kept, int n, const Cand *c, const FitFigures *f) {
  for (int i = 0; i < n; i++) {
    const FitPlan *k = &kept[i];
    bool subset = k->n <= c->n;
    for (int a = 0; a < k->n && subset; a++) {
      bool has = false;
      for (int b = 0; b < c->n && !has; b++) has = same_change(&k->change[a], &c->ch[b]);
      subset = has;
    }
    if (subset && k->after[k->n - 1].total <= f->total) return true;
  }
  return false;
}

/* Cheapest first (the time it adds), then fewer changes. */
static int plan_order(const void *a, const void *b) {
  const FitPlan *x = a, *y = b;
  if (x->added_s != y->added_s) return x->added_s < y->added_s ? -1 : 1;
  return x->n - y->n;
}

static int plan_smaller(const void *a, const void *b) {
  const FitPlan *x = a, *y = b;
  int64_t tx = x->after[x->n - 1].total, ty = y->after[y->n - 1].total;
  return tx < ty ? -1 : tx > ty;
}

static const char *axes_text(const Mesh *m, const int8_t *ax, int n, char *buf, size_t len) {
  int k = snprintf(buf, len, "%s", n > 1 ? "(" : "");
  for (int i = 0; i < n && k < (int)len; i++)
    k += snprintf(buf + k, len - (size_t)k, "%s%s", i ? ", " : "", m->axes[ax[i]].name);
  if (n > 1 && k < (int)len) snprintf(buf + k, len - (size_t)k, ")");
  return buf;
}

static const char *mask_text(const Mesh *m, uint16_t mask, char *buf, size_t len) {
  int8_t ax[MAX_MESH_AXES];
  int n = 0;
  for (int a = 0; a < m->naxes; a++)
    if ((mask >> a) & 1) ax[n++] = (int8_t)a;
  return axes_text(m, ax, n, buf, len);
}

void fit_change_text(const Program *p, const FitChange *c, char *buf, size_t n) {
  const Mesh *m = p->mesh;
  const char *lname = p->layout ? p->layout->name : NULL;
  char ax[128], pad[160] = "";
  static const char *const remat[] = {"none", "full", "dots", "selective"};
  if (c->pad_to > 0)
    snprintf(pad, sizeof pad, "pad '%s' from %lld to %lld (`-D %s=%lld`, or in its declaration)", c->dim->name,
             (long long)c->dim->size, (long long)c->pad_to, c->dim->name, (long long)c->pad_to);
  switch (c->kind) {
  case FIT_RULE: {
    axes_text(m, c->axes, c->naxes, ax, sizeof ax);
    const char *sep = c->pad_to > 0 ? " and " : "";
    if (c->extends) {
      char old[128];
      int8_t o[MAX_AXES_PER_DIM];
      int no = 0;
      for (int k = 0; k < c->naxes; k++)
        if (!((c->added >> c->axes[k]) & 1)) o[no++] = c->axes[k];
      axes_text(m, o, no, old, sizeof old);
      snprintf(buf, n, "%s%sextend `%s: %s` to `%s: %s` in layout %s", pad, sep, c->dim->name, old, c->dim->name, ax,
               lname ? lname : "?");
    } else if (lname) {
      snprintf(buf, n, "%s%sadd `%s: %s` to layout %s", pad, sep, c->dim->name, ax, lname);
    } else {
      snprintf(buf, n, "%s%sadd `%s: %s` to a new layout (the program declares none)", pad, sep, c->dim->name, ax);
    }
    return;
  }
  case FIT_PAD: snprintf(buf, n, "%s, so that its layout rule divides it", pad); return;
  case FIT_REMAT: snprintf(buf, n, "set `remat = %s` in the train step", remat[c->value % 4]); return;
  case FIT_ZERO: snprintf(buf, n, "set `zero = %d` in the train step", c->value); return;
  case FIT_MICRO: snprintf(buf, n, "set `microbatches = %d` in the train step", c->value); return;
  }
}

/* What a change adds, in words (the figures are the checked programs'). */
static void change_what(const Search *S, const FitChange *c, char *buf, size_t n) {
  char ax[128];
  switch (c->kind) {
  case FIT_RULE: {
    mask_text(S->mesh, c->added, ax, sizeof ax);
    bool in_params = false;
    for (int i = 0; i < S->m->nparams && !in_params; i++) in_params = tensor_type_find(&S->m->params[i].type, c->dim) >= 0;
    Cand none = {0};
    RuleSet rs;
    rule_set(S, &none, &rs);
    bool fsdp = (c->added & batch_axes(S, rs.r, rs.n, &none)) != 0;
    if (c->dim->name == intern_cstr("batch"))
      snprintf(buf, n, "data parallelism over %s%s: fewer rows per device, gradients reduced over it%s", ax,
               c->extends ? " as well" : "", c->extends ? " too" : "");
    else if (in_params && fsdp)
      snprintf(buf, n, "AllGathers of the weights with '%s' over %s before each use, forward and backward, and "
               "ReduceScatters of their gradients (FSDP)", c->dim->name, ax);
    else if (in_params)
      snprintf(buf, n, "collectives over %s where ops contract or gather '%s' (tensor parallelism: partial sums "
               "reduced, activations resharded)", ax, c->dim->name);
    else
      snprintf(buf, n, "collectives over %s where ops need '%s' whole (sequence parallelism: activations gathered "
               "and reduce-scattered)", ax, c->dim->name);
    return;
  }
  case FIT_PAD:
    snprintf(buf, n, "%lld more rows of '%s' (+%.2f%%) where it appears: params and FLOPs", (long long)(c->pad_to - c->dim->size),
             c->dim->name, 100.0 * (double)(c->pad_to - c->dim->size) / (double)c->dim->size);
    return;
  case FIT_REMAT: snprintf(buf, n, "the forward recomputed in the backward: more FLOPs, no communication"); return;
  case FIT_ZERO:
    snprintf(buf, n, c->value >= 2 ? "gradients and optimizer state sharded over the batch axes: gradients "
                                     "reduce-scattered, updated params all-gathered"
                                   : "optimizer state sharded over the batch axes: gradients reduce-scattered, "
                                     "updated params all-gathered");
    return;
  case FIT_MICRO:
    snprintf(buf, n, "%d microbatches run one after another: smaller matmuls, gradients accumulated in f32", c->value);
    return;
  }
}

static void fit_search_(const FitInput *in, FitAdvice *out);

void fit_search(const FitInput *in, FitAdvice *out) {
  const char *was = mem_activity("searching for a program that fits");
  fit_search_(in, out);
  mem_activity(was);
}

static void fit_search_(const FitInput *in, FitAdvice *out) {
  memset(out, 0, sizeof *out);
  const CheckedProgram *cp = in->cp;
  if (!cp || !cp->prog || !cp->ir || !cp->prog->mesh || in->base->fits) return;
  Arena arena;
  arena_init(&arena);
  Search S = {.cp = cp, .p = cp->prog, .m = cp->ir, .mesh = cp->prog->mesh, .a = &arena, .out = out};
  clock_gettime(CLOCK_MONOTONIC, &S.t0);
  figures_of(in->base, cp->ir, S.mesh, &out->base);
  setup(&S);
  bound(&S);

  /* anchors: the program, then each other remat of a train step */
  Anchor *A0 = &S.anchor[S.nanchor++];
  A0->remat = S.step ? (int)S.step->remat : 0;
  A0->fig = out->base;
  {
    Arena scratch;
    arena_init(&scratch);
    take_live(&S, S.m, S.p, &scratch, A0);
    arena_free(&scratch);
  }
  Cand none = {0};
  states(&S, &none, A0->states, NULL);
  for (int r = REMAT_NONE; S.step && S.layers > 1 && r <= REMAT_DOTS; r++) {
    if (r == (int)S.step->remat) continue;
    Anchor *A = &S.anchor[S.nanchor];
    Cand c = {.n = 1, .ch[0] = {.kind = FIT_REMAT, .value = r}};
    A->remat = r;
    check_full(&S, &c, &A->fig, A);
    if (!A->fig.valid) continue;
    states(&S, &none, A->states, NULL);
    S.nanchor++;
  }

  /* beam search over estimates */
  CandVec pool = {0}, beam = {0};
  VEC_PUSH(S.a, beam, none);
  double cap = S.mesh->target->hbm;
  for (int depth = 1; depth <= FIT_MAX_CHANGES && beam.len > 0; depth++) {
    int from = pool.len;
    for (int i = 0; i < beam.len; i++) expand(&S, &beam.data[i], &pool);
    beam.len = 0;
    CandVec next = {0};
    for (int i = from; i < pool.len; i++)
      if (pool.data[i].est > cap) VEC_PUSH(S.a, next, pool.data[i]);
    if (next.len > 1) qsort(next.data, (size_t)next.len, sizeof(Cand), by_est);
    for (int i = 0; i < next.len && i < BEAM; i++) VEC_PUSH(S.a, beam, next.data[i]);
  }

  /* check the candidates estimated to fit, cheapest first; where none does, the smallest */
  CandVec fit = {0};
  for (int i = 0; i < pool.len; i++)
    if (pool.data[i].est <= cap) VEC_PUSH(S.a, fit, pool.data[i]);
  if (fit.len > 1) qsort(fit.data, (size_t)fit.len, sizeof(Cand), by_cost);
  if (pool.len > 1) qsort(pool.data, (size_t)pool.len, sizeof(Cand), by_est);
  FitPlan closest[FIT_MAX_PLANS];
  int nclosest = 0;
  CandVec invalid = {0}; /* checked with errors: a candidate with all their changes is not checked */
  bool possible = out->min_devices <= S.mesh->devices;
  for (int pass = possible ? 0 : 1; pass < 2 && out->nplans == 0; pass++) {
    const CandVec *list = pass ? &pool : &fit;
    int checked_before = out->checked;
    for (int i = 0; i < list->len && out->nplans < FIT_MAX_PLANS && (!pass || nclosest < FIT_MAX_PLANS) &&
                    out->checked < MAX_CHECKS && (!pass || out->checked - checked_before < CLOSEST_CHECKS); i++) {
      if (!work_for_check(&S, out->nplans > 0 ? BUDGET_WORK : HARD_WORK)) break;
      const Cand *c = &list->data[i];
      if (pass && c->est <= cap) continue; /* checked in the first pass */
      if (contains_invalid(c, &invalid)) continue;
      FitFigures f;
      check_full(&S, c, &f, NULL);
      if (!f.valid) VEC_PUSH(S.a, invalid, *c);
      if (f.valid && f.fits) {
        add_plan(&S, c, &f);
      } else if (f.valid && f.total < out->base.total && nclosest < FIT_MAX_PLANS && !dominated(closest, nclosest, c, &f)) {
        FitPlan *pl = &closest[nclosest++];
        memset(pl, 0, sizeof *pl);
        pl->n = c->n;
        memcpy(pl->change, c->ch, sizeof(FitChange) * (size_t)c->n);
        pl->after[c->n - 1] = f;
        pl->added_s = plan_cost(&S, &f);
      }
    }
  }
  out->found = out->nplans > 0;
  if (out->found) {
    qsort(out->plans, (size_t)out->nplans, sizeof(FitPlan), plan_order);
  } else {
    memcpy(out->plans, closest, sizeof(FitPlan) * (size_t)nclosest);
    out->nplans = nclosest;
    if (out->nplans > 1) qsort(out->plans, (size_t)out->nplans, sizeof(FitPlan), plan_smaller);
  }
  if (out->nplans > 0) check_prefixes(&S, &out->plans[0]);
  /* a plan with every change of an earlier one and no smaller says nothing more */
  for (int j = out->nplans - 1; j > 0; j--)
    for (int i = 0; i < j; i++) {
      Cand c = {.n = out->plans[j].n};
      memcpy(c.ch, out->plans[j].change, sizeof(FitChange) * (size_t)c.n);
      if (!dominated(&out->plans[i], 1, &c, &out->plans[j].after[c.n - 1])) continue;
      memmove(&out->plans[j], &out->plans[j + 1], sizeof(FitPlan) * (size_t)(out->nplans - j - 1));
      out->nplans--;
      break;
    }
  /* each skipped rule's padding, alone */
  for (int di = 0; di < S.ndims && out->npads < FIT_MAX_PLANS; di++) {
    const Dim *d = S.dims[di];
    int r = rule_for(&S, d->name);
    if (r < 0 || d->size % S.rules[r].prod == 0 || !work_for_check(&S, HARD_WORK)) continue;
    Cand c = {.n = 1, .ch[0] = {.kind = FIT_PAD, .dim = d, .pad_to = pad_size(d, S.rules[r].prod)}};
    if (c.ch[0].pad_to <= 0) continue;
    FitPlan *pl = &out->pads[out->npads];
    memset(pl, 0, sizeof *pl);
    pl->n = 1;
    pl->change[0] = c.ch[0];
    check_full(&S, &c, &pl->after[0], NULL);
    if (!pl->after[0].valid) continue;
    pl->added_s = plan_cost(&S, &pl->after[0]);
    fit_change_text(S.p, &pl->change[0], pl->text[0], sizeof pl->text[0]);
    change_what(&S, &pl->change[0], pl->what[0], sizeof pl->what[0]);
    out->npads++;
  }
  for (int i = 0; i < out->nplans; i++)
    for (int k = 0; k < out->plans[i].n; k++) {
      fit_change_text(S.p, &out->plans[i].change[k], out->plans[i].text[k], sizeof out->plans[i].text[k]);
      change_what(&S, &out->plans[i].change[k], out->plans[i].what[k], sizeof out->plans[i].what[k]);
    }
  out->seconds = elapsed(&S);
  arena_free(&arena);
}
