/* cmd_report.c: `shardc report FILE -o report.html`: one self-contained HTML page.
 *
 * Runs check, sim and explain (and explain --show for each param) in this process with --format json (report_capture takes their objects
 * instead of printing them), sim with a trace into a temporary file, and hands the three objects to
 * html_report_write; the page is written as every output is (outfile.h). A program with errors:
 * check runs again in text form so the diagnostics print as always (exit 1). A program that does
 * not fit still gets its page (check's exit 1 without errors), as sim warns and goes on. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "driver.h"
#include "html_report.h"
#include "outfile.h"
#include "report.h"

/* One command, its JSON object captured. Returns the command's exit code. */
static int captured(int (*fn)(const Options *), const Options *o, cJSON **obj) {
  diag_reset();
  report_begin(o);
  report_capture(obj);
  int rc = report_end(o, fn(o));
  report_capture(NULL);
  return rc;
}

static cJSON *read_json(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  char *buf = NULL;
  size_t len = 0;
  FILE *m = open_memstream(&buf, &len);
  char chunk[65536];
  size_t k;
  while (m && (k = fread(chunk, 1, sizeof chunk, f)) > 0) fwrite(chunk, 1, k, m);
  fclose(f);
  if (!m) return NULL;
  fclose(m);
  cJSON *j = cJSON_ParseWithLength(buf, len);
  free(buf);
  return j;
}

int cmd_report(const Options *o) {
  char err[700];
  if (!o->output) {
    fprintf(stderr, "shardc: report needs -o FILE (the HTML page)\n");
    return EXIT_USAGE;
  }
  if (o->format == FORMAT_JSON) {
    fprintf(stderr, "shardc: report writes HTML: --format json is for check, explain and sim\n");
    return EXIT_USAGE;
  }
  const char *one = o->trace ? "--trace" : o->show ? "--show" : o->emit_ir ? "--emit-ir" : o->emit_llvm ? "--emit-llvm" : NULL;
  if (one) {
    fprintf(stderr, "shardc: %s is not an option of report (see 'shardc --help')\n", one);
    return EXIT_USAGE;
  }
  Options q = *o;
  q.format = FORMAT_JSON;
  q.shardings = false;
  q.output = NULL;
  cJSON *check = NULL, *sim = NULL;
  int rc = captured(cmd_check, &q, &check);
  if (rc != EXIT_OK && cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(check, "errors")) > 0) {
    cJSON_Delete(check);
    diag_reset();
    return cmd_check(o); /* the diagnostics, as check prints them */
  }
  /* outfile_check after check: the program's files are noted as inputs by then */
  if (!outfile_check(o->output, err, sizeof err)) {
    cJSON_Delete(check);
    diag_error((SrcLoc){0}, "report: -o: %s", err);
    return EXIT_PROGRAM_ERROR;
  }
  const char *tmpdir = getenv("TMPDIR");
  char tpath[4096];
  snprintf(tpath, sizeof tpath, "%s/shardc-report-XXXXXX", tmpdir && *tmpdir ? tmpdir : "/tmp");
  int fd = mkstemp(tpath);
  if (fd < 0) {
    cJSON_Delete(check);
    diag_error((SrcLoc){0}, "report: cannot make a temporary file in %s", tmpdir && *tmpdir ? tmpdir : "/tmp");
    return EXIT_PROGRAM_ERROR;
  }
  close(fd);
  outfile_track(tpath, false);
  q.trace = tpath;
  int src = captured(cmd_sim, &q, &sim);
  cJSON *trace = src == EXIT_OK ? read_json(tpath) : NULL;
  unlink(tpath);
  outfile_untrack(tpath);
  if (src != EXIT_OK) { /* sim's errors (check passed): print them as diagnostics */
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(sim, "errors")) {
      const cJSON *f = cJSON_GetObjectItemCaseSensitive(e, "file"), *m = cJSON_GetObjectItemCaseSensitive(e, "message");
      fprintf(stderr, "%s: error: %s\n", cJSON_IsString(f) ? f->valuestring : o->input,
              cJSON_IsString(m) ? m->valuestring : "the program could not be simulated");
    }
    cJSON_Delete(check);
    cJSON_Delete(sim);
    return EXIT_PROGRAM_ERROR;
  }
  cJSON *explain = NULL, *shows = cJSON_CreateArray();
  int omitted = 0;
  if (captured(cmd_explain, &q, &explain) == EXIT_OK) {
    enum { MAX_GRIDS = 48 }; /* a page a browser opens at once */
    const cJSON *op;
    cJSON_ArrayForEach(op, cJSON_GetObjectItemCaseSensitive(explain, "ops")) {
      const cJSON *kind = cJSON_GetObjectItemCaseSensitive(op, "op"), *name = cJSON_GetObjectItemCaseSensitive(op, "name");
      if (!cJSON_IsString(kind) || strcmp(kind->valuestring, "param") != 0 || !cJSON_IsString(name)) continue;
      if (cJSON_GetArraySize(shows) >= MAX_GRIDS) {
        omitted++;
        continue;
      }
      Options s = q;
      s.show = name->valuestring;
      cJSON *g = NULL;
      if (captured(cmd_explain, &s, &g) == EXIT_OK && g) cJSON_AddItemToArray(shows, g);
      else cJSON_Delete(g);
    }
  }
  OutFile *out = outfile_open(o->output, OUTFILE_DATA, err, sizeof err);
  bool ok = out != NULL;
  if (ok) {
    html_report_write(outfile_stream(out), o->input, check, sim, explain, trace, shows, omitted);
    ok = outfile_commit(out, err, sizeof err);
  }
  cJSON_Delete(check);
  cJSON_Delete(sim);
  cJSON_Delete(trace);
  cJSON_Delete(explain);
  cJSON_Delete(shows);
  if (!ok) {
    diag_error((SrcLoc){0}, "report: -o: %s", err);
    return EXIT_PROGRAM_ERROR;
  }
  return EXIT_OK;
}
