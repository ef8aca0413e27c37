/* lower_jit.c: the lowered module's last steps: verify, optimise at O2 for the host CPU (the new
 * pass manager), print, and JIT-compile with ORC LLJIT, the runtime's symbols resolved from this
 * process (the shardc executable links the runtime and exports its symbols: ENABLE_EXPORTS). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <llvm-c/Analysis.h>
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

bool lower_finish(Lowered *lw, char *err, size_t n) {
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
  /* the host CPU on every function, so that the JIT's code generation uses its vector units */
  char *cpu = LLVMGetHostCPUName(), *features = LLVMGetHostCPUFeatures();
  for (LLVMValueRef f = LLVMGetFirstFunction(lw->M); f; f = LLVMGetNextFunction(f)) {
    if (LLVMIsDeclaration(f)) continue;
    LLVMAddAttributeAtIndex(f, LLVMAttributeFunctionIndex, LLVMCreateStringAttribute(lw->C, "target-cpu", 10, cpu, (unsigned)strlen(cpu)));
    LLVMAddAttributeAtIndex(f, LLVMAttributeFunctionIndex,
                            LLVMCreateStringAttribute(lw->C, "target-features", 15, features, (unsigned)strlen(features)));
  }
  LLVMDisposeMessage(cpu);
  LLVMDisposeMessage(features);
  LLVMPassBuilderOptionsRef opts = LLVMCreatePassBuilderOptions();
  const char *pipeline = getenv("SHARDC_PASSES"); /* experiments: e.g. default<O1> */
  LLVMErrorRef e = LLVMRunPasses(lw->M, pipeline && *pipeline ? pipeline : "default<O2>", tm, opts);
  LLVMDisposePassBuilderOptions(opts);
  LLVMDisposeTargetMachine(tm);
  if (e) {
    char *m = LLVMGetErrorMessage(e);
    snprintf(err, n, "optimising the module: %s", m);
    LLVMDisposeErrorMessage(m);
    return false;
  }
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

/* the JIT's code generation level (LLVMCodeGenOptLevel), 2 by default; SHARDC_JIT_CODEGEN=0
 * for experiments (docs/run.md, "Compile time": 5x faster, streaming loops 40% slower) */
static int jit_level(void) {
  const char *lv = getenv("SHARDC_JIT_CODEGEN");
  return lv && *lv >= '0' && *lv <= '3' ? *lv - '0' : 2;
}

static void hash_str(Sha256 *s, const char *str) { sha256_update(s, str ? str : "", strlen(str ? str : "") + 1); }

/* The cache key: everything the object depends on besides shardc's own build (its version is in it). */
static void cache_key(Lowered *lw, char key[65]) {
  Sha256 s;
  sha256_init(&s);
  hash_str(&s, "shardc object cache 1");
  hash_str(&s, SHARDC_VERSION);
  unsigned v[3];
  LLVMGetVersion(&v[0], &v[1], &v[2]);
  sha256_update(&s, v, sizeof v);
  char *triple = LLVMGetDefaultTargetTriple(), *cpu = LLVMGetHostCPUName(), *features = LLVMGetHostCPUFeatures();
  hash_str(&s, triple), hash_str(&s, cpu), hash_str(&s, features);
  LLVMDisposeMessage(triple), LLVMDisposeMessage(cpu), LLVMDisposeMessage(features);
  hash_str(&s, getenv("SHARDC_PASSES"));
  int level = jit_level();
  sha256_update(&s, &level, sizeof level);
  LLVMMemoryBufferRef bc = LLVMWriteBitcodeToMemoryBuffer(lw->M);
  sha256_update(&s, LLVMGetBufferStart(bc), LLVMGetBufferSize(bc));
  LLVMDisposeMemoryBuffer(bc);
  unsigned char d[32];
  sha256_final(&s, d);
  sha256_hex(d, key);
}

bool lower_finish_cached(Lowered *lw, bool *hit, char *warn, size_t wn, char *err, size_t n) {
  *hit = false, warn[0] = 0;
  if (!native_ready()) {
    snprintf(err, n, "LLVM's native target is not available");
    return false;
  }
  char key[65];
  cache_key(lw, key);
  ObjCache c;
  bool have = objcache_open(&c, warn, wn);
  void *data;
  size_t len;
  bool bad;
  if (have && objcache_get(&c, key, &data, &len, &bad, warn, wn)) {
    lw->obj = LLVMCreateMemoryBufferWithMemoryRangeCopy(data, len, "shardc cached object");
    free(data);
    objcache_close(&c);
    lw->finished = *hit = true;
    return true;
  }
  if (!lower_finish(lw, err, n)) {
    objcache_close(&c);
    return false;
  }
  LLVMTargetMachineRef tm = host_machine_at((LLVMCodeGenOptLevel)jit_level(), LLVMCodeModelJITDefault, err, n);
  if (!tm) {
    objcache_close(&c);
    return false;
  }
  char *msg = NULL;
  LLVMMemoryBufferRef buf = NULL;
  bool ok = !LLVMTargetMachineEmitToMemoryBuffer(tm, lw->M, LLVMObjectFile, &msg, &buf);
  if (!ok) snprintf(err, n, "compiling the module: %s", msg ? msg : "");
  LLVMDisposeMessage(msg);
  LLVMDisposeTargetMachine(tm);
  if (ok) {
    lw->obj = buf;
    size_t used = strlen(warn);
    if (have && !objcache_put(&c, key, LLVMGetBufferStart(buf), LLVMGetBufferSize(buf), warn + used, wn - used)) { /* said; the run goes on */
    }
  }
  objcache_close(&c);
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
  LLVMTargetMachineRef tm = host_machine_at((LLVMCodeGenOptLevel)jit_level(), LLVMCodeModelJITDefault, err, errn);
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
  if (lw->obj) { /* compiled already (lower_finish_cached): the JIT links the object; it owns it now */
    e = LLVMOrcLLJITAddObjectFile(jit, main, lw->obj);
    lw->obj = NULL;
    if (e) return jit_error(e, "adding the compiled object to the JIT (from the cache? --no-cache compiles afresh)", err, errn);
    return lookup_all(jit, names, n, fns, err, errn);
  }
  /* the module moves into the JIT (lower_free then drops our reference to its context) */
  LLVMOrcThreadSafeModuleRef tsm = LLVMOrcCreateNewThreadSafeModule(lw->M, lw->tsc);
  lw->consumed = true;
  e = LLVMOrcLLJITAddLLVMIRModule(jit, main, tsm);
  if (e) return jit_error(e, "adding the module to the JIT", err, errn);
  return lookup_all(jit, names, n, fns, err, errn);
}
