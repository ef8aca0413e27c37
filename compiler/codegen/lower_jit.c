/* lower_jit.c: the lowered module's last steps: verify, optimise at O2 for the host CPU (the new
 * pass manager), print, and JIT-compile with ORC LLJIT, the runtime's symbols resolved from this
 * process (the shardc executable links the runtime and exports its symbols: ENABLE_EXPORTS). */
#include <stdio.h>
#include <stdlib.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include <llvm-c/Analysis.h>
#include <llvm-c/BitReader.h>
#include <llvm-c/BitWriter.h>
#include <llvm-c/Error.h>
#include <llvm-c/LLJIT.h>
#include <llvm-c/Orc.h>
#include <llvm-c/Target.h>
#include <llvm-c/TargetMachine.h>
#include <llvm-c/Transforms/PassBuilder.h>

#include "lower_int.h"
#include "objcache.h"
#include "sha256.h"

static bool native_ready(void) {
  static int done = 0;
  if (!done) {
    done = LLVMInitializeNativeTarget() == 0 && LLVMInitializeNativeAsmPrinter() == 0 && LLVMInitializeNativeAsmParser() == 0 ? 1 : -1;
  }
  return done == 1;
}

static LLVMTargetMachineRef host_machine_at(LLVMCodeGenOptLevel level, LLVMCodeModel model, char *err, size_t n) {
  char *triple = LLVMGetDefaultTargetTriple();
  LLVMTargetRef target;
  char *msg = NULL;
  if (LLVMGetTargetFromTriple(triple, &target, &msg)) {
    snprintf(err, n, "no LLVM target for %s: %s", triple, msg ? msg : "");
    LLVMDisposeMessage(msg);
    LLVMDisposeMessage(triple);
    return NULL;
  }
  char *cpu = LLVMGetHostCPUName(), *features = LLVMGetHostCPUFeatures();
  LLVMTargetMachineRef tm = LLVMCreateTargetMachine(target, triple, cpu, features, level, LLVMRelocPIC, model);
  LLVMDisposeMessage(cpu);
  LLVMDisposeMessage(features);
  LLVMDisposeMessage(triple);
  if (!tm) snprintf(err, n, "cannot create a target machine for the host");
  return tm;
}

static LLVMTargetMachineRef host_machine(char *err, size_t n) {
  return host_machine_at(LLVMCodeGenLevelDefault, LLVMCodeModelJITDefault, err, n);
}

/* Two tiers of compilation, as a JIT would have them (docs/run.md, "Compile time").
 *
 * The optimising tier: the generated code is loop nests over buffers with trip counts known at
 * compile time, already in rotated form; what pays is vectorising them, with LICM and instcombine
 * around it, then code generation at level 2. default<O2> vectorises the same loops (184 against
 * 176 of llama3_8b's small train step) and takes four times as long, a third of it in
 * IndVarSimplify, which finds nothing to do on these loops.
 *
 * The quick tier: scalar replacement and CSE only, and LLVM's fast instruction selection and
 * register allocation (level 0): about a sixth of the optimising tier's time, for loops that run
 * about twice as slow. For a program whose loops stream little (the small sizes one tries a layout
 * at), the time saved compiling is more than the loops lose. Both tiers compile the same IR under
 * IEEE semantics (no fast-math flags), so they compute the same bits.
 *
 * SHARDC_TIER=0|2 fixes the tier; SHARDC_PASSES and SHARDC_JIT_CODEGEN replace its pipeline and
 * code generation level, for experiments. */
#define SHARDC_PIPELINE                                                                                            \
  "globaldce,function(sroa,early-cse<memssa>,instcombine<no-verify-fixpoint>,simplifycfg,loop-mssa(licm),"        \
  "loop-vectorize,instcombine<no-verify-fixpoint>,simplifycfg)"
#define SHARDC_PIPELINE_QUICK "globaldce,function(sroa,early-cse,simplifycfg)"

static const char *pass_pipeline(int tier) {
  const char *p = getenv("SHARDC_PASSES");
  return p && *p ? p : tier == 0 ? SHARDC_PIPELINE_QUICK : SHARDC_PIPELINE;
}

/* the code generation level (LLVMCodeGenOptLevel) of a tier; SHARDC_JIT_CODEGEN=0..3 overrides */
static int codegen_level(int tier) {
  const char *lv = getenv("SHARDC_JIT_CODEGEN");
  return lv && *lv >= '0' && *lv <= '3' && !lv[1] ? *lv - '0' : tier == 0 ? 0 : 2;
}

/* The tier for a program whose loop nests make `work` element accesses per run, `runs` times.
 * Measured (2 cores, SHARDC_TIER=0 against 2, docs/run.md "Compile time"): the optimising tier
 * takes 4-6 ms longer per loop nest to compile (llama3_8b's small train step, 260 nests: 1.0 s;
 * bench/native/llama_block.shard, 112 nests: 0.7 s; samples/mlp.shard, 36 nests: 0.15 s), and its
 * loops run 2-9 ns faster per element access (the LLaMA block's 1.5e8 accesses a step: 0.15-0.3 s;
 * the MLP's 2.1e8: 1 s, its GELU vectorised). The rule takes 4 ms and 4 ns. */
#define TIER_COMPILE_S_PER_NEST 4e-3
#define TIER_SAVED_S_PER_ACCESS 4e-9

void lower_work(const Lowered *lw, int *nests, double *accesses) { *nests = lw->nests, *accesses = lw->loop_work; }

int lower_tier(const Lowered *lw, double runs) {
  const char *t = getenv("SHARDC_TIER");
  if (t && (t[0] == '0' || t[0] == '2') && !t[1]) return t[0] - '0';
  return lw->loop_work * runs * TIER_SAVED_S_PER_ACCESS > lw->nests * TIER_COMPILE_S_PER_NEST ? 2 : 0;
}

/* Verified, with the host's triple, data layout and CPU on every function (so that the code
 * generation uses its vector units). */
static bool prepare(Lowered *lw, char *err, size_t n) {
  if (!native_ready()) {
    snprintf(err, n, "LLVM's native target is not available");
    return false;
  }
  char *msg = NULL;
  if (LLVMVerifyModule(lw->M, LLVMReturnStatusAction, &msg)) {
    snprintf(err, n, "the lowered module does not verify: %.400s", msg ? msg : "");
    LLVMDisposeMessage(msg);
    return false;
  }
  LLVMDisposeMessage(msg);
  LLVMTargetMachineRef tm = host_machine(err, n);
  if (!tm) return false;
  char *triple = LLVMGetTargetMachineTriple(tm);
  LLVMSetTarget(lw->M, triple);
  LLVMDisposeMessage(triple);
  LLVMTargetDataRef td = LLVMCreateTargetDataLayout(tm);
  LLVMSetModuleDataLayout(lw->M, td);
  LLVMDisposeTargetData(td);
  LLVMDisposeTargetMachine(tm);
  char *cpu = LLVMGetHostCPUName(), *features = LLVMGetHostCPUFeatures();
  for (LLVMValueRef f = LLVMGetFirstFunction(lw->M); f; f = LLVMGetNextFunction(f)) {
    if (LLVMIsDeclaration(f)) continue;
    LLVMAddAttributeAtIndex(f, LLVMAttributeFunctionIndex, LLVMCreateStringAttribute(lw->C, "target-cpu", 10, cpu, (unsigned)strlen(cpu)));
    LLVMAddAttributeAtIndex(f, LLVMAttributeFunctionIndex,
                            LLVMCreateStringAttribute(lw->C, "target-features", 15, features, (unsigned)strlen(features)));
  }
  LLVMDisposeMessage(cpu);
  LLVMDisposeMessage(features);
  return true;
}

static bool optimise(LLVMModuleRef M, int tier, char *err, size_t n) {
  LLVMTargetMachineRef tm = host_machine(err, n);
  if (!tm) return false;
  LLVMPassBuilderOptionsRef opts = LLVMCreatePassBuilderOptions();
  LLVMErrorRef e = LLVMRunPasses(M, pass_pipeline(tier), tm, opts);
  LLVMDisposePassBuilderOptions(opts);
  LLVMDisposeTargetMachine(tm);
  if (e) {
    char *m = LLVMGetErrorMessage(e);
    snprintf(err, n, "optimising the module: %s", m);
    LLVMDisposeErrorMessage(m);
    return false;
  }
  return true;
}

bool lower_finish(Lowered *lw, char *err, size_t n) {
  if (!prepare(lw, err, n) || !optimise(lw->M, 2, err, n)) return false;
  lw->finished = true;
  return true;
}
bool lower_emit_object(Lowered *lw, FILE *out, char *err, size_t n) {
  if (!lw->finished || lw->consumed) {
    snprintf(err, n, "the module is not ready to emit");
    return false;
  }
  LLVMTargetMachineRef tm = host_machine(err, n);
  if (!tm) return false;
  /* in memory, then written by the caller's checked stream: LLVM's own file output ends the process
   * on a write error (a full disk), skipping shardc's cleanup */
  char *msg = NULL;
  LLVMMemoryBufferRef buf = NULL;
  bool ok = !LLVMTargetMachineEmitToMemoryBuffer(tm, lw->M, LLVMObjectFile, &msg, &buf);
  if (!ok) snprintf(err, n, "emitting the object: %s", msg ? msg : "");
  if (ok) fwrite(LLVMGetBufferStart(buf), 1, LLVMGetBufferSize(buf), out); /* errors: ferror(out) */
  if (buf) LLVMDisposeMemoryBuffer(buf);
  LLVMDisposeMessage(msg);
  LLVMDisposeTargetMachine(tm);
  return ok;
}

void lower_print(Lowered *lw, FILE *out) {
  char *s = LLVMPrintModuleToString(lw->M);
  fputs(s, out);
  LLVMDisposeMessage(s);
}

static void hash_str(Sha256 *s, const char *str) { sha256_update(s, str ? str : "", strlen(str ? str : "") + 1); }

/* What both keys hold of the machine: LLVM's version, the host's triple, CPU name and features. */
static void hash_host(Sha256 *s) {
  unsigned v[3];
  LLVMGetVersion(&v[0], &v[1], &v[2]);
  sha256_update(s, v, sizeof v);
  char *triple = LLVMGetDefaultTargetTriple(), *cpu = LLVMGetHostCPUName(), *features = LLVMGetHostCPUFeatures();
  hash_str(s, triple), hash_str(s, cpu), hash_str(s, features);
  LLVMDisposeMessage(triple), LLVMDisposeMessage(cpu), LLVMDisposeMessage(features);
}

/* The cache key: everything the objects depend on besides shardc's own build (its version is in
 * it): the module as lowered, the parts it is split into, the host, LLVM, the pipeline and level. */
static void cache_key(Lowered *lw, const char *const *names, int nparts, int tier, char key[65]) {
  Sha256 s;
  sha256_init(&s);
  hash_str(&s, "shardc object cache 2");
  hash_str(&s, SHARDC_VERSION);
  hash_host(&s);
  hash_str(&s, pass_pipeline(tier));
  int level = codegen_level(tier);
  sha256_update(&s, &level, sizeof level);
  sha256_update(&s, &nparts, sizeof nparts);
  for (int i = 0; i < nparts; i++) hash_str(&s, names[i]);
  LLVMMemoryBufferRef bc = LLVMWriteBitcodeToMemoryBuffer(lw->M);
  sha256_update(&s, LLVMGetBufferStart(bc), LLVMGetBufferSize(bc));
  LLVMDisposeMemoryBuffer(bc);
  unsigned char d[32];
  sha256_final(&s, d);
  sha256_hex(d, key);
}

/* One part of the module compiled on its own thread: the module read back from its bitcode into
 * a context of the part's own, the other parts' entries deleted, what is left optimised and
 * compiled to an object. */
typedef struct Part {
  const char *bc;
  size_t len;
  const char *const *drop; /* the other parts' entries */
  int ndrop;
  int tier;
  LLVMMemoryBufferRef obj;
  char err[512];
} Part;

static bool emit(LLVMModuleRef M, int tier, LLVMMemoryBufferRef *obj, char *err, size_t n) {
  LLVMTargetMachineRef tm = host_machine_at((LLVMCodeGenOptLevel)codegen_level(tier), LLVMCodeModelJITDefault, err, n);
  if (!tm) return false;
  char *msg = NULL;
  bool ok = !LLVMTargetMachineEmitToMemoryBuffer(tm, M, LLVMObjectFile, &msg, obj);
  if (!ok) snprintf(err, n, "compiling the module: %s", msg ? msg : "");
  LLVMDisposeMessage(msg);
  LLVMDisposeTargetMachine(tm);
  return ok;
}

static void *part_compile(void *arg) {
  Part *p = arg;
  LLVMContextRef C = LLVMContextCreate();
  LLVMMemoryBufferRef mb = LLVMCreateMemoryBufferWithMemoryRange(p->bc, p->len, "shardc part", 0);
  LLVMModuleRef M = NULL;
  bool ok = !LLVMParseBitcodeInContext2(C, mb, &M);
  LLVMDisposeMemoryBuffer(mb);
  if (!ok) snprintf(p->err, sizeof p->err, "reading the module back from its bitcode");
  for (int i = 0; ok && i < p->ndrop; i++) {
    LLVMValueRef f = LLVMGetNamedFunction(M, p->drop[i]);
    if (f) LLVMDeleteFunction(f);
  }
  ok = ok && optimise(M, p->tier, p->err, sizeof p->err) && emit(M, p->tier, &p->obj, p->err, sizeof p->err);
  if (M) LLVMDisposeModule(M);
  LLVMContextDispose(C);
  return NULL;
}

/* Whether the module can be compiled as one part per entry: every entry defined and called by
 * nothing, every other definition a constant or a function with local linkage (each part then
 * keeps its own copy of what it uses; globaldce drops the rest). Otherwise one part. */
static bool splittable(Lowered *lw, const char *const *names, int n) {
  if (n < 2 || n > LOWER_MAX_PARTS) return false;
  for (int i = 0; i < n; i++) {
    LLVMValueRef f = LLVMGetNamedFunction(lw->M, names[i]);
    if (!f || LLVMIsDeclaration(f) || LLVMGetFirstUse(f)) return false;
  }
  for (LLVMValueRef f = LLVMGetFirstFunction(lw->M); f; f = LLVMGetNextFunction(f)) {
    if (LLVMIsDeclaration(f)) continue;
    bool entry = false;
    size_t len;
    const char *name = LLVMGetValueName2(f, &len);
    for (int i = 0; i < n; i++) entry |= strcmp(name, names[i]) == 0;
    LLVMLinkage k = LLVMGetLinkage(f);
    if (!entry && k != LLVMInternalLinkage && k != LLVMPrivateLinkage) return false;
  }
  for (LLVMValueRef g = LLVMGetFirstGlobal(lw->M); g; g = LLVMGetNextGlobal(g)) {
    if (LLVMIsDeclaration(g)) continue;
    LLVMLinkage k = LLVMGetLinkage(g);
    if (!LLVMIsGlobalConstant(g) || (k != LLVMInternalLinkage && k != LLVMPrivateLinkage)) return false;
  }
  return true;
}

/* The parts compiled at once, the first on this thread. */
static bool compile_parts(Lowered *lw, const char *const *names, int nparts, int tier, char *err, size_t n) {
  if (nparts == 1) { /* the module itself, no copy */
    LLVMMemoryBufferRef obj = NULL;
    if (!optimise(lw->M, tier, err, n) || !emit(lw->M, tier, &obj, err, n)) return false;
    lw->objs[lw->nobjs++] = obj;
    return true;
  }
  LLVMMemoryBufferRef bc = LLVMWriteBitcodeToMemoryBuffer(lw->M);
  Part part[LOWER_MAX_PARTS];
  const char *drop[LOWER_MAX_PARTS][LOWER_MAX_PARTS];
  pthread_t tid[LOWER_MAX_PARTS];
  bool started[LOWER_MAX_PARTS] = {0};
  for (int i = 0; i < nparts; i++) {
    int nd = 0;
    for (int j = 0; j < nparts; j++)
      if (j != i) drop[i][nd++] = names[j];
    part[i] = (Part){.bc = LLVMGetBufferStart(bc), .len = LLVMGetBufferSize(bc), .drop = drop[i], .ndrop = nd, .tier = tier};
  }
  for (int i = 1; i < nparts; i++) started[i] = pthread_create(&tid[i], NULL, part_compile, &part[i]) == 0;
  part_compile(&part[0]);
  for (int i = 1; i < nparts; i++) {
    if (started[i]) pthread_join(tid[i], NULL);
    else part_compile(&part[i]); /* no thread to be had: here, after the first */
  }
  LLVMDisposeMemoryBuffer(bc);
  bool ok = true;
  for (int i = 0; i < nparts; i++) {
    if (ok && !part[i].obj) snprintf(err, n, "%s", part[i].err), ok = false;
    if (part[i].obj) lw->objs[lw->nobjs++] = part[i].obj;
  }
  return ok;
}

/* A cache entry holds the parts' objects one after another, each after its length (8 bytes). */
static bool entry_split(Lowered *lw, const unsigned char *data, size_t len, int nparts) {
  size_t at = 0;
  for (int i = 0; i < nparts; i++) {
    uint64_t k;
    if (len - at < sizeof k) return false;
    memcpy(&k, data + at, sizeof k);
    at += sizeof k;
    if (k == 0 || k > len - at) return false;
    lw->objs[lw->nobjs++] = LLVMCreateMemoryBufferWithMemoryRangeCopy((const char *)data + at, (size_t)k, "shardc cached object");
    at += (size_t)k;
  }
  return at == len;
}

static void *entry_join(Lowered *lw, size_t *len) {
  size_t total = 0;
  for (int i = 0; i < lw->nobjs; i++) total += sizeof(uint64_t) + LLVMGetBufferSize(lw->objs[i]);
  unsigned char *data = malloc(total ? total : 1);
  if (!data) return NULL;
  size_t at = 0;
  for (int i = 0; i < lw->nobjs; i++) {
    uint64_t k = LLVMGetBufferSize(lw->objs[i]);
    memcpy(data + at, &k, sizeof k);
    memcpy(data + at + sizeof k, LLVMGetBufferStart(lw->objs[i]), (size_t)k);
    at += sizeof k + (size_t)k;
  }
  *len = total;
  return data;
}

static void drop_objects(Lowered *lw) {
  for (int i = 0; i < lw->nobjs; i++) LLVMDisposeMemoryBuffer(lw->objs[i]);
  lw->nobjs = 0;
}

/* ---- keyed by the compiler's inputs (lower.h, lower_input_key) ----
 * Such an entry starts with what lowering would have told: "SHARDCI1", then the tier, the loop
 * nests, the parts (int32 each), 4 bytes of zero and the element accesses (a double); the parts'
 * objects follow as in an entry keyed by the module. */
enum { INPUT_HEADER = 8 + 4 * 4 + 8 };
static const char INPUT_MAGIC[8] = {'S', 'H', 'A', 'R', 'D', 'C', 'I', '1'};

static void hash_source(void *ctx, const char *name, const char *text, size_t len) {
  Sha256 *s = ctx;
  hash_str(s, name);
  uint64_t n = len;
  sha256_update(s, &n, sizeof n);
  sha256_update(s, text, len);
}

extern char **environ;

static int cmp_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

bool lower_input_key(int argc, char *const *argv, int nentries, char key[65]) {
  unsigned char id[64];
  size_t nid = objcache_build_id(id, sizeof id);
  if (!nid) return false;
  Sha256 s;
  sha256_init(&s);
  hash_str(&s, "shardc input cache 1");
  hash_str(&s, SHARDC_VERSION);
  sha256_update(&s, id, nid);
  hash_host(&s);
  sha256_update(&s, &nentries, sizeof nentries);
  sha256_update(&s, &argc, sizeof argc);
  for (int i = 0; i < argc; i++) hash_str(&s, argv[i]);
  int nenv = 0; /* every SHARDC_* variable, sorted: the tests' and tuning knobs change the code */
  for (char **e = environ; *e; e++) nenv += strncmp(*e, "SHARDC_", 7) == 0;
  const char **env = malloc(((size_t)nenv + 1) * sizeof *env);
  if (!env) return false;
  nenv = 0;
  for (char **e = environ; *e; e++)
    if (strncmp(*e, "SHARDC_", 7) == 0) env[nenv++] = *e;
  qsort(env, (size_t)nenv, sizeof *env, cmp_str);
  sha256_update(&s, &nenv, sizeof nenv);
  for (int i = 0; i < nenv; i++) hash_str(&s, env[i]);
  free(env);
  source_each(hash_source, &s); /* the program and everything it imported, as read */
  unsigned char d[32];
  sha256_final(&s, d);
  sha256_hex(d, key);
  return true;
}

bool lower_cache_load(Lowered *lw, const char *key, int *tier, int *parts, bool *usable, char *warn, size_t wn) {
  warn[0] = 0;
  ObjCache c;
  if (!(*usable = objcache_open(&c, warn, wn))) return false;
  void *data = NULL;
  size_t len = 0;
  bool bad = false, hit = false;
  if (objcache_get(&c, key, &data, &len, &bad, warn, wn)) {
    const unsigned char *d = data;
    int32_t h[4];
    if (len > INPUT_HEADER && memcmp(d, INPUT_MAGIC, sizeof INPUT_MAGIC) == 0) {
      memcpy(h, d + 8, sizeof h);
      double acc;
      memcpy(&acc, d + 8 + sizeof h, sizeof acc);
      if ((h[0] == 0 || h[0] == 2) && h[1] >= 0 && h[2] >= 1 && h[2] <= LOWER_MAX_PARTS &&
          entry_split(lw, d + INPUT_HEADER, len - INPUT_HEADER, h[2])) {
        *tier = h[0], *parts = h[2], lw->nests = h[1], lw->loop_work = acc;
        lw->finished = hit = true;
      }
    }
    if (!hit) {
      drop_objects(lw);
      size_t used = strlen(warn);
      snprintf(warn + used, wn - used, "%scache entry %s.o is not a whole entry; compiled again", used ? "; " : "", key);
    }
  }
  free(data);
  objcache_close(&c);
  return hit;
}


/* The objects in lw stored under an input key as well, with what lowering told (lower_cache_load
 * reads it); a failure is said in warn (after what is there). */
static void store_input(Lowered *lw, ObjCache *c, const char *input_key, int tier, int nparts, char *warn, size_t wn) {
  size_t len = 0;
  unsigned char *data = entry_join(lw, &len), *both = data ? malloc(INPUT_HEADER + len) : NULL;
  if (both) {
    int32_t h[4] = {tier, lw->nests, nparts, 0};
    memcpy(both, INPUT_MAGIC, sizeof INPUT_MAGIC);
    memcpy(both + 8, h, sizeof h);
    memcpy(both + 8 + sizeof h, &lw->loop_work, sizeof lw->loop_work);
    memcpy(both + INPUT_HEADER, data, len);
    size_t used = strlen(warn);
    if (!objcache_put(c, input_key, both, INPUT_HEADER + len, warn + used, wn - used)) { /* said; the run goes on */
    }
  }
  free(both);
  free(data);
}

bool lower_compile(Lowered *lw, const char *const *names, int n, int tier, bool use_cache, const char *input_key, bool *hit,
                   int *parts, char *warn, size_t wn, char *err, size_t en) {
  *hit = false, warn[0] = 0;
  if (!prepare(lw, err, en)) return false;
  int nparts = splittable(lw, names, n) ? n : 1;
  *parts = nparts;
  char key[65];
  ObjCache c;
  bool have = false;
  if (use_cache) {
    cache_key(lw, names, nparts, tier, key);
    have = objcache_open(&c, warn, wn);
    void *data;
    size_t len;
    bool bad;
    if (have && objcache_get(&c, key, &data, &len, &bad, warn, wn)) {
      bool whole = entry_split(lw, data, len, nparts);
      free(data);
      if (whole) {
        if (input_key) store_input(lw, &c, input_key, tier, nparts, warn, wn);
        objcache_close(&c);
        lw->finished = *hit = true;
        return true;
      }
      drop_objects(lw); /* the entry's hash held, so a shardc of another layout wrote it: compile */
      size_t used = strlen(warn);
      snprintf(warn + used, wn - used, "%scache entry %s.o does not hold %d objects; compiled again", used ? "; " : "", key, nparts);
    }
  }
  bool ok = compile_parts(lw, names, nparts, tier, err, en);
  if (ok) lw->finished = true;
  if (ok && have) {
    size_t len = 0, used = strlen(warn);
    void *data = entry_join(lw, &len);
    if (data && !objcache_put(&c, key, data, len, warn + used, wn - used)) { /* said; the run goes on */
    }
    free(data);
    if (input_key) store_input(lw, &c, input_key, tier, nparts, warn, wn);
  }
  if (have) objcache_close(&c);
  return ok;
}

static bool jit_error(LLVMErrorRef e, const char *what, char *err, size_t n) {
  char *m = LLVMGetErrorMessage(e);
  snprintf(err, n, "%s: %s", what, m);
  LLVMDisposeErrorMessage(m);
  return false;
}

static bool lookup_all(LLVMOrcLLJITRef jit, const char *const *names, int n, void **fns, char *err, size_t errn) {
  for (int i = 0; i < n; i++) {
    LLVMOrcExecutorAddress addr = 0;
    LLVMErrorRef e = LLVMOrcLLJITLookup(jit, &addr, names[i]);
    if (e) return jit_error(e, "looking up the entry", err, errn);
    fns[i] = (void *)(uintptr_t)addr;
  }
  return true;
}

/* The JIT lives in lw until lower_free (the functions it made are valid until then). */
bool lower_jit(Lowered *lw, const char *const *names, int n, void **fns, char *err, size_t errn) {
  if (!native_ready()) {
    snprintf(err, errn, "LLVM's native target is not available");
    return false;
  }
  LLVMOrcLLJITRef jit;
  LLVMOrcLLJITBuilderRef builder = LLVMOrcCreateLLJITBuilder();
  LLVMTargetMachineRef tm = host_machine_at((LLVMCodeGenOptLevel)codegen_level(2), LLVMCodeModelJITDefault, err, errn);
  if (!tm) return false;
  LLVMOrcLLJITBuilderSetJITTargetMachineBuilder(builder, LLVMOrcJITTargetMachineBuilderCreateFromTargetMachine(tm));
  LLVMErrorRef e = LLVMOrcCreateLLJIT(&jit, builder);
  if (e) return jit_error(e, "creating the JIT", err, errn);
  lw->jit = jit;
  LLVMOrcDefinitionGeneratorRef gen;
  e = LLVMOrcCreateDynamicLibrarySearchGeneratorForProcess(&gen, LLVMOrcLLJITGetGlobalPrefix(jit), NULL, NULL);
  if (e) return jit_error(e, "resolving the runtime's symbols", err, errn);
  LLVMOrcJITDylibRef main = LLVMOrcLLJITGetMainJITDylib(jit);
  LLVMOrcJITDylibAddGenerator(main, gen);
  if (lw->nobjs) { /* compiled already (lower_compile): the JIT links the objects; it owns them now */
    for (int i = 0; i < lw->nobjs; i++) {
      e = LLVMOrcLLJITAddObjectFile(jit, main, lw->objs[i]);
      lw->objs[i] = NULL;
      if (e) { /* the JIT owns the ones it was given, failed or not; the rest are ours */
        for (int j = i + 1; j < lw->nobjs; j++) LLVMDisposeMemoryBuffer(lw->objs[j]);
        lw->nobjs = 0;
        return jit_error(e, "adding the compiled object to the JIT (from the cache? --no-cache compiles afresh)", err, errn);
      }
    }
    lw->nobjs = 0;
    return lookup_all(jit, names, n, fns, err, errn);
  }
  /* the module moves into the JIT (lower_free then drops our reference to its context) */
  LLVMOrcThreadSafeModuleRef tsm = LLVMOrcCreateNewThreadSafeModule(lw->M, lw->tsc);
  lw->consumed = true;
  e = LLVMOrcLLJITAddLLVMIRModule(jit, main, tsm);
  if (e) return jit_error(e, "adding the module to the JIT", err, errn);
  return lookup_all(jit, names, n, fns, err, errn);
}
