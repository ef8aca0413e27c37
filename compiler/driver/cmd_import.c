/* cmd_import.c: `shardc import config.json [-o FILE]` (docs/import.md).
 *
 * Reads a Hugging Face config.json (hf_config.c), makes the .shard program on the stdlib's models
 * (hf_import.c) and prints it, or writes it to FILE. FILE is written whole or not at all: the text
 * is written as every output is (outfile.h: a temporary file beside it, renamed over it; never an
 * input of the command), so an interrupted or failed
 * import never leaves half a program (nor clobbers a good one). With --format json: one object,
 *   {"model_type", "stdlib", "model", "params", "mesh", "devices", "ignored": [keys],
 *    "unknown": [keys], and "output": FILE or "program": the text}.
 * Errors (a malformed config, an unsupported model type or value) are diagnostics at the config's
 * line and column, exit 1; options that mean nothing to import (-D, --mesh, ...) exit 2. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "driver.h"
#include "outfile.h"
#include "hf_import.h"
#include "report.h"

/* Writes text to path as every output is written (outfile.h: a temporary file beside it, fsync,
 * rename; never over an input). False with the reason in err. */
static bool write_output(const char *path, const char *text, char *err, size_t n) {
  OutFile *f = outfile_open(path, OUTFILE_DATA, err, n);
  if (!f) return false;
  fputs(text, outfile_stream(f));
  return outfile_commit(f, err, n);
}

static cJSON *names_json(const char *const *names, int n) {
  cJSON *a = cJSON_CreateArray();
  for (int i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateString(names[i]));
  return a;
}

int cmd_import(const Options *o) {
  const char *bad = o->ndims ? "-D" : o->nsets ? "--set" : o->layout ? "--layout" : o->mesh ? "--mesh" : o->entry ? "--entry"
                    : o->trace ? "--trace" : o->show ? "--show" : o->load ? "--load" : o->save ? "--save" : NULL;
  if (bad) {
    diag_usage("import takes -o FILE and --format; %s applies to the program it writes (shardc check FILE %s ...)",
               bad, bad);
    return EXIT_USAGE;
  }
  Arena arena;
  arena_init(&arena);
  HfConfig c;
  HfProgram prog;
  int rc = EXIT_PROGRAM_ERROR;
  const char *name = NULL;
  if (o->output) {
    name = strrchr(o->output, '/');
    name = name ? name + 1 : o->output;
  }
  if (!hf_config_load(&c, &arena, o->input) || !hf_import(&c, name, &prog)) goto done;
  if (o->output) {
    char err[512];
    if (!write_output(o->output, prog.text, err, sizeof err)) {
      diag_error((SrcLoc){0}, "%s (nothing was written)", err);
      goto done;
    }
  }
  rc = EXIT_OK;
  if (o->format == FORMAT_JSON) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "model_type", prog.model_type);
    cJSON_AddStringToObject(j, "stdlib", prog.stdlib_file);
    cJSON_AddStringToObject(j, "model", prog.model);
    cJSON_AddNumberToObject(j, "params", (double)prog.params);
    cJSON_AddStringToObject(j, "mesh", prog.mesh);
    cJSON_AddNumberToObject(j, "devices", (double)prog.devices);
    cJSON_AddItemToObject(j, "ignored", names_json(prog.ignored.data, prog.ignored.len));
    cJSON_AddItemToObject(j, "unknown", names_json(prog.unknown.data, prog.unknown.len));
    if (o->output) cJSON_AddStringToObject(j, "output", o->output);
    else cJSON_AddStringToObject(j, "program", prog.text);
    report_json(j);
  } else if (!o->output) {
    fputs(prog.text, stdout);
  } else {
    printf("wrote %s: %s's %s, %lld params, mesh %s (%lld devices)\n", o->output, prog.stdlib_file, prog.model,
           (long long)prog.params, prog.mesh, (long long)prog.devices);
  }
done:
  if (c.root) hf_config_free(&c);
  arena_free(&arena);
  return rc;
}
