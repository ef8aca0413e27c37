/* ir_fuse.c: the attention pattern becomes one fused op (language.md, Semantics: Attention).
 *
 * In: an IrModule straight from ir_build. Out: the same module where every chain
 *
 *     s  = contract(q, k, over: d)            one contracted dim
 *     s' = s * c | c * s | s / c               any number of scalings by constants, and
 *     s''= causal(s', qdim, kdim)              at most one causal mask, in either order
 *     p  = softmax(s'', over: kdim)
 *     o  = contract(p, v, over: kdim)
 *
 * whose intermediates (s, s', s'', p and the constants) have no other use has become
 *
 *     o  = attention(q, k, v)  dims [d, kdim, qdim], scalar = product of the scalings, flag = causal
 *
 * The result value (and so its type and dim order) is the unfused o itself; the op keeps o's
 * contraction's place and location, and loc2 remembers the scores contraction's. The query dim is
 * causal's first dim, else the one dim of q that neither k has nor is d (when q has several, the
 * one of kdim's size, then the first); with none, the chain is left alone.
 *
 * Loop bodies are fused too (each region is isolated, so uses are counted per region). */
#include <stdlib.h>
#include <string.h>

#include "ir.h"

typedef struct Fuse {
  IrModule *m;
  int *uses;    /* by value id, for the region being fused */
  int fused;
} Fuse;

static void count_uses(Fuse *f, const IrFunc *fn) {
  memset(f->uses, 0, sizeof(int) * (size_t)(f->m->nvalues > 0 ? f->m->nvalues : 1));
  for (const Op *o = fn->first; o; o = o->next)
    for (int i = 0; i < o->noperands; i++)
      if (o->operands[i]) f->uses[o->operands[i]->id]++;
  for (int i = 0; i < fn->noutputs; i++)
    if (fn->outputs[i]) f->uses[fn->outputs[i]->id]++;
}

/* A value defined by an op of `fn` and used exactly once (by the next op of the chain). */
static Op *single_use_def(Fuse *f, const IrFunc *fn, const Value *v) {
  if (!v || !v->def || v->func != fn || f->uses[v->id] != 1) return NULL;
  return v->def;
}

static bool is_scalar_const(const IrFunc *fn, const Value *v) {
  return v && v->def && v->func == fn && v->def->kind == OP_CONST && v->type.rank == 0;
}

#define MAX_CHAIN 16

/* Tries the pattern ending at `c2` (a contraction); rewrites it in place on success. */
static bool fuse_at(Fuse *f, IrFunc *fn, Op *c2) {
  if (c2->kind != OP_CONTRACT || c2->ndims != 1 || c2->noperands != 2) return false;
  Dim *kdim = c2->dims[0];
  Value *p = c2->operands[0], *v = c2->operands[1];
  Op *sm = single_use_def(f, fn, p);
  if (!sm || sm->kind != OP_SOFTMAX || sm->ndims != 1 || sm->dims[0] != kdim) return false;
  Op *chain[MAX_CHAIN];
  int nchain = 0;
  chain[nchain++] = sm;
  Op *causal = NULL, *c1 = NULL;
  double scale = 1;
  Value *cur = sm->operands[0];
  while (!c1) {
    Op *d = single_use_def(f, fn, cur);
    if (!d || nchain + 2 > MAX_CHAIN) return false;
    if (d->kind == OP_CAUSAL && !causal && d->ndims == 2 && d->dims[1] == kdim) {
      causal = d;
      chain[nchain++] = d;
      cur = d->operands[0];
    } else if (d->kind == OP_MUL || d->kind == OP_DIV) {
      Value *a = d->operands[0], *c = d->operands[1];
      if (d->kind == OP_MUL && is_scalar_const(fn, a) && !is_scalar_const(fn, c)) {
        Value *t = a;
        a = c, c = t;
      }
      if (!is_scalar_const(fn, c) || is_scalar_const(fn, a)) return false;
      if (!tensor_type_equal(&a->type, &d->results[0]->type)) return false;
      double k = c->def->scalar;
      if (d->kind == OP_DIV) {
        if (k == 0) return false;
        scale /= k;
      } else {
        scale *= k;
      }
      chain[nchain++] = d;
      if (f->uses[c->id] == 1) chain[nchain++] = c->def;
      cur = a;
    } else if (d->kind == OP_CONTRACT && d->ndims == 1 && d->noperands == 2) {
      c1 = d;
      chain[nchain++] = d;
    } else {
      return false;
    }
  }
  Value *q = c1->operands[0], *k = c1->operands[1];
  Dim *hd = c1->dims[0];
  /* kdim is the keys' own dim; the keys have no other dim the queries lack. */
  if (tensor_type_find(&k->type, kdim) < 0 || tensor_type_find(&q->type, kdim) >= 0) return false;
  if (tensor_type_find(&v->type, kdim) < 0) return false;
  for (int i = 0; i < k->type.rank; i++)
    if (k->type.dims[i] != kdim && tensor_type_find(&q->type, k->type.dims[i]) < 0) return false;
  Dim *qdim = NULL;
  if (causal) {
    qdim = causal->dims[0];
  } else {
    for (int i = 0; i < q->type.rank; i++) {
      Dim *d = q->type.dims[i];
      if (d == hd || tensor_type_find(&k->type, d) >= 0) continue;
      if (!qdim || (d->size == kdim->size && qdim->size != kdim->size)) qdim = d;
    }
  }
  if (!qdim || tensor_type_find(&q->type, qdim) < 0 || tensor_type_find(&k->type, qdim) >= 0 ||
      tensor_type_find(&v->type, qdim) >= 0)
    return false;

  Value **ops = ARENA_ARRAY(f->m->arena, Value *, 3);
  ops[0] = q, ops[1] = k, ops[2] = v;
  Dim **dims = ARENA_ARRAY(f->m->arena, Dim *, 3);
  dims[0] = hd, dims[1] = kdim, dims[2] = qdim;
  c2->kind = OP_ATTENTION;
  c2->operands = ops;
  c2->noperands = 3;
  c2->dims = dims;
  c2->ndims = 3;
  c2->scalar = scale;
  c2->flag = causal != NULL;
  c2->loc2 = c1->loc;
  for (int i = 0; i < nchain; i++) ir_remove(fn, chain[i]);
  return true;
}

static void fuse_func(Fuse *f, IrFunc *fn) {
  for (Op *o = fn->first; o; o = o->next)
    if (o->kind == OP_LOOP && o->body) fuse_func(f, o->body);
  count_uses(f, fn);
  for (Op *o = fn->first; o; o = o->next) {
    if (o->kind != OP_CONTRACT) continue;
    if (fuse_at(f, fn, o)) {
      f->fused++;
      count_uses(f, fn);
    }
  }
}

int ir_fuse_attention(IrModule *m) {
  if (!m || !m->main) return 0;
  Fuse f = {.m = m};
  f.uses = calloc((size_t)(m->nvalues > 0 ? m->nvalues : 1), sizeof(int));
  if (!f.uses) return 0;
  fuse_func(&f, m->main);
  free(f.uses);
  return f.fused;
}
