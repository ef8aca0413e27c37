/* gemm_dnnl.c: contractions through oneDNN's matmul primitive (Debian's libdnnl 2.6), the engine
 * gemm.c's rule picks where it beats OpenBLAS (docs/runtime.md, "GEMM engines").
 *
 * - One primitive per shape: a product's dtypes, transposes, sizes, leading dims, batch strides,
 *   alpha and beta make its key; the runtime's cache (a hash table behind one mutex, shared by its
 *   devices) creates the primitive the first time a key is seen and hands the same one to every
 *   later call, from any device thread. oneDNN primitives may execute concurrently; each device
 *   passes its own stream and its own scratchpad (user-managed scratchpads: the primitive itself
 *   holds no per-call state).
 * - Threads: Debian builds oneDNN on OpenMP (libgomp). A device thread runs its products on one
 *   thread (rtdnnl_device_begin sets the thread's OpenMP team size to 1 and checks it), so that N
 *   device threads never start N OpenMP teams that fight for the cores; primitives are created on
 *   device threads, so oneDNN sizes their blocking for one thread.
 * - The CPU: oneDNN's own ISA query (dnnl_get_effective_cpu_isa, which honours ONEDNN_MAX_CPU_ISA)
 *   says whether bf16 products run natively (AVX512-BF16 or AMX) or are emulated; cpuid says what
 *   the CPU has, for reports. Nothing is assumed from the build machine. */
#include <oneapi/dnnl/dnnl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rt_internal.h"

#if DNNL_CPU_THREADING_RUNTIME == DNNL_RUNTIME_OMP
/* libgomp's (the OpenMP runtime Debian's libdnnl links); declared here so that no compiler's
 * omp.h is needed */
int omp_get_max_threads(void);
void omp_set_num_threads(int n);
#endif

/* ---- the CPU ---- */

static void cpuid(unsigned leaf, unsigned sub, unsigned r[4]) {
#if defined(__x86_64__) || defined(__i386__)
  __asm__ volatile("cpuid" : "=a"(r[0]), "=b"(r[1]), "=c"(r[2]), "=d"(r[3]) : "a"(leaf), "c"(sub));
#else
  r[0] = r[1] = r[2] = r[3] = 0;
#endif
}

static unsigned cpu_features(void) {
  unsigned r[4], f = 0;
  cpuid(0, 0, r);
  unsigned max = r[0];
  if (max >= 7) {
    cpuid(7, 0, r);
    if (r[1] >> 16 & 1) f |= RT_CPU_AVX512F;
    if (r[3] >> 22 & 1) f |= RT_CPU_AMX_BF16;
    if (r[3] >> 23 & 1) f |= RT_CPU_AVX512_FP16;
    if (r[3] >> 24 & 1) f |= RT_CPU_AMX_TILE;
    unsigned sub = r[0];
    if (sub >= 1) {
      cpuid(7, 1, r);
      if (r[0] >> 5 & 1) f |= RT_CPU_AVX512_BF16;
    }
  }
  return f;
}

static const char *isa_name(dnnl_cpu_isa_t isa) {
  switch ((int)isa) {
  case dnnl_cpu_isa_sse41: return "sse41";
  case dnnl_cpu_isa_avx: return "avx";
  case dnnl_cpu_isa_avx2: return "avx2";
  case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
  case dnnl_cpu_isa_avx512_core: return "avx512_core";
  case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
  case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
  case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
  default: return "other";
  }
}

/* Once per process: the CPU does not change under a run. */
static pthread_once_t cpu_once = PTHREAD_ONCE_INIT;
static RtCpu cpu_info;

static void cpu_detect(void) {
  cpu_info.features = cpu_features();
  dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
  cpu_info.dnnl_isa = isa_name(isa);
  /* ISA values are masks of the features they include: avx512_core_bf16 (0xe7) is in amx's */
  cpu_info.bf16_native = ((unsigned)isa & (unsigned)dnnl_cpu_isa_avx512_core_bf16) == (unsigned)dnnl_cpu_isa_avx512_core_bf16;
  cpu_info.amx = ((unsigned)isa & (unsigned)dnnl_cpu_isa_avx512_core_amx) == (unsigned)dnnl_cpu_isa_avx512_core_amx;
  const dnnl_version_t *v = dnnl_version();
  snprintf(cpu_info.dnnl_version, sizeof cpu_info.dnnl_version, "%d.%d.%d", v->major, v->minor, v->patch);
}

const RtCpu *rt_cpu(void) {
  pthread_once(&cpu_once, cpu_detect);
  return &cpu_info;
}

/* ---- threads ---- */

int rtdnnl_device_begin(RtDevice *dev) {
#if DNNL_CPU_THREADING_RUNTIME == DNNL_RUNTIME_OMP
  dev->omp_saved = omp_get_max_threads();
  omp_set_num_threads(1);
  if (omp_get_max_threads() != 1)
    return rtrun_fail(dev, RT_E_SYS, "OpenMP did not accept one thread per device (it reports %d): oneDNN's products would oversubscribe the cores",
                      omp_get_max_threads());
#else
  (void)dev;
#endif
  return RT_OK;
}

void rtdnnl_device_end(RtDevice *dev) {
#if DNNL_CPU_THREADING_RUNTIME == DNNL_RUNTIME_OMP
  if (dev->omp_saved > 0) omp_set_num_threads(dev->omp_saved);
#endif
  (void)dev;
}

int rt_gemm_threads(void) {
#if DNNL_CPU_THREADING_RUNTIME == DNNL_RUNTIME_OMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

/* ---- the cache of primitives ---- */

typedef struct Key {
  int32_t a_type, b_type, c_type, ta, tb, pad;
  int64_t m, n, k, batch, lda, ldb, ldc, sa, sb, sc;
  uint32_t alpha, beta;
} Key;

typedef struct Entry {
  bool used;
  uint64_t hash;
  Key key;
  dnnl_primitive_t prim; /* NULL: oneDNN has no implementation for this key (remembered) */
  size_t scratch;        /* bytes of its scratchpad */
  dnnl_memory_desc_t md[4]; /* src, weights, dst, scratchpad */
  char impl[48];
} Entry;

typedef struct RtDnnl {
  pthread_mutex_t lock;
  dnnl_engine_t engine;
  dnnl_status_t engine_status; /* of its creation: the engine is made at the first product */
  Entry *tab;
  size_t cap, used;
  uint64_t created, hits, unimplemented;
} RtDnnl;

/* Per device: its stream and scratchpad (its own thread only). */
typedef struct RtDnnlDev {
  dnnl_stream_t stream;
  void *scratch;
  size_t scratch_bytes;
} RtDnnlDev;

static uint64_t key_hash(const Key *k) {
  const unsigned char *p = (const unsigned char *)k;
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < sizeof *k; i++) h = (h ^ p[i]) * 1099511628211ull;
  return h ? h : 1;
}

static uint32_t bits(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u;
}

static dnnl_data_type_t dnnl_type(RtDtype t) {
  return t == RT_BF16 ? dnnl_bf16 : t == RT_F16 ? dnnl_f16 : dnnl_f32;
}

/* oneDNN reports its generated kernels to VTune by default, which dlopens VTune's collector
 * (libJitPI.so) at the first kernel: a library load in the middle of a run, for a profiler shardc
 * does not use (and one ThreadSanitizer's library suppressions trip over). Off unless the user asks
 * for it with oneDNN's own ONEDNN_JIT_PROFILE / DNNL_JIT_PROFILE. */
static pthread_once_t profiling_once = PTHREAD_ONCE_INIT;
static void profiling_off(void) {
  if (!getenv("ONEDNN_JIT_PROFILE") && !getenv("DNNL_JIT_PROFILE")) dnnl_set_jit_profiling_flags(0);
}

int rtdnnl_open(Runtime *rt) {
  pthread_once(&profiling_once, profiling_off);
  RtDnnl *d = calloc(1, sizeof *d);
  if (!d) return RT_E_NOMEM;
  pthread_mutex_init(&d->lock, NULL);
  rt->dnnl = d;
  return RT_OK;
}

void rtdnnl_close(Runtime *rt) {
  RtDnnl *d = rt->dnnl;
  if (!d) return;
  for (int i = 0; i < rt->ndev && rt->devices; i++) {
    RtDnnlDev *dd = rt->devices[i].dnnl;
    if (!dd) continue;
    if (dd->stream) dnnl_stream_destroy(dd->stream);
    free(dd->scratch);
    free(dd);
    rt->devices[i].dnnl = NULL;
  }
  for (size_t i = 0; i < d->cap; i++)
    if (d->tab[i].used && d->tab[i].prim) dnnl_primitive_destroy(d->tab[i].prim);
  free(d->tab);
  if (d->engine) dnnl_engine_destroy(d->engine);
  pthread_mutex_destroy(&d->lock);
  free(d);
  rt->dnnl = NULL;
}

void rtdnnl_counts(const Runtime *rt, uint64_t *created, uint64_t *hits) {
  RtDnnl *d = rt->dnnl;
  pthread_mutex_lock(&d->lock);
  *created = d->created;
  *hits = d->hits;
  pthread_mutex_unlock(&d->lock);
}

static Entry *find(RtDnnl *d, const Key *k, uint64_t h) {
  if (!d->cap) return NULL;
  for (size_t i = h & (d->cap - 1);; i = (i + 1) & (d->cap - 1)) {
    Entry *e = &d->tab[i];
    if (!e->used) return e;
    if (e->hash == h && memcmp(&e->key, k, sizeof *k) == 0) return e;
  }
}

static bool grow(RtDnnl *d) {
  size_t cap = d->cap ? d->cap * 2 : 64;
  Entry *old = d->tab, *tab = calloc(cap, sizeof *tab);
  if (!tab) return false;
  size_t oc = d->cap;
  d->tab = tab, d->cap = cap;
  for (size_t i = 0; i < oc; i++)
    if (old[i].used) *find(d, &old[i].key, old[i].hash) = old[i];
  free(old);
  return true;
}

/* The three matrices as oneDNN memory descriptors: [batch, rows, cols] with the caller's strides
 * (a transposed operand is the same memory read with its two strides swapped); an operand shared
 * across the batch (stride 0) has batch 1, which oneDNN broadcasts. */
static dnnl_status_t describe(const Key *k, dnnl_memory_desc_t md[3]) {
  dnnl_dims_t ad = {k->batch > 1 && k->sa == 0 ? 1 : k->batch, k->m, k->k};
  dnnl_dims_t as = {k->sa ? k->sa : k->m * k->k, k->ta ? 1 : k->lda, k->ta ? k->lda : 1};
  dnnl_dims_t bd = {k->batch > 1 && k->sb == 0 ? 1 : k->batch, k->k, k->n};
  dnnl_dims_t bs = {k->sb ? k->sb : k->k * k->n, k->tb ? 1 : k->ldb, k->tb ? k->ldb : 1};
  dnnl_dims_t cd = {k->batch, k->m, k->n}, cs = {k->sc ? k->sc : k->m * k->n, k->ldc, 1};
  dnnl_status_t s = dnnl_memory_desc_init_by_strides(&md[0], 3, ad, dnnl_type((RtDtype)k->a_type), as);
  if (s == dnnl_success) s = dnnl_memory_desc_init_by_strides(&md[1], 3, bd, dnnl_type((RtDtype)k->b_type), bs);
  if (s == dnnl_success) s = dnnl_memory_desc_init_by_strides(&md[2], 3, cd, dnnl_type((RtDtype)k->c_type), cs);
  return s;
}

/* Makes e's primitive (d's lock held). Leaves e->prim NULL when oneDNN has no implementation. */
static void create(RtDnnl *d, Entry *e, bool trace) {
  dnnl_matmul_desc_t desc;
  dnnl_primitive_attr_t attr = NULL;
  dnnl_post_ops_t po = NULL;
  dnnl_primitive_desc_t pd = NULL;
  dnnl_status_t s = describe(&e->key, e->md);
  if (s == dnnl_success) s = dnnl_matmul_desc_init(&desc, &e->md[0], &e->md[1], NULL, &e->md[2]);
  if (s == dnnl_success) s = dnnl_primitive_attr_create(&attr);
  if (s == dnnl_success) s = dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
  float alpha, beta;
  memcpy(&alpha, &e->key.alpha, sizeof alpha);
  memcpy(&beta, &e->key.beta, sizeof beta);
  if (s == dnnl_success && alpha != 1.0f) s = dnnl_primitive_attr_set_output_scales(attr, 1, 0, &alpha);
  if (s == dnnl_success && beta != 0.0f) {
    s = dnnl_post_ops_create(&po);
    if (s == dnnl_success) s = dnnl_post_ops_append_sum(po, beta);
    if (s == dnnl_success) s = dnnl_primitive_attr_set_post_ops(attr, po);
  }
  if (s == dnnl_success) s = dnnl_primitive_desc_create(&pd, &desc, attr, d->engine, NULL);
  if (s == dnnl_success) {
    const char *impl = NULL;
    dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
    snprintf(e->impl, sizeof e->impl, "%s", impl ? impl : "?");
    const dnnl_memory_desc_t *sp = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    e->scratch = sp ? dnnl_memory_desc_get_size(sp) : 0;
    if (sp) e->md[3] = *sp;
    /* the reference implementations are loops for testing oneDNN, far slower than OpenBLAS */
    if (strncmp(e->impl, "ref", 3) != 0) s = dnnl_primitive_create(&e->prim, pd);
  }
  if (pd) dnnl_primitive_desc_destroy(pd);
  if (po) dnnl_post_ops_destroy(po);
  if (attr) dnnl_primitive_attr_destroy(attr);
  if (s != dnnl_success) e->prim = NULL;
  if (e->prim) d->created++;
  else d->unimplemented++;
  if (trace) {
    const Key *k = &e->key;
    fprintf(stderr, "shardrt gemm: oneDNN %s %s x %s -> %s, %lld x %lld x %lld, batch %lld%s%s: %s\n",
            e->prim ? "created" : "cannot run", rt_dtype_name((RtDtype)k->a_type), rt_dtype_name((RtDtype)k->b_type),
            rt_dtype_name((RtDtype)k->c_type), (long long)k->m, (long long)k->n, (long long)k->k, (long long)k->batch,
            k->ta ? ", A transposed" : "", k->tb ? ", B transposed" : "", e->impl[0] ? e->impl : "no implementation");
  }
}

static Key key_of(const RtGemm *g) {
  Key k;
  memset(&k, 0, sizeof k); /* the padding too: keys are hashed and compared as bytes */
  k.a_type = g->a_type, k.b_type = g->b_type, k.c_type = g->c_type;
  k.ta = !!g->trans_a, k.tb = !!g->trans_b;
  k.m = g->m, k.n = g->n, k.k = g->k;
  k.batch = g->batch > 1 ? g->batch : 1;
  k.lda = g->lda, k.ldb = g->ldb, k.ldc = g->ldc;
  if (k.batch > 1) k.sa = g->stride_a, k.sb = g->stride_b, k.sc = g->stride_c;
  k.alpha = bits(g->alpha), k.beta = bits(g->beta);
  return k;
}

/* The cached entry for g, made if new; NULL when out of memory or when the engine is missing. */
static Entry *lookup(RtDevice *dev, const RtGemm *g, int *rc) {
  RtDnnl *d = dev->rt->dnnl;
  Key k = key_of(g);
  uint64_t h = key_hash(&k);
  *rc = RT_OK;
  pthread_mutex_lock(&d->lock);
  Entry *e = NULL;
  if (!d->engine && d->engine_status == dnnl_success) {
    d->engine_status = dnnl_engine_create(&d->engine, dnnl_cpu, 0);
    if (d->engine_status == dnnl_success && !d->engine) d->engine_status = dnnl_runtime_error;
  }
  if (!d->engine) {
    *rc = rtrun_fail(dev, RT_E_SYS, "gemm: oneDNN's CPU engine could not be created (status %d)", (int)d->engine_status);
  } else if ((d->used + 1) * 4 > d->cap * 3 && !grow(d)) {
    *rc = rtrun_fail(dev, RT_E_NOMEM, "gemm: out of host memory for oneDNN's primitive cache");
  } else {
    e = find(d, &k, h);
    if (e->used) {
      d->hits++;
    } else {
      e->used = true, e->hash = h, e->key = k;
      d->used++;
      create(d, e, dev->rt->gemm_trace);
    }
  }
  pthread_mutex_unlock(&d->lock);
  return e;
}

int rtdnnl_gemm(RtDevice *dev, const RtGemm *g, bool *ran) {
  int rc;
  *ran = false;
  Entry *e = lookup(dev, g, &rc);
  if (!e || !e->prim) return rc; /* no implementation: the caller runs it on OpenBLAS */
  *ran = true;
  RtDnnl *d = dev->rt->dnnl;
  RtDnnlDev *dd = dev->dnnl;
  if (!dd) {
    if (!(dd = calloc(1, sizeof *dd))) return rtrun_fail(dev, RT_E_NOMEM, "gemm: out of host memory");
    dev->dnnl = dd;
  }
  /* d->engine is set once, before any entry exists, under the lock lookup took */
  if (!dd->stream && dnnl_stream_create(&dd->stream, d->engine, dnnl_stream_default_flags) != dnnl_success)
    return rtrun_fail(dev, RT_E_SYS, "gemm: cannot create a oneDNN stream");
  if (e->scratch > dd->scratch_bytes) {
    free(dd->scratch);
    dd->scratch_bytes = 0;
    /* oneDNN's scratchpads want 64-byte alignment (its own allocator's) */
    size_t bytes = (e->scratch + 63) / 64 * 64;
    if (!(dd->scratch = aligned_alloc(64, bytes))) return rtrun_fail(dev, RT_E_NOMEM, "gemm: out of host memory for oneDNN's scratchpad");
    dd->scratch_bytes = bytes;
  }
  dnnl_memory_t mem[4] = {0};
  void *ptr[4] = {(void *)g->a, (void *)g->b, g->c, dd->scratch};
  int n = e->scratch ? 4 : 3;
  dnnl_status_t s = dnnl_success;
  for (int i = 0; i < n && s == dnnl_success; i++) s = dnnl_memory_create(&mem[i], &e->md[i], d->engine, ptr[i]);
  if (s == dnnl_success) {
    dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, mem[0]}, {DNNL_ARG_WEIGHTS, mem[1]}, {DNNL_ARG_DST, mem[2]}, {DNNL_ARG_SCRATCHPAD, mem[3]}};
    s = dnnl_primitive_execute(e->prim, dd->stream, n, args);
    if (s == dnnl_success) s = dnnl_stream_wait(dd->stream);
  }
  for (int i = 0; i < n; i++)
    if (mem[i]) dnnl_memory_destroy(mem[i]);
  if (s != dnnl_success) return rtrun_fail(dev, RT_E_SYS, "gemm: oneDNN's matmul failed (status %d)", (int)s);
  return RT_OK;
}
