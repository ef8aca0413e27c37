/* target.c: hardware targets from `target NAME { key = value ... }` blocks.
 *
 * In: the N_TARGET declarations of a program (stdlib/targets.shard declares the eight named by
 * language.md; users may add their own). Out: Program.targets, one Target each, figures in bytes,
 * bytes/s, FLOP/s and seconds. The keys are the table TARGET_KEYS below; `base = other` copies
 * another target's figures first, so a block need only say what differs. Unknown keys, values of
 * the wrong kind or range, keys of the other kind of target and missing required keys are located
 * errors. docs/targets.md documents each key and where the stdlib's figures come from. */
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "sema_int.h"
#include "suggest.h"

/* How a key's value is read. */
typedef enum {
  TV_KIND,   /* tpu | gpu */
  TV_BASE,   /* another target's name */
  TV_FLOPS,  /* { DTYPE = FLOP/s ... } */
  TV_NUM,    /* a number, checked by range */
  TV_INT,    /* a whole number >= 1 */
  TV_TORUS,  /* [n, n] or [n, n, n] */
  TV_COLL,   /* { max = fraction  half_bytes = bytes }: two adjacent doubles at the offset */
  TV_VEC3,   /* [a, b, c]: three numbers in the key's range (R_COUNT: whole numbers >= 1) */
  TV_ATTN,   /* flash | materialized: how the fused attention op runs (Target.attention_materialized) */
} TargetValue;

/* TV_NUM's ranges. Times are amounts divided by rates and fractions (bytes / bandwidth, FLOPs /
 * (peak x efficiency)) plus latencies, so a figure that could make a time infinite or meaningless
 * (a bandwidth of 1e-300, an efficiency of 1e-300, a latency of 1e300) is an error where it is
 * written, not an inf in a report. The bounds are far beyond any hardware. */
typedef enum {
  R_ANY,
  R_RATE,     /* bytes/s or FLOP/s: [RATE_MIN, RATE_MAX] */
  R_BYTES,    /* a capacity in bytes: [1, RATE_MAX] */
  R_LATENCY,  /* seconds: [0, LATENCY_MAX] */
  R_FRAC,     /* a fraction of peak: [FRAC_MIN, 1] */
  R_HALF,     /* bytes: [0, HALF_MAX] */
  R_NONNEG,   /* a non-negative figure: [0, RATE_MAX] */
  R_RATIO,    /* a ratio of at least 1: [1, RATIO_MAX] */
  R_COUNT,    /* TV_VEC3: whole numbers >= 1 */
  R_EFF2,     /* TV_COLL: its `max` may reach 2 (an AllReduce reduced in the switch, NVLS) */
  R_SHAPE,    /* a curve's exponent: [0.1, 4] */
} Range;
#define RATIO_MAX 1e6
#define RATE_MIN 1.0
#define RATE_MAX 1e25
#define LATENCY_MAX 1e3
#define FRAC_MIN 1e-3
#define HALF_MAX 1e15
enum { FOR_TPU = 1, FOR_GPU = 2, FOR_ANY = 3 };

/* X(enum, key, how read, range, which targets, required, offset of the field). Order: printing
 * order of "valid keys" lists. */
#define TARGET_KEYS(X)                                                                          \
  X(TKEY_KIND, "kind", TV_KIND, R_ANY, FOR_ANY, 1, 0)                                            \
  X(TKEY_BASE, "base", TV_BASE, R_ANY, FOR_ANY, 0, 0)                                            \
  X(TKEY_FLOPS, "flops", TV_FLOPS, R_RATE, FOR_ANY, 1, 0)                                        \
  X(TKEY_HBM, "hbm", TV_NUM, R_BYTES, FOR_ANY, 1, offsetof(Target, hbm))                         \
  X(TKEY_HBM_BW, "hbm_bw", TV_NUM, R_RATE, FOR_ANY, 1, offsetof(Target, hbm_bw))                 \
  X(TKEY_MATMUL_EFF, "matmul_efficiency", TV_NUM, R_FRAC, FOR_ANY, 0, offsetof(Target, matmul_efficiency)) \
  X(TKEY_ICI_BW, "ici_bw", TV_NUM, R_RATE, FOR_TPU, 1, offsetof(Target, ici_bw))                 \
  X(TKEY_TORUS, "torus", TV_TORUS, R_ANY, FOR_TPU, 1, 0)                                         \
  X(TKEY_WRAP, "wrap_multiple", TV_INT, R_ANY, FOR_TPU, 1, offsetof(Target, wrap_multiple))     \
  X(TKEY_HOP_LAT, "hop_latency", TV_NUM, R_LATENCY, FOR_TPU, 1, offsetof(Target, hop_latency))   \
  X(TKEY_DCN_BW, "dcn_bw", TV_NUM, R_RATE, FOR_TPU, 1, offsetof(Target, dcn_bw))                 \
  X(TKEY_NVLINK_BW, "nvlink_bw", TV_NUM, R_RATE, FOR_GPU, 1, offsetof(Target, nvlink_bw))        \
  X(TKEY_NODE_SIZE, "node_size", TV_INT, R_ANY, FOR_GPU, 1, offsetof(Target, node_size))         \
  X(TKEY_NETWORK_BW, "network_bw", TV_NUM, R_RATE, FOR_GPU, 1, offsetof(Target, network_bw))     \
  X(TKEY_NVLINK_LAT, "nvlink_latency", TV_NUM, R_LATENCY, FOR_GPU, 1, offsetof(Target, nvlink_latency)) \
  X(TKEY_NETWORK_LAT, "network_latency", TV_NUM, R_LATENCY, FOR_GPU, 1, offsetof(Target, network_latency)) \
  X(TKEY_COLL_EFF, "collective_efficiency", TV_COLL, R_ANY, FOR_ANY, 0, offsetof(Target, coll_eff_max)) \
  X(TKEY_NET_EFF, "network_efficiency", TV_COLL, R_ANY, FOR_ANY, 0, offsetof(Target, net_eff_max)) \
  X(TKEY_AR_EFF, "all_reduce_efficiency", TV_COLL, R_EFF2, FOR_ANY, 0, offsetof(Target, ar_eff_max)) \
  X(TKEY_MM_TILE, "matmul_tile", TV_VEC3, R_COUNT, FOR_ANY, 0, offsetof(Target, matmul_tile))    \
  X(TKEY_MM_FILL, "matmul_fill", TV_VEC3, R_NONNEG, FOR_ANY, 0, offsetof(Target, matmul_fill))   \
  X(TKEY_MM_UNITS, "matmul_units", TV_INT, R_ANY, FOR_ANY, 0, offsetof(Target, matmul_units))    \
  X(TKEY_HBM_EFF, "hbm_efficiency", TV_NUM, R_FRAC, FOR_ANY, 0, offsetof(Target, hbm_efficiency)) \
  X(TKEY_ATTN_EFF, "attention_efficiency", TV_NUM, R_FRAC, FOR_ANY, 0, offsetof(Target, attention_efficiency)) \
  X(TKEY_OP_OVERHEAD, "op_overhead", TV_NUM, R_LATENCY, FOR_ANY, 0, offsetof(Target, op_overhead)) \
  X(TKEY_ATTENTION, "attention", TV_ATTN, R_ANY, FOR_ANY, 0, offsetof(Target, attention_materialized)) \
  X(TKEY_COLL_SMS, "collective_sms", TV_INT, R_ANY, FOR_GPU, 0, offsetof(Target, collective_sms)) \
  X(TKEY_FABRIC_DOMAIN, "fabric_domain", TV_INT, R_ANY, FOR_GPU, 0, offsetof(Target, fabric_domain)) \
  X(TKEY_FABRIC_OVERSUB, "fabric_oversubscription", TV_NUM, R_RATIO, FOR_GPU, 0, offsetof(Target, fabric_oversubscription))

typedef enum {
#define X(e, k, v, r, f, req, off) e,
  TARGET_KEYS(X)
#undef X
  TKEY__COUNT
} TargetKey;

static const struct {
  const char *name;
  TargetValue value;
  Range range;
  int applies;
  bool required;
  size_t offset;
} target_keys[] = {
#define X(e, k, v, r, f, req, off) {k, v, r, f, req, off},
  TARGET_KEYS(X)
#undef X
};

/* Largest torus extent and slice we accept (far beyond any real machine; keeps products in int). */
enum { TORUS_MAX_EXTENT = 1 << 16, NODE_MAX = 1 << 20 };

typedef struct TargetState {
  const Node *decl;
  Target *t;
  uint32_t set;      /* keys this target has, written or inherited (bit per TargetKey) */
  uint32_t written;  /* keys written in its own block */
  int state;         /* 0 not yet, 1 being resolved (a `base` chain), 2 done */
  bool broken_base;  /* its base is unknown, circular or broken: what is missing is not reported */
} TargetState;

typedef struct TargetBuild {
  Program *p;
  TargetState *ts;
  int n;
} TargetBuild;

static int target_index(const TargetBuild *tb, Name name) {
  for (int i = 0; i < tb->n; i++)
    if (tb->ts[i].t && tb->ts[i].t->name == name) return i;
  return -1;
}

static const char *target_valid_keys(Arena *a) {
  Name names[TKEY__COUNT];
  for (int k = 0; k < TKEY__COUNT; k++) names[k] = target_keys[k].name;
  return sema_join_names(a, names, TKEY__COUNT, TKEY__COUNT);
}

static const char *kind_name(int applies) { return applies == FOR_TPU ? "tpu" : "gpu"; }

/* A number for key `key`, in the key's range. Reports and returns false otherwise. */
static bool read_number(const Node *v, const char *key, Range range, double *out) {
  bool is_int;
  int64_t iv;
  if (!sema_kv_number(v, out, &is_int, &iv)) {
    diag_error(v->loc, "'%s' takes a number", key);
    return false;
  }
  if (!isfinite(*out)) {
    diag_error(v->loc, "'%s' must be finite", key);
    return false;
  }
  switch (range) {
  case R_RATE:
    if (*out < RATE_MIN || *out > RATE_MAX)
      return diag_error(v->loc, "'%s' is a rate times are divided by: it must be from %g to %g per second (found %g)",
                        key, RATE_MIN, RATE_MAX, *out), false;
    break;
  case R_BYTES:
    if (*out < 1 || *out > RATE_MAX)
      return diag_error(v->loc, "'%s' is a capacity in bytes: from 1 to %g (found %g)", key, RATE_MAX, *out), false;
    break;
  case R_LATENCY:
    if (*out < 0 || *out > LATENCY_MAX)
      return diag_error(v->loc, "'%s' is a latency in seconds: from 0 to %g (found %g)", key, LATENCY_MAX, *out), false;
    break;
  case R_EFF2:
    if (*out < FRAC_MIN || *out > 2)
      return diag_error(v->loc, "'%s' is a ratio of bus bandwidth to the link's one-way rate: from %g to 2 (found %g)",
                        key, FRAC_MIN, *out), false;
    break;
  case R_SHAPE:
    if (*out < 0.1 || *out > 4)
      return diag_error(v->loc, "'%s' is a curve's exponent: from 0.1 to 4 (found %g)", key, *out), false;
    break;
  case R_FRAC:
    if (*out < FRAC_MIN || *out > 1)
      return diag_error(v->loc, "'%s' is a fraction of peak that times are divided by: from %g to 1 (found %g)", key,
                        FRAC_MIN, *out), false;
    break;
  case R_HALF:
    if (*out < 0 || *out > HALF_MAX)
      return diag_error(v->loc, "'%s' is a message size in bytes: from 0 to %g (found %g)", key, HALF_MAX, *out), false;
    break;
  case R_NONNEG:
    if (*out < 0 || *out > RATE_MAX)
      return diag_error(v->loc, "'%s' must be from 0 to %g (found %g)", key, RATE_MAX, *out), false;
    break;
  case R_RATIO:
    if (*out < 1 || *out > RATIO_MAX)
      return diag_error(v->loc, "'%s' is a ratio: from 1 to %g (found %g)", key, RATIO_MAX, *out), false;
    break;
  case R_COUNT:
  case R_ANY:
    break;
  }
  return true;
}

/* A whole number from 1 to max. */
static bool read_count(const Node *v, const char *key, int max, int *out) {
  double d;
  bool is_int;
  int64_t iv;
  if (!sema_kv_number(v, &d, &is_int, &iv)) {
    diag_error(v->loc, "'%s' takes a whole number", key);
    return false;
  }
  if (!is_int) {
    if (d != floor(d) || fabs(d) > (double)INT64_MAX / 2) {
      diag_error(v->loc, "'%s' takes a whole number (found %g)", key, d);
      return false;
    }
    iv = (int64_t)d;
  }
  if (iv < 1 || iv > max) {
    diag_error(v->loc, "'%s' must be from 1 to %d (found %lld)", key, max, (long long)iv);
    return false;
  }
  *out = (int)iv;
  return true;
}

/* flops = { bf16 = 1.97e14  f32 = ... }: entries replace the inherited ones one dtype at a time. */
static void read_flops(const Node *v, Target *t) {
  if (v->kind != N_BLOCK) {
    diag_error(v->loc, "'flops' takes a block of dtype = FLOP/s entries, as in { bf16 = 1.97e14 }");
    return;
  }
  bool seen[DT__COUNT] = {0};
  SrcLoc first[DT__COUNT];
  for (const Node *kv = v->kvs; kv; kv = kv->next) {
    if (kv->kind != N_KV || !kv->name || !kv->value) continue;
    DType dt = dtype_rate(dtype_from_name(kv->name)); /* f8, f8e4m3, f8e5m2: the one FP8 rate */
    if (dt == DT_NONE) {
      Suggest sg = suggest_begin(kv->name);
      for (int d = 0; d < DT__COUNT; d++) suggest_try(&sg, dtype_name((DType)d));
      char sb[160];
      diag_error(sema_name_loc(kv), "unknown dtype '%s' in 'flops'%s (dtypes: f32 bf16 f16 f8e4m3 f8e5m2 i32 i8)", kv->name,
                 suggest_text(&sg, sb, sizeof sb));
      continue;
    }
    if (seen[dt]) {
      sema_duplicate("flops key", kv->name, sema_name_loc(kv), first[dt]);
      continue;
    }
    seen[dt] = true;
    first[dt] = sema_name_loc(kv);
    double f;
    char key[32];
    snprintf(key, sizeof key, "flops.%s", dtype_name(dt));
    if (read_number(kv->value, key, R_RATE, &f)) t->flops[dt] = f;
  }
}

/* torus = [16, 16] or [16, 20, 28]: the largest slice, per torus dim. */
static bool read_torus(const Node *v, Target *t) {
  if (v->kind != N_LIST) {
    diag_error(v->loc, "'torus' takes a list of 1 to %d extents, as in [16, 16]", MAX_TORUS_DIMS);
    return false;
  }
  int n = 0, ext[MAX_TORUS_DIMS];
  int64_t product = 1;
  for (const Node *e = v->items; e; e = e->next) {
    if (n == MAX_TORUS_DIMS) {
      diag_error(e->loc, "'torus' has at most %d dims", MAX_TORUS_DIMS);
      return false;
    }
    if (!read_count(e, "torus", TORUS_MAX_EXTENT, &ext[n])) return false;
    product *= ext[n++];
    if (product > INT_MAX) {
      diag_error(v->loc, "'torus' holds more than %d chips", INT_MAX);
      return false;
    }
  }
  if (n == 0) {
    diag_error(v->loc, "'torus' needs at least one extent");
    return false;
  }
  memcpy(t->torus, ext, sizeof ext);
  for (int i = n; i < MAX_TORUS_DIMS; i++) t->torus[i] = 1;
  t->ntorus = n;
  return true;
}

/* collective_efficiency = { max = 0.815  half_bytes = 8.4e7  small = 0.25  shape = 1 } (and
 * network_efficiency, all_reduce_efficiency, the same form): achieved/peak =
 * max(small, max * V^shape / (V^shape + half^shape)), written to pair[0] (max), pair[1] (half),
 * pair[2] (small) and pair[3] (shape). `max` is a fraction of 1, or of 2 with R_EFF2. */
static bool read_coll(const Node *v, const char *key, Range range, double *pair) {
  if (v->kind != N_BLOCK) {
    diag_error(v->loc, "'%s' takes a block: { max = 0.95  half_bytes = 2e5 }", key);
    return false;
  }
  bool ok = true;
  for (const Node *kv = v->kvs; kv; kv = kv->next) {
    if (kv->kind != N_KV || !kv->name || !kv->value) continue;
    double d;
    if (strcmp(kv->name, "max") == 0) {
      if (read_number(kv->value, "max", range == R_EFF2 ? R_EFF2 : R_FRAC, &d)) pair[0] = d;
      else ok = false;
    } else if (strcmp(kv->name, "half_bytes") == 0) {
      if (read_number(kv->value, "half_bytes", R_HALF, &d)) pair[1] = d;
      else ok = false;
    } else if (strcmp(kv->name, "small") == 0) {
      if (read_number(kv->value, "small", R_FRAC, &d)) pair[2] = d;
      else ok = false;
    } else if (strcmp(kv->name, "shape") == 0) {
      if (read_number(kv->value, "shape", R_SHAPE, &d)) pair[3] = d;
      else ok = false;
    } else {
      diag_error(sema_name_loc(kv), "unknown key '%s' in '%s' (valid keys: max, half_bytes, small, shape)", kv->name,
                 key);
      ok = false;
    }
  }
  return ok;
}

/* matmul_tile = [8, 128, 128], matmul_fill = [128, 0, 0]: exactly three numbers, M N K, in the
 * key's range (R_COUNT: whole numbers >= 1). */
static bool read_vec3(const Node *v, const char *key, Range range, double *out) {
  if (v->kind != N_LIST) {
    diag_error(v->loc, "'%s' takes a list of three numbers (M, N, K), as in [128, 128, 64]", key);
    return false;
  }
  double d[3];
  int n = 0;
  for (const Node *e = v->items; e; e = e->next) {
    if (n == 3) {
      diag_error(e->loc, "'%s' takes three numbers (M, N, K)", key);
      return false;
    }
    if (range == R_COUNT) {
      int c;
      if (!read_count(e, key, NODE_MAX, &c)) return false;
      d[n++] = c;
    } else if (!read_number(e, key, range, &d[n++])) {
      return false;
    }
  }
  if (n != 3) {
    diag_error(v->loc, "'%s' takes three numbers (M, N, K); found %d", key, n);
    return false;
  }
  memcpy(out, d, sizeof d);
  return true;
}

static int target_resolve(TargetBuild *tb, int i, int depth);

/* base = other: copy the other target's figures (resolving it first). */
static void target_apply_base(TargetBuild *tb, TargetState *st, const Node *kv, int depth) {
  Name bname = sema_kv_word(kv->value);
  st->broken_base = true;
  if (!bname || kv->value->kind == N_NUM) {
    diag_error(kv->value->loc, "'base' takes the name of another target");
    return;
  }
  int b = target_index(tb, bname);
  if (b < 0) {
    Suggest sg = suggest_begin(bname);
    for (int i = 0; i < tb->n; i++) suggest_try(&sg, tb->ts[i].t->name);
    char sb[160];
    diag_error(kv->value->loc, "unknown target '%s' as base%s", bname, suggest_text(&sg, sb, sizeof sb));
    return;
  }
  if (tb->ts[b].state == 1) {
    diag_error(kv->value->loc, "target '%s' is based on itself (through 'base = %s')", st->t->name, bname);
    return;
  }
  if (target_resolve(tb, b, depth + 1) != 2 || tb->ts[b].broken_base) return;
  st->broken_base = false;
  Name name = st->t->name;
  SrcLoc loc = st->t->loc;
  *st->t = *tb->ts[b].t;
  st->t->name = name;
  st->t->loc = loc;
  st->set = tb->ts[b].set & ~(1u << TKEY_BASE);
}

/* Reads one target's block after its base. Returns its state (2 once done, even with errors). */
static int target_resolve(TargetBuild *tb, int i, int depth) {
  TargetState *st = &tb->ts[i];
  if (st->state != 0) return st->state;
  st->state = 1;
  Target *t = st->t;
  t->matmul_efficiency = 1;
  t->coll_eff_max = 1;
  t->coll_eff_half_bytes = 0;
  t->wrap_multiple = 0;
  /* Calibrated-simulation keys: absent means no such effect (peak). */
  for (int d = 0; d < 3; d++) t->matmul_tile[d] = 1, t->matmul_fill[d] = 0;
  t->hbm_efficiency = 1;
  t->fabric_oversubscription = 1;

  const Node *first[TKEY__COUNT] = {0};
  /* `base` first, wherever it is written, so that the block's own keys override it. */
  for (const Node *kv = st->decl->kvs; kv; kv = kv->next)
    if (kv->kind == N_KV && kv->name && kv->value && strcmp(kv->name, "base") == 0 && !first[TKEY_BASE]) {
      first[TKEY_BASE] = kv;
      if (depth > 64) diag_error(kv->value->loc, "'base' chain is too long (more than 64 targets)");
      else target_apply_base(tb, st, kv, depth);
    }

  for (const Node *kv = st->decl->kvs; kv; kv = kv->next) {
    if (kv->kind != N_KV || !kv->name || !kv->value) continue;
    int k = 0;
    while (k < TKEY__COUNT && strcmp(target_keys[k].name, kv->name) != 0) k++;
    if (k == TKEY__COUNT) {
      Suggest sg = suggest_begin(kv->name);
      for (int j = 0; j < TKEY__COUNT; j++) suggest_try(&sg, target_keys[j].name);
      char sb[160];
      diag_error(sema_name_loc(kv), "unknown target key '%s'%s (valid keys: %s)", kv->name,
                 suggest_text(&sg, sb, sizeof sb), target_valid_keys(tb->p->arena));
      continue;
    }
    if (k == TKEY_BASE) {
      if (first[k] != kv) sema_duplicate("target key", kv->name, sema_name_loc(kv), sema_name_loc(first[k]));
      continue;
    }
    if (first[k]) {
      sema_duplicate("target key", kv->name, sema_name_loc(kv), sema_name_loc(first[k]));
      continue;
    }
    first[k] = kv;
    const Node *v = kv->value;
    bool ok = true;
    switch (target_keys[k].value) {
    case TV_KIND: {
      Name w = sema_kv_word(v);
      if (w && v->kind != N_NUM && strcmp(w, "tpu") == 0) t->kind = TARGET_TPU;
      else if (w && v->kind != N_NUM && strcmp(w, "gpu") == 0) t->kind = TARGET_GPU;
      else diag_error(v->loc, "'kind' must be tpu or gpu"), ok = false;
      break;
    }
    case TV_ATTN: {
      Name w = sema_kv_word(v);
      bool flash = w && v->kind != N_NUM && strcmp(w, "flash") == 0;
      if (flash || (w && v->kind != N_NUM && strcmp(w, "materialized") == 0)) t->attention_materialized = !flash;
      else diag_error(v->loc, "'attention' must be flash or materialized"), ok = false;
      break;
    }
    case TV_BASE:
      break;
    case TV_FLOPS:
      read_flops(v, t);
      break;
    case TV_NUM: {
      double d;
      if ((ok = read_number(v, kv->name, target_keys[k].range, &d)))
        *(double *)((char *)t + target_keys[k].offset) = d;
      break;
    }
    case TV_INT: {
      int c;
      if ((ok = read_count(v, kv->name, NODE_MAX, &c))) *(int *)((char *)t + target_keys[k].offset) = c;
      break;
    }
    case TV_TORUS:
      ok = read_torus(v, t);
      break;
    case TV_COLL:
      ok = read_coll(v, kv->name, target_keys[k].range, (double *)((char *)t + target_keys[k].offset));
      break;
    case TV_VEC3:
      ok = read_vec3(v, kv->name, target_keys[k].range, (double *)((char *)t + target_keys[k].offset));
      break;
    }
    /* A key with a bad value counts as written: "missing" on top of "bad" would say it twice. */
    (void)ok;
    st->set |= 1u << k;
    st->written |= 1u << k;
  }

  /* What the kind asks for: its keys present, the other kind's keys absent. */
  SrcLoc here = t->loc;
  if (st->broken_base) {
    /* reported at the `base` line */
  } else if (!(st->set & (1u << TKEY_KIND))) {
    diag_error(here, "target '%s' needs 'kind = tpu' or 'kind = gpu'", t->name);
  } else {
    int kind = t->kind == TARGET_TPU ? FOR_TPU : FOR_GPU;
    for (int k = 0; k < TKEY__COUNT; k++) {
      if (!(target_keys[k].applies & kind)) {
        if (st->written & (1u << k))
          diag_error(sema_name_loc(first[k]), "'%s' applies to %s targets; '%s' is a %s target", target_keys[k].name,
                     kind_name(target_keys[k].applies), t->name, kind_name(kind));
        continue;
      }
      if (target_keys[k].required && !(st->set & (1u << k)))
        diag_error(here, "target '%s' is missing '%s'", t->name, target_keys[k].name);
    }
    if ((st->set & (1u << TKEY_FLOPS)) && t->flops[DT_BF16] <= 0)
      diag_error(first[TKEY_FLOPS] ? first[TKEY_FLOPS]->value->loc : here, "target '%s' is missing flops.bf16 (the dense bf16 peak)",
                 t->name);
    /* Drop figures inherited from a base of the other kind. */
    if (kind == FOR_GPU) {
      t->ici_bw = t->hop_latency = t->dcn_bw = 0;
      t->ntorus = 0;
      t->wrap_multiple = 0;
    } else {
      t->nvlink_bw = t->network_bw = t->nvlink_latency = t->network_latency = 0;
      t->node_size = 0;
      t->fabric_domain = 0;
      t->fabric_oversubscription = 1;
    }
  }
  st->state = 2;
  return 2;
}

void target_build_all(Program *p, const Node *const *decls, int n) {
  TargetBuild tb = {p, ARENA_ARRAY(p->arena, TargetState, n > 0 ? n : 1), 0};
  for (int i = 0; i < n; i++) {
    const Node *d = decls[i];
    if (!d->name) continue;
    int prev = target_index(&tb, d->name);
    if (prev >= 0) {
      sema_duplicate("target", d->name, sema_name_loc(d), tb.ts[prev].t->loc);
      continue;
    }
    Target *t = ARENA_NEW(p->arena, Target);
    t->name = d->name;
    t->loc = sema_name_loc(d);
    tb.ts[tb.n++] = (TargetState){.decl = d, .t = t};
  }
  for (int i = 0; i < tb.n; i++) target_resolve(&tb, i, 0);
  p->targets = ARENA_ARRAY(p->arena, Target *, tb.n > 0 ? tb.n : 1);
  for (int i = 0; i < tb.n; i++) p->targets[i] = tb.ts[i].t;
  p->ntargets = tb.n;
}
