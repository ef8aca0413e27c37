/* plan_search.c: `shardc plan`'s search (see plan_search.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "memory.h"
#include "plan_estimate.h"
#include "plan_search.h"
#include "report.h"
#include "sim.h"

const char *const plan_axis_names[PLAN_AXES] = {"stage", "data", "fsdp", "ep", "ctx", "model"};
enum { AX_STAGE, AX_DATA, AX_FSDP, AX_EP, AX_CTX, AX_MODEL };

#define PLAN_MESH "planned"
#define PLAN_LAYOUT "plan"

typedef struct Search {
  Arena *a;
  const PlanInput *in;
  PlanResult *out;
  const Program *p;
  /* the dims the strategies shard (0: the program has none) */
  int64_t batch, seq, embed, heads, kv_heads, hidden, vocab, experts, layers;
  const char *layers_name;
  /* the train block as written: its header line, the lines kept, where it is in the main file */
  const char *header, *kept;
  int first_line, last_line; /* 1-based, inclusive */
  double state_bytes, opt_bytes; /* global: params + grads; optimizer state and master copies */
  double model_flops;            /* global, one step (the first simulated program's) */
  bool own_tp_overlap;           /* the program's own tp_overlap, kept where no model axis is searched */
  PlanModel model;               /* what the estimate reads */
  double t0;
  double next_progress;
  VEC(PlanCand) strategies;      /* past the bound, estimated: the simulation's queue */
  VEC(PlanCand) cands;
} Search;

/* Strategies simulated, the best by the estimate: "the full simulation only for the best few
 * hundred" programs (each strategy is 1 to 3 programs, remat escalating until one fits). */
enum { PLAN_SIMULATE = 100 };

/* CPU time of this process: the estimates are timed by it, which a preemption does not inflate */
static double cpu_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int64_t plan_dim_size(const Program *p, const char *name) {
  for (int i = 0; i < p->ndims; i++)
    if (strcmp(p->dims[i]->name, name) == 0) return p->dims[i]->size;
  return 0;
}

/* ---- the texts ---- */

static const char *line_at(const char *text, int line, int *len) {
  const char *s = text;
  for (int l = 1; l < line && s; l++) {
    s = strchr(s, '\n');
    if (s) s++;
  }
  if (!s) return NULL;
  *len = (int)strcspn(s, "\n");
  return s;
}

/* The train block's lines in the main file, the header and the keys the search does not set. */
static bool read_step(Search *S) {
  const Step *st = S->p->step;
  const Source *src = S->p->main_file;
  if (!st || !st->ast || !src || st->ast->loc.file != src) return false;
  int first = st->ast->loc.line, len;
  const char *h = line_at(src->text, first, &len);
  if (!h || !memchr(h, '{', (size_t)len)) return false;
  S->header = arena_strndup(S->a, h, (size_t)((const char *)memchr(h, '{', (size_t)len) - h + 1));
  S->out->step_name = arena_strndup(S->a, h, (size_t)((const char *)memchr(h, '{', (size_t)len) - h - 1));
  static const char *const set[] = {"remat", "microbatches", "schedule", "zero", "stage_layers", "tp_overlap"};
  char *kept = arena_printf(S->a, "%s", "");
  for (int l = first + 1;; l++) {
    const char *s = line_at(src->text, l, &len);
    if (!s) return false;
    size_t ind = strspn(s, " \t");
    if ((int)ind < len && s[ind] == '}') {
      S->first_line = first, S->last_line = l;
      break;
    }
    size_t kl = strspn(s + ind, "abcdefghijklmnopqrstuvwxyz_0123456789");
    bool drop = false;
    for (size_t k = 0; k < sizeof set / sizeof set[0]; k++)
      drop |= kl == strlen(set[k]) && strncmp(s + ind, set[k], kl) == 0;
    if (!drop && (int)ind < len) kept = arena_printf(S->a, "%s  %.*s\n", kept, len - (int)ind, s + ind);
  }
  S->kept = kept;
  return true;
}

static const char *remat_name(int r) {
  static const char *const n[] = {"none", "full", "dots", "selective"};
  return n[r & 3];
}

static void texts(Search *S, PlanCand *c) {
  Arena *a = S->a;
  const Target *T = S->in->target;
  char *mesh = arena_printf(a, "%s[", T->name);
  bool any = false;
  for (int k = 0; k < PLAN_AXES; k++)
    if (c->size[k] > 1) mesh = arena_printf(a, "%s%s%s: %d", mesh, any ? ", " : "", plan_axis_names[k], c->size[k]), any = true;
  if (!any) mesh = arena_printf(a, "%sdata: 1", mesh);
  c->mesh = arena_printf(a, "%s]", mesh);

  int t = c->size[AX_MODEL], cx = c->size[AX_CTX], p = c->size[AX_STAGE];
  char *L = arena_printf(a, "layout %s {\n", PLAN_LAYOUT), *batch = arena_printf(a, "%s", "");
  int nb = 0;
  for (int k = AX_DATA; k <= AX_EP; k++)
    if (c->size[k] > 1) batch = arena_printf(a, "%s%s%s", batch, nb++ ? ", " : "", plan_axis_names[k]);
  if (nb) L = arena_printf(a, nb > 1 ? "%s  batch: (%s)\n" : "%s  batch: %s\n", L, batch);
  if (c->fsdp) L = arena_printf(a, "%s  embed: %s\n", L, c->size[AX_FSDP] > 1 ? "fsdp" : "data");
  int e = c->size[AX_EP];
  if (p > 1) L = arena_printf(a, "%s  %s: stage\n", L, S->layers_name);
  if (e > 1) L = arena_printf(a, "%s  expert: ep\n", L);
  if (t > 1) {
    if (S->heads && S->heads % t == 0) L = arena_printf(a, "%s  heads: model\n", L);
    if (S->kv_heads && S->kv_heads % t == 0) L = arena_printf(a, "%s  kv_heads: model\n", L);
    if (S->hidden && S->hidden % t == 0) L = arena_printf(a, "%s  hidden: model\n", L);
    if (S->vocab && S->vocab % t == 0) L = arena_printf(a, "%s  vocab: model\n", L);
  }
  if (cx > 1) L = arena_printf(a, "%s  seq: ctx\n", L);
  else if (c->sp) L = arena_printf(a, "%s  seq: model\n", L);
  c->layout = arena_printf(a, "%s}", L);

  char *st = arena_printf(a, "%s\n%s  remat = %s\n", S->header, S->kept, remat_name(c->remat));
  if (c->microbatches > 1) st = arena_printf(a, "%s  microbatches = %d\n", st, c->microbatches);
  if (p > 1 && c->interleave > 1) st = arena_printf(a, "%s  schedule = interleaved(%d)\n", st, c->interleave);
  else if (p > 1) st = arena_printf(a, "%s  schedule = 1f1b\n", st);
  if (c->zero) st = arena_printf(a, "%s  zero = %d\n", st, c->zero);
  if (c->tp_off) st = arena_printf(a, "%s  tp_overlap = off\n", st);
  c->step = arena_printf(a, "%s}", st);
}

/* The main file with the candidate's train block in place of the written one, and its mesh and
 * layout declared after everything: the program a user gets by pasting the texts. */
static const char *program_text(Search *S, const PlanCand *c, Arena *a) {
  const char *text = S->p->main_file->text;
  int len;
  const char *from = line_at(text, S->first_line, &len);
  const char *to = line_at(text, S->last_line, &len);
  to += len;
  return arena_printf(a, "%.*s%s%s\n\nmesh %s = %s\n\n%s\n", (int)(from - text), text, c->step, to, PLAN_MESH, c->mesh, c->layout);
}

/* ---- evaluation ---- */

/* "all_reduce over (data, model) [backward] x80" -> "(data, model)"; NULL if not a collective's. */
static const char *axes_of(Arena *a, const char *what) {
  const char *o = strstr(what, " over ");
  if (!o) return strstr(what, "pipeline") ? "stage" : NULL;
  o += 6;
  size_t n = *o == '(' ? strcspn(o, ")") + 1 : strcspn(o, " [");
  return arena_strndup(a, o, n);
}

static void comm_by_axes(Search *S, const SimReport *r, PlanCand *c) {
  enum { MAXG = 8 };
  const char *name[MAXG];
  double t[MAXG];
  int n = 0;
  for (int i = 0; i < r->nitems; i++) {
    const SimItem *it = &r->items[i];
    if (it->kind != SIMK_COLLECTIVE || !it->what) continue;
    const char *ax = axes_of(S->a, it->what);
    if (!ax) continue;
    int k = 0;
    while (k < n && strcmp(name[k], ax) != 0) k++;
    if (k == n) {
      if (n == MAXG) continue;
      name[n] = ax, t[n++] = 0;
    }
    t[k] += it->time_s;
  }
  for (int i = 1; i < n; i++) /* largest first; insertion keeps ties in order */
    for (int j = i; j > 0 && t[j] > t[j - 1]; j--) {
      double x = t[j];
      t[j] = t[j - 1], t[j - 1] = x;
      const char *y = name[j];
      name[j] = name[j - 1], name[j - 1] = y;
    }
  char *s = arena_printf(S->a, "%s", "");
  for (int k = 0; k < n; k++) s = arena_printf(S->a, "%s%s%s %s", s, k ? ", " : "", name[k], report_seconds(S->a, t[k]));
  c->comm_axes = n ? s : "none";
}

/* Checks and simulates the program `text` (the main file's replacement) with the mesh and layout
 * named; fills c's figures. False when the program has errors. */
static bool evaluate_text(Search *S, PlanCand *c, const char *text, const char *mesh, const char *layout) {
  Arena scratch;
  arena_init(&scratch);
  diag_push_quiet();
  int errors = diag_quiet_error_count();
  bool ok = false;
  const CheckedProgram *cp = S->in->cp;
  Source *src = source_from_memory(S->p->main_file->path, text, strlen(text));
  Ast *ast = src ? parse_source(&scratch, src) : NULL;
  if (ast && diag_quiet_error_count() == errors) {
    ParsedProgram pp = *cp->parsed;
    pp.files = ARENA_ARRAY(&scratch, Ast *, pp.nfiles);
    memcpy(pp.files, cp->parsed->files, sizeof(Ast *) * (size_t)pp.nfiles);
    for (int f = 0; f < pp.nfiles; f++) /* the main file's place (the last but for an inline mesh) */
      if (pp.files[f] && pp.files[f]->src == S->p->main_file) pp.files[f] = ast;
    SemaOptions so = cp->so;
    so.mesh = mesh, so.layout = layout;
    CheckedProgram c2;
    memset(&c2, 0, sizeof c2);
    if (check_program(&scratch, &pp, &so, &c2) == EXIT_OK && c2.ir && pipeline_run(c2.ir, c2.prog) &&
        diag_quiet_error_count() == errors) {
      MemoryReport mem;
      memory_estimate(c2.prog, c2.ir, &mem);
      SimOptions sopt = {0};
      SimReport r;
      if (diag_quiet_error_count() == errors && sim_program(c2.prog, c2.ir, &sopt, &r)) {
        c->fits = mem.fits;
        c->memory = (double)mem.total;
        c->step_s = r.step_s, c->compute_s = r.compute_s, c->exposed_s = r.exposed_comm_s;
        c->bubble_s = r.bubble_s, c->mfu = r.mfu;
        if (!(S->model_flops > 0)) S->model_flops = r.model_flops_per_step; /* the same under every layout */
        comm_by_axes(S, &r, c);
        ok = true;
      }
      sim_report_free(&r);
    }
  }
  diag_pop_quiet();
  arena_free(&scratch); /* src stays: every Source lives until exit (source_free_all) */
  c->evaluated = ok;
  return ok;
}

static bool evaluate(Search *S, PlanCand *c) {
  texts(S, c);
  S->out->evaluated++;
  Arena a;
  arena_init(&a);
  bool ok = evaluate_text(S, c, program_text(S, c, &a), PLAN_MESH, PLAN_LAYOUT);
  arena_free(&a);
  if (!ok) S->out->invalid++;
  if (S->in->progress && now() > S->next_progress) {
    fprintf(stderr, "plan: %lld strategies estimated, %lld simulated (%lld programs), %.1f s\n",
            (long long)S->out->estimated, (long long)S->out->simulated, (long long)S->out->evaluated, now() - S->t0);
    S->next_progress = now() + 2;
  }
  return ok;
}

/* ---- the strategies ---- */

/* The least resident state (params, grads, optimizer) a device can hold under the strategy: the
 * program's global state over the most its axes can shard it. Above the HBM, no layout of it fits. */
static bool bound_fits(Search *S, const PlanCand *c) {
  int fs = c->size[AX_FSDP] > 1 ? c->size[AX_FSDP] : c->size[AX_DATA]; /* what embed is sharded over */
  double deg = (double)c->size[AX_MODEL] * c->size[AX_STAGE] * c->size[AX_EP] * (c->fsdp ? fs : 1);
  double opt_deg = c->fsdp ? deg : deg * (c->zero ? c->size[AX_DATA] : 1);
  return S->state_bytes / deg + S->opt_bytes / opt_deg <= S->in->target->hbm;
}

/* One strategy: remat from the cheapest until one fits; kept: the first that fits, else the last. */
static void try_strategy(Search *S, PlanCand base) {
  S->out->simulated++;
  static const int order[] = {0 /* none */, 3 /* selective */, 1 /* full */};
  PlanCand last = {0};
  for (int i = 0; i < 3; i++) {
    PlanCand c = base;
    c.remat = order[i];
    plan_estimate(&S->model, &c);
    /* a remat the estimate puts past twice the HBM is not simulated (the estimate's memory was
     * 0.64 to 1.82 times the checked figure on the samples: docs/plan.md); full remat always is */
    if (i < 2 && c.estimate_memory > 2 * S->in->target->hbm) {
      S->out->skipped++;
      continue;
    }
    if (!evaluate(S, &c)) continue;
    last = c;
    if (c.fits) break;
  }
  /* without a pipeline, gradient accumulation: each microbatch's activations a fraction of the
   * batch's, at full recomputation (what fits with the fewest microbatches: the largest GEMMs) */
  int64_t rows = (int64_t)base.size[AX_DATA] * base.size[AX_FSDP] * base.size[AX_EP];
  for (int m = 2; base.size[AX_STAGE] == 1 && !last.fits && m <= 64 && S->batch % (rows * m) == 0; m *= 2) {
    PlanCand c = base;
    c.remat = 1, c.microbatches = m;
    plan_estimate(&S->model, &c);
    if (!evaluate(S, &c)) continue;
    if (c.fits || !last.evaluated) last = c;
  }
  if (last.evaluated) VEC_PUSH(S->a, S->cands, last);
}

/* One strategy considered: pruned by the bound, else estimated (the cheapest remat the estimate
 * fits, as try_strategy's escalation; without a pipeline, gradient accumulation after) and queued. */
static void consider(Search *S, PlanCand base) {
  S->out->enumerated++;
  if (!bound_fits(S, &base)) {
    S->out->pruned++;
    return;
  }
  double t = cpu_now();
  static const int order[] = {0 /* none */, 3 /* selective */, 1 /* full */};
  PlanCand best = base;
  for (int i = 0; i < 3; i++) {
    PlanCand c = base;
    c.remat = order[i];
    plan_estimate(&S->model, &c);
    best = c;
    if (c.estimate_fits) break;
  }
  int64_t rows = (int64_t)base.size[AX_DATA] * base.size[AX_FSDP] * base.size[AX_EP];
  for (int m = 2; base.size[AX_STAGE] == 1 && !best.estimate_fits && m <= 64 && S->batch % (rows * m) == 0; m *= 2) {
    PlanCand c = base;
    c.remat = 1, c.microbatches = m;
    plan_estimate(&S->model, &c);
    if (c.estimate_fits) best = c;
  }
  base.estimate_s = best.estimate_s, base.estimate_memory = best.estimate_memory, base.estimate_fits = best.estimate_fits;
  S->out->estimated++;
  S->out->estimate_seconds += cpu_now() - t;
  VEC_PUSH(S->a, S->strategies, base);
}

/* The queue's order: what the estimate fits first, each group fastest first, ties in enumeration
 * order (the queue is pushed in it, and the comparison falls back to the address). */
static int strategy_cmp(const void *pa, const void *pb) {
  const PlanCand *a = pa, *b = pb;
  if (a->estimate_fits != b->estimate_fits) return a->estimate_fits ? -1 : 1;
  if (a->estimate_s != b->estimate_s) return a->estimate_s < b->estimate_s ? -1 : 1;
  return a < b ? -1 : a > b;
}

static void enumerate(Search *S) {
  int64_t N = S->in->devices;
  const Target *T = S->in->target;
  int tpmax = T->kind == TARGET_GPU ? (T->node_size > 0 ? T->node_size : 8) : 16;
  int64_t split = S->heads ? S->heads : S->hidden; /* tensor parallelism splits heads (else hidden) */
  for (int t = 1; t <= tpmax && t <= N; t++) { /* every size that divides the heads (PaLM's 12 too) */
    if (N % t || (t > 1 && (!split || split % t))) continue;
    for (int p = 1; p <= 64 && p <= N / t; p++) {
      if ((N / t) % p || (p > 1 && (!S->layers || S->layers % p))) continue;
      for (int cx = 1; cx <= 32 && cx <= N / t / p; cx *= 2) {
        if (cx > 1 && (!S->seq || S->seq % cx || S->seq / cx < 8192)) break;
        for (int e = 1; e <= 64 && e <= N / t / p / cx; e *= 2) {
          if (e > 1 && (!S->experts || S->experts % e)) break;
          if (N % ((int64_t)t * p * cx * e)) continue;
          int64_t d = N / ((int64_t)t * p * cx * e);
          if (d > INT32_MAX || (S->batch ? S->batch % (d * e) : d * e > 1)) continue;
          /* f: what FSDP shards embed over: 0 none, d all of data, else HSDP's groups of f */
          int64_t fs[48];
          int nf = 0;
          fs[nf++] = 0;
          if (d > 1) fs[nf++] = d;
          for (int64_t f = 8; f < d && nf < 48; f *= 2) /* HSDP: groups of a node or more */
            if (d % f == 0) fs[nf++] = f;
          for (int fi = 0; fi < nf; fi++) {
            int64_t f = fs[fi];
            if (f > 0 && (!S->embed || S->embed % f)) continue;
            bool fsdp = f > 0;
            int64_t dd = fsdp && f < d ? d / f : d, ff = fsdp && f < d ? f : 1;
            for (int sp = 0; sp <= 1; sp++) {
              if (sp && (t == 1 || cx > 1 || !S->seq || S->seq % t)) continue;
              for (int tpo = 0; tpo <= (t > 1); tpo++) {
              PlanCand c = {.size = {p, (int)dd, (int)ff, e, cx, t}, .fsdp = fsdp, .sp = sp, .interleave = 1};
              c.zero = !fsdp && d * e > 1 ? 1 : 0;
              c.tp_off = t > 1 ? tpo == 1 : !S->own_tp_overlap;
              if (p == 1) {
                c.microbatches = 1;
                consider(S, c);
                continue;
              }
              /* 1F1B: the bubble (p-1)/m against smaller GEMMs. The microbatches divide the rows each
               * data rank holds, R: the least divisor of R from 2p, 4p and 8p up, and R itself (one
               * row each, as Megatron-LM's published runs) */
              int64_t R = S->batch / (d * e), prev = 0;
              int64_t want[4] = {2 * (int64_t)p, 4 * (int64_t)p, 8 * (int64_t)p, R};
              for (int w = 0; w < 4; w++) {
                int64_t m = want[w];
                while (m <= R && R % m) m++;
                if (m > R || m <= prev || m > INT32_MAX) continue;
                prev = m;
                c.microbatches = (int)m;
                /* 1F1B, and interleaved(V) with V = 2 and 4 where V divides each stage's layers
                 * and the microbatches a multiple of the stages (Megatron-LM's condition) */
                for (int V = 1; V <= 4; V *= 2) {
                  if (V > 1 && ((S->layers / p) % V || m % p)) continue;
                  c.interleave = V;
                  consider(S, c);
                }
              }
              }
            }
          }
        }
      }
    }
  }
}

static int cand_cmp(const void *pa, const void *pb) {
  const PlanCand *a = pa, *b = pb;
  if (a->fits != b->fits) return a->fits ? -1 : 1;
  if (a->step_s != b->step_s) return a->step_s < b->step_s ? -1 : 1;
  return a < b ? -1 : a > b; /* qsort is not stable: the enumeration's order breaks ties */
}

void plan_search(Arena *a, const PlanInput *in, PlanResult *out) {
  memset(out, 0, sizeof *out);
  Search S = {.a = a, .in = in, .out = out, .p = in->cp->prog};
  S.t0 = now(), S.next_progress = S.t0 + 2;
  const Program *p = S.p;
  if (!p->step || p->step->kind != STEP_TRAIN) {
    out->error = "plan searches layouts for a train step, and this program has none (write a `train` block)";
    return;
  }
  if (!read_step(&S)) {
    out->error = "plan could not find the train block's lines in the program (it rewrites the block)";
    return;
  }
  S.batch = plan_dim_size(p, "batch"), S.seq = plan_dim_size(p, "seq"), S.embed = plan_dim_size(p, "embed");
  S.heads = plan_dim_size(p, "heads"), S.kv_heads = plan_dim_size(p, "kv_heads"), S.hidden = plan_dim_size(p, "hidden");
  S.vocab = plan_dim_size(p, "vocab"), S.experts = plan_dim_size(p, "expert");
  S.own_tp_overlap = p->step->tp_overlap;
  if (p->nstack_dims > 0) S.layers = p->stack_dims[0]->size, S.layers_name = p->stack_dims[0]->name;

  /* the program as written, evaluated the same way (its own mesh and layout by name) */
  MemoryReport mem;
  memory_estimate(p, in->cp->ir, &mem);
  const Step *st = p->step;
  double pb = (double)mem.param_bytes, pc = (double)mem.param_count;
  S.state_bytes = 2 * pb;
  S.opt_bytes = (st->optimizer == OPT_ADAM ? 8 * pc : 0) + (st->master != DT_NONE ? 4 * pc : 0);
  {
    PlanCand *own = &out->own;
    own->mesh = p->mesh->name, own->layout = p->layout ? p->layout->name : NULL;
    own->remat = st->remat, own->microbatches = st->microbatches, own->zero = st->zero;
    own->interleave = st->schedule == SCHED_INTERLEAVED ? st->interleave : 1, own->tp_off = !st->tp_overlap;
    evaluate_text(&S, own, p->main_file->text, p->mesh->name, p->layout ? p->layout->name : NULL);
  }

  S.model = (PlanModel){.target = in->target, .devices = in->devices, .batch = S.batch, .seq = S.seq,
                        .embed = S.embed, .heads = S.heads, .kv_heads = S.kv_heads, .hidden = S.hidden,
                        .vocab = S.vocab, .experts = S.experts, .layers = S.layers, .params = pc,
                        .state_bytes = S.state_bytes, .opt_bytes = S.opt_bytes,
                        .model_flops = S.model_flops > 0 ? S.model_flops : 6 * pc * (double)(S.batch ? S.batch : 1) * (double)(S.seq ? S.seq : 1)};
  enumerate(&S);
  if (S.strategies.len > 1) qsort(S.strategies.data, (size_t)S.strategies.len, sizeof(PlanCand), strategy_cmp);
  for (int i = 0; i < S.strategies.len && i < PLAN_SIMULATE; i++) try_strategy(&S, S.strategies.data[i]);
  if (S.cands.len > 1) qsort(S.cands.data, (size_t)S.cands.len, sizeof(PlanCand), cand_cmp);
  out->cands = S.cands.data, out->ncands = S.cands.len;
  out->seconds = now() - S.t0;
}
