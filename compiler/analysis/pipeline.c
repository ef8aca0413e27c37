/* pipeline.c: declarations, then the entry's IR (pipeline.h). */
#include <stdio.h>

#include "diag.h"
#include "bucket.h"
#include "cmm.h"
#include "dpwin.h"
#include "devprog.h"
#include "localize.h"
#include "partition.h"
#include "pipeline.h"
#include "propagate.h"
#include "route.h"
#include "stages.h"
#include "step.h"

IrModule *check_build_ir(Arena *arena, const Program *p) {
  return step_build(arena, p); /* the entry's forward alone unless p's step is a train step */
}

int check_program(Arena *arena, ParsedProgram *parsed, const SemaOptions *so, CheckedProgram *cp) {
  int before = diag_error_count();
  cp->parsed = parsed;
  cp->so = *so;
  const char *was = mem_activity("checking the declarations");
  cp->prog = sema_program(arena, cp->parsed, so);
  mem_activity(was);
  if (cp->prog->usage_error) {
    diag_usage("%s", cp->prog->usage_error);
    return EXIT_USAGE;
  }
  if (diag_error_count() > before) return EXIT_PROGRAM_ERROR;
  if (!cp->prog->entry) return EXIT_OK;
  if (!cp->prog->mesh) {
    diag_error(cp->prog->entry->loc, "no mesh is declared: declare one (mesh pod = tpu_v5e[data: 4, model: 2]) "
               "to check memory per device");
    return EXIT_PROGRAM_ERROR;
  }
  if (cp->prog->step && cp->prog->step->kind == STEP_SERVE) {
    diag_usage("compiling a `serve` step is not implemented yet; use --entry model.fn");
    return EXIT_USAGE;
  }
  was = mem_activity("building the step's IR");
  cp->ir = check_build_ir(arena, cp->prog);
  mem_activity(was);
  if (!cp->ir || diag_error_count() > before) return EXIT_PROGRAM_ERROR;
  return EXIT_OK;
}

/* The passes, each naming itself for an out-of-memory message (common.h's mem_activity). */
static bool passes(IrModule *m, const Program *p, int before) {
  mem_activity("propagating shardings");
  propagate_module(m, p);
  mem_activity("partitioning");
  if (!partition_module(m, p) || diag_error_count() > before) return false;
  ir_route_mark(m); /* the collectives of patterned values keep their pattern (route.h) */
  if (!ir_verify(m, stderr)) {
    diag_error(p->entry ? p->entry->loc : (SrcLoc){0}, "internal error: the partitioned IR does not verify");
    return false;
  }
  bucket_module(m, p);
  mem_activity("localizing");
  if (!localize_module(m, p)) return false;
  mem_activity("splitting the pipeline into stages and scheduling it");
  if (!stages_module(m, p)) return false;
  ir_route_mark(m); /* and so do their slices, and a pipeline's regions */
  if (!ir_verify(m, stderr)) {
    diag_error(p->entry ? p->entry->loc : (SrcLoc){0}, "internal error: the pipelined IR does not verify");
    return false;
  }
  if (!devprog_build(m, p->mesh)) return false;
  cmm_module(m, p); /* collective matmuls (tp_overlap): marks in the device program */
  dpwin_module(m, p); /* data-parallel collectives' overlap windows (dp_overlap) */
  return true;
}

bool pipeline_run(IrModule *m, const Program *p) {
  if (!m || !m->main || !p || !p->mesh) return true;
  if (m->localized) return true;
  int before = diag_error_count();
  const char *was = mem_activity(NULL);
  bool ok = passes(m, p, before);
  mem_activity(was);
  return ok && diag_error_count() == before;
}
