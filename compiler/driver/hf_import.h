/* hf_import.h: a Hugging Face config.json as a .shard program (`shardc import`, docs/import.md).
 *
 * In: a loaded config (hf_config.h). Out: the text of a program on the stdlib's models: imports, a
 * mesh, the dims from the config's shapes, a layout, a train step, and a header that states what
 * the import chose (mesh, batch, sequence, step), what differs from the original model and which
 * config fields change nothing here. One function per model_type reads its keys (an unsupported
 * value that changes the architecture is an error at that value); the writer is shared. */
#ifndef SHARDC_HF_IMPORT_H
#define SHARDC_HF_IMPORT_H

#include "hf_config.h"

typedef struct HfProgram {
  const char *text;          /* the .shard program, in the arena */
  const char *model_type;    /* the config's */
  const char *stdlib_file;   /* "models/llama" */
  const char *model;         /* "llama" */
  int64_t params;            /* the stdlib model's parameter formula at the config's sizes */
  const char *mesh;          /* "h100[data: 8, model: 8]" */
  int64_t devices;
  VEC(const char *) ignored; /* config keys noted as changing nothing, in file order */
  VEC(const char *) unknown; /* config keys the import does not know (each warned) */
} HfProgram;

/* The program for c; `name` names it in its header (the -o file's base name; NULL: stdout).
 * False after diagnostics: an unsupported model_type or value, a missing or malformed key. */
bool hf_import(HfConfig *c, const char *name, HfProgram *out);

/* The model types hf_import supports, comma-separated, for messages and --help. */
const char *hf_import_model_types(void);

#endif
