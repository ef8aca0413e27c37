/* lower.h: the LLVM lowering's interface to the rest of the compiler. Only the files of codegen/
 * include the LLVM-C API; everything above it (the driver) sees this header alone.
 *
 * In: an IrModule, either as ir_build/step_build made it (global: every value whole, no
 * collectives: the program for ONE device) or after the pass pipeline (localised: the per-device
 * program of a mesh, collectives with their CollSpecs). Out: one function per call to
 * lower_function in one LLVM module, each with the runtime's RtEntry signature
 *     int NAME(RtDevice *dev, void *arg)
 * where arg points to one `void **` per device (indexed by rt_device_index): the device's slots,
 * main's inputs (by OP_INPUT index), then m's params (by OP_PARAM index), then main's outputs. The
 * host fills the input and param slots with rt_alloc'd buffers of their local blocks (row-major in
 * the type's dim order, stored at the dtype's width); the function rt_alloc's each output and
 * stores it in its slot (the host frees it). docs/run.md lists what lowers. */
#ifndef SHARDC_LOWER_H
#define SHARDC_LOWER_H

#include <stdbool.h>
#include <stdio.h>

#include "ir.h"

/* Tests: whether every struct of runtime/rt_api.def, as the lowering lays it out (LLVM's data
 * layout for this host), has the C compiler's offsets and size (else false, the first difference
 * in err). */
bool lower_rt_check_layouts(char *err, size_t n);

/* The LLVM version linked in, "19.1.7". */
const char *lower_llvm_version(void);

typedef struct Lowered Lowered;

Lowered *lower_new(void);
void lower_free(Lowered *lw);

/* Lowers m's main into function `name`. mesh NULL: the global (unpartitioned) program; otherwise m
 * must be localised on that mesh. An op that cannot be lowered is a located error (diag_error at
 * its source); returns false after any. */
bool lower_function(Lowered *lw, const IrModule *m, const Mesh *mesh, const char *name);

/* The simulated clock: each function lowered after this for a mesh adds, as its device runs each
 * op, the time `shardc sim` gives that op on the mesh's target (sim_costs_op_seconds of `costs`,
 * built for the same localised module) to the device's clock (rt_clock_add: compute kernels and
 * collectives apart), so that a run reports what it executed in simulated time. NULL: no clock. */
typedef struct SimCosts SimCosts;
void lower_set_clock(Lowered *lw, const SimCosts *costs);

/* Verifies the module, then optimises it for the host CPU (the pipeline in lower_jit.c, for loop
 * nests: vectorised, without O2's loop canonicalisation). false with the reason in err. */
bool lower_finish(Lowered *lw, char *err, size_t n);

/* For lower_jit: the module verified, optimised and compiled at `tier` (lower_tier) to objects
 * for the host, one part per entry in `names` (n of them) when the entries share nothing but
 * constants, each part on a thread of its own (*parts: how many), else one. use_cache: through the
 * on-disk cache (objcache.h) keyed by the module's bitcode as lowered, the parts, the host CPU and
 * its features, LLVM's and shardc's versions, the pass pipeline and the code generation level; on
 * a hit neither optimisation nor code generation runs (*hit true; the module stays unoptimised, so
 * not for lower_print or lower_emit_object). A cache that cannot be used, or a bad entry, is said
 * in warn (empty when none) and the module compiled without it. false (err) only when compiling
 * fails. */
bool lower_compile(Lowered *lw, const char *const *names, int n, int tier, bool use_cache, const char *input_key, bool *hit,
                   int *parts, char *warn, size_t wn, char *err, size_t en);

/* The cache's other key (docs/run.md, "Compile time"): what the compiler read rather than the module
 * it lowered, so that a hit skips lowering too: shardc's own build (its GNU build ID: the same
 * binary compiles the same inputs to the same module), LLVM's version, the host's triple, CPU and
 * features, the number of entries, the command line, every SHARDC_* environment variable and every
 * source loaded (the program and its imports, names and contents). false when the executable has
 * no build ID: then only the module's key (lower_compile) is used. lower_compile given it (input_key)
 * stores its objects under it too, with the tier, parts and lower_work's counts. */
bool lower_input_key(int argc, char *const *argv, int nentries, char key[65]);
/* Before lowering: the objects stored under an input key, into lw (then lower_jit links them; lw
 * has no module); *tier, *parts and lower_work's counts as they were compiled. false on a miss, or
 * a bad entry (why in warn, the entry removed); *usable false when the cache cannot be used at all
 * (why in warn: then compile without it). */
bool lower_cache_load(Lowered *lw, const char *key, int *tier, int *parts, bool *usable, char *warn, size_t wn);

/* The tier lower_compile should use for a module that runs `runs` times (lower_jit.c): 0, quick
 * (light optimisation, fast code generation), when the time it saves compiling is more than its
 * loops lose running; else 2, optimising. SHARDC_TIER=0|2 fixes it. */
int lower_tier(const Lowered *lw, double runs);

/* What lower_tier weighs: the loop nests lowered and their element accesses in one run. */
void lower_work(const Lowered *lw, int *nests, double *accesses);

/* Writes the module as an object file for the host into out (after lower_finish; not after
 * lower_jit); a write error shows in ferror(out). */
bool lower_emit_object(Lowered *lw, FILE *out, char *err, size_t n);

/* The module as LLVM IR text. */
void lower_print(Lowered *lw, FILE *out);

/* JIT-compiles the module (ORC LLJIT, runtime symbols from this process) and looks up `names`
 * (n of them) into fns: the objects lower_compile made, or else the module (consumed) after
 * lower_finish, compiled by the JIT. Call once. The functions are
 * valid until lower_free. */
bool lower_jit(Lowered *lw, const char *const *names, int n, void **fns, char *err, size_t errn);

#endif
