/* cli_test.h: what the unit tests that run the built shardc share (include after unit_test.h and
 * <cjson/cJSON.h>). Header-only, each test being one program; every function is static inline so a
 * test that does not use one gets no warning.
 *
 *   cli_slurp(f)                  everything f gives until EOF (malloc'd, NUL-ended; NULL if no memory)
 *   cli_write(path, text)         text into path (a test's scratch file)
 *   cli_read(path)                path's text (malloc'd), NULL if it cannot be read
 *   cli_shardc(&rc, fmt, ...)     `SHARDC_BIN` followed by the formatted line, through the shell: its
 *                                 stdout (malloc'd), *rc the exit code (-1 if it did not exit); the
 *                                 line says where stderr goes
 *   cli_num(o, k), cli_str(o, k)  a JSON object's number (NAN) or string ("") member, o may be NULL */
#ifndef SHARDC_CLI_TEST_H
#define SHARDC_CLI_TEST_H

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <cjson/cJSON.h>

#ifndef SHARDC_BIN
#define SHARDC_BIN "shardc"
#endif

static inline char *cli_slurp(FILE *f) {
  size_t cap = 1 << 16, n = 0, got;
  char *buf = malloc(cap);
  if (!buf) return NULL;
  while ((got = fread(buf + n, 1, cap - n - 1, f)) > 0) {
    n += got;
    if (n + 1 >= cap) {
      char *b = realloc(buf, cap *= 2);
      if (!b) break;
      buf = b;
    }
  }
  buf[n] = 0;
  return buf;
}

static inline void cli_write(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  if (f) {
    fputs(text, f);
    fclose(f);
  }
}

static inline char *cli_read(const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) return NULL;
  char *s = cli_slurp(f);
  fclose(f);
  return s;
}

__attribute__((format(printf, 2, 3))) static inline char *cli_shardc(int *rc, const char *fmt, ...) {
  char line[2048];
  int n = snprintf(line, sizeof line, "'%s' ", SHARDC_BIN);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
  va_end(ap);
  *rc = -1;
  FILE *p = popen(line, "r");
  if (!p) return NULL;
  char *out = cli_slurp(p);
  int st = pclose(p);
  *rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return out;
}

static inline double cli_num(const cJSON *o, const char *k) {
  const cJSON *x = o ? cJSON_GetObjectItem(o, k) : NULL;
  return cJSON_IsNumber(x) ? x->valuedouble : NAN;
}

static inline const char *cli_str(const cJSON *o, const char *k) {
  const cJSON *x = o ? cJSON_GetObjectItem(o, k) : NULL;
  return cJSON_IsString(x) ? x->valuestring : "";
}

#endif
