/* table.c: several --layout and --mesh values, one row each (see table.h). */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "memory.h"
#include "report.h"
#include "table.h"

/* The command's JSON object for one combination, from a child process; *rc its exit code. */
static cJSON *row_of(const Options *o, int (*cmd)(const Options *), const char *layout, const char *mesh, int *rc) {
  int fd[2];
  fflush(stdout), fflush(stderr);
  if (pipe(fd) != 0) return NULL;
  pid_t pid = fork();
  if (pid < 0) {
    close(fd[0]), close(fd[1]);
    return NULL;
  }
  if (pid == 0) {
    close(fd[0]);
    int null = open("/dev/null", O_WRONLY);
    if (dup2(fd[1], STDOUT_FILENO) < 0 || null < 0 || dup2(null, STDERR_FILENO) < 0) _exit(3);
    Options c = *o;
    c.layout = layout, c.mesh = mesh, c.format = FORMAT_JSON;
    c.layouts = c.meshes = NULL, c.nlayouts = c.nmeshes = 0;
    diag_configure(stderr, c.diag_format, false);
    report_begin(&c);
    int r = report_end(&c, cmd(&c));
    fflush(stdout);
    _exit(r);
  }
  close(fd[1]);
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap);
  for (ssize_t got; buf; n += (size_t)got) {
    if (n + 1 >= cap) {
      char *b = realloc(buf, cap *= 2);
      if (!b) break;
      buf = b;
    }
    got = read(fd[0], buf + n, cap - n - 1);
    if (got < 0 && errno == EINTR) got = 0;
    else if (got <= 0) break;
  }
  close(fd[0]);
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
  *rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  if (buf) buf[n] = 0;
  cJSON *j = buf ? cJSON_Parse(buf) : NULL;
  free(buf);
  if (!j && WIFSIGNALED(st)) {
    char msg[120];
    snprintf(msg, sizeof msg, "internal error: this row's process ended by signal %d (please report it)", WTERMSIG(st));
    j = cJSON_CreateObject();
    cJSON *e = cJSON_AddArrayToObject(j, "errors"), *one = cJSON_CreateObject();
    cJSON_AddStringToObject(one, "message", msg);
    cJSON_AddItemToArray(e, one);
  }
  return j;
}

static double num(const cJSON *o, const char *k) {
  const cJSON *x = o ? cJSON_GetObjectItem(o, k) : NULL;
  return cJSON_IsNumber(x) ? x->valuedouble : NAN;
}

/* ---- the text table ---- */

enum { MAX_COLS = 12 };
typedef struct Table {
  int ncols, nrows;
  const char *head[MAX_COLS];
  char **cell; /* nrows x ncols, malloc'd strings; a row's error in its column 2, the rest NULL */
  bool *error;
} Table;

static char *cell(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *cell(const char *fmt, ...) {
  char b[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(b, sizeof b, fmt, ap);
  va_end(ap);
  return strdup(b);
}

static char *bytes_cell(double b) {
  char s[32];
  if (!isfinite(b)) return strdup("-");
  memory_format_bytes(s, sizeof s, b);
  return strdup(s);
}

static char *seconds_cell(double s) {
  if (!isfinite(s)) return strdup("-");
  if (s == 0) return strdup("0");
  if (s >= 1) return cell("%.3g s", s);
  if (s >= 1e-3) return cell("%.3g ms", s * 1e3);
  return cell("%.3g us", s * 1e6);
}

static const char *first_error(const cJSON *row, char *buf, size_t size) {
  const cJSON *e = cJSON_GetArrayItem(cJSON_GetObjectItem(row, "errors"), 0);
  const cJSON *f = cJSON_GetObjectItem(e, "file"), *m = cJSON_GetObjectItem(e, "message");
  const char *msg = cJSON_IsString(m) ? m->valuestring : "failed (no message)";
  if (cJSON_IsString(f)) snprintf(buf, size, "error: %s:%g:%g: %s", f->valuestring, num(e, "line"), num(e, "col"), msg);
  else snprintf(buf, size, "error: %s", msg);
  return buf;
}

/* The columns after layout and mesh, by command. */
static int fill(const char *command, const cJSON *j, char **c, const char **head) {
  const cJSON *mem = cJSON_GetObjectItem(j, "memory"), *pd = cJSON_GetObjectItem(mem, "per_device");
  const cJSON *fits = cJSON_GetObjectItem(mem ? mem : j, "fits");
  if (!fits) fits = cJSON_GetObjectItem(j, "fits");
  const char *fit = cJSON_IsBool(fits) ? (cJSON_IsTrue(fits) ? "yes" : "NO") : "-";
  int n = 0;
  if (strcmp(command, "check") == 0) {
    const char *cls[] = {"params", "grads", "optimizer", "activations", "temporaries", "total"};
    head[n] = "devices", c[n++] = cell("%g", num(j, "devices"));
    for (int i = 0; i < 6; i++) head[n] = cls[i], c[n++] = bytes_cell(num(pd, cls[i]));
    head[n] = "of HBM", c[n++] = bytes_cell(num(mem, "capacity"));
    head[n] = "fits", c[n++] = strdup(fit);
  } else if (strcmp(command, "explain") == 0) {
    const cJSON *sum = cJSON_GetObjectItem(j, "summary"), *bk = cJSON_GetObjectItem(sum, "by_kind");
    double count = 0, bytes = 0;
    char kinds[200] = "";
    static const struct { const char *key, *abbr; } K[] = {{"all_gather", "AG"}, {"reduce_scatter", "RS"},
        {"all_reduce", "AR"}, {"all_to_all", "A2A"}, {"collective_permute", "CP"}};
    for (size_t i = 0; i < sizeof K / sizeof K[0]; i++) {
      const cJSON *k = cJSON_GetObjectItem(bk, K[i].key);
      if (!k) continue;
      count += num(k, "count"), bytes += num(k, "bytes_per_device");
      size_t l = strlen(kinds);
      snprintf(kinds + l, sizeof kinds - l, "%s%s %g", l ? ", " : "", K[i].abbr, num(k, "count"));
    }
    head[n] = "devices", c[n++] = cell("%g", num(j, "devices"));
    head[n] = "collectives", c[n++] = cell("%g", count);
    head[n] = "by kind", c[n++] = strdup(*kinds ? kinds : "none");
    head[n] = "sent/device", c[n++] = bytes_cell(bytes);
    head[n] = "comm", c[n++] = seconds_cell(num(sum, "comm_s"));
    head[n] = "compute", c[n++] = seconds_cell(num(sum, "compute_s"));
    head[n] = "fits", c[n++] = strdup(fit);
  } else { /* sim */
    head[n] = "devices", c[n++] = cell("%g", num(j, "devices"));
    head[n] = "step", c[n++] = seconds_cell(num(j, "step_time_s"));
    head[n] = "compute", c[n++] = seconds_cell(num(j, "compute_s"));
    head[n] = "exposed comm", c[n++] = seconds_cell(num(j, "exposed_comm_s"));
    head[n] = "MFU", c[n++] = isfinite(num(j, "mfu")) ? cell("%.1f%%", 100 * num(j, "mfu")) : strdup("-");
    head[n] = "tokens/s", c[n++] = isfinite(num(j, "tokens_per_s")) ? cell("%.4g", num(j, "tokens_per_s")) : strdup("-");
    head[n] = "fits", c[n++] = strdup(fit);
  }
  return n;
}

static void print_table(FILE *out, Table *t) {
  int w[MAX_COLS] = {0};
  for (int k = 0; k < t->ncols; k++) w[k] = (int)strlen(t->head[k]);
  for (int r = 0; r < t->nrows; r++)
    for (int k = 0; k < (t->error[r] ? 2 : t->ncols); k++)
      if (t->cell[r * t->ncols + k] && (int)strlen(t->cell[r * t->ncols + k]) > w[k]) w[k] = (int)strlen(t->cell[r * t->ncols + k]);
  for (int k = 0; k < t->ncols; k++) /* (every row an error: the header stops at mesh) */
    if (k < 2 || t->head[k][0]) fprintf(out, k < 2 ? "%-*s" : "  %*s", k < 2 ? w[k] + 2 : w[k], t->head[k]);
  fputc('\n', out);
  for (int r = 0; r < t->nrows; r++) {
    char **c = t->cell + r * t->ncols;
    for (int k = 0; k < 2; k++) fprintf(out, "%-*s", w[k] + 2, c[k]);
    if (t->error[r]) fprintf(out, "%s", c[2]);
    else
      for (int k = 2; k < t->ncols; k++) fprintf(out, "  %*s", w[k], c[k] ? c[k] : "");
    fputc('\n', out);
  }
}

int table_run(const Options *o, int (*cmd)(const Options *)) {
  const char *none[1] = {NULL};
  const char *const *ls = o->nlayouts ? o->layouts : none, *const *ms = o->nmeshes ? o->meshes : none;
  int nl = o->nlayouts ? o->nlayouts : 1, nm = o->nmeshes ? o->nmeshes : 1;
  int worst = 0;
  cJSON *rows = cJSON_CreateArray();
  Table t = {.nrows = nl * nm, .ncols = 2};
  t.cell = calloc((size_t)t.nrows * MAX_COLS, sizeof(char *));
  t.error = calloc((size_t)t.nrows, sizeof(bool));
  if (!rows || !t.cell || !t.error) {
    fprintf(stderr, "shardc: out of memory for the table\n");
    return EXIT_PROGRAM_ERROR;
  }
  for (int i = 0; i < nl; i++)
    for (int k = 0; k < nm; k++) {
      int r = i * nm + k, rc = 0;
      cJSON *j = row_of(o, cmd, ls[i], ms[k], &rc);
      if (!j) {
        j = cJSON_CreateObject();
        cJSON *e = cJSON_AddArrayToObject(j, "errors"), *one = cJSON_CreateObject();
        cJSON_AddStringToObject(one, "message", "internal error: this row gave no report (please report it)");
        cJSON_AddItemToArray(e, one);
        if (rc == 0) rc = EXIT_PROGRAM_ERROR;
      }
      if (rc < 0 || rc > worst) worst = rc < 0 ? EXIT_PROGRAM_ERROR : rc;
      cJSON_DeleteItemFromObject(j, "layout"), cJSON_DeleteItemFromObject(j, "mesh");
      if (ls[i]) cJSON_AddStringToObject(j, "layout", ls[i]);
      else cJSON_AddNullToObject(j, "layout");
      if (ms[k]) cJSON_AddStringToObject(j, "mesh", ms[k]);
      else cJSON_AddNullToObject(j, "mesh");
      if (o->nsets) { /* the step keys --set gave every row, as written: {"remat": "full"} */
        cJSON *set = cJSON_AddObjectToObject(j, "set");
        for (int q = 0; q < o->nsets; q++) {
          const char *kv = o->sets[q], *eq = strchr(kv, '=');
          size_t ks = strspn(kv, " \t"), ke = (size_t)(eq - kv), vs = strspn(eq + 1, " \t");
          while (ke > ks && (kv[ke - 1] == ' ' || kv[ke - 1] == '\t')) ke--;
          char key[64];
          snprintf(key, sizeof key, "%.*s", (int)(ke - ks), kv + ks);
          cJSON_DeleteItemFromObject(set, key);
          cJSON_AddStringToObject(set, key, eq + 1 + vs);
        }
      }
      char **c = t.cell + (size_t)r * MAX_COLS;
      c[0] = strdup(ls[i] ? ls[i] : "(first)"), c[1] = strdup(ms[k] ? ms[k] : "(first)");
      if (cJSON_GetObjectItem(j, "errors")) {
        char b[600];
        t.error[r] = true, c[2] = strdup(first_error(j, b, sizeof b));
      } else {
        int n = fill(o->command, j, c + 2, t.head + 2);
        if (n + 2 > t.ncols) t.ncols = n + 2;
      }
      cJSON_AddItemToArray(rows, j);
    }
  t.head[0] = "layout", t.head[1] = "mesh";
  if (t.ncols == 2) t.ncols = 3, t.head[2] = "";
  if (o->format == FORMAT_JSON) {
    cJSON *obj = cJSON_CreateObject();
    cJSON_AddItemToObject(obj, "rows", rows);
    report_json(obj);
  } else {
    /* the cells were filled MAX_COLS apart; print_table reads ncols apart */
    Table p = t;
    p.cell = calloc((size_t)t.nrows * (size_t)t.ncols, sizeof(char *));
    for (int r = 0; p.cell && r < t.nrows; r++)
      for (int k = 0; k < t.ncols; k++) p.cell[r * t.ncols + k] = t.cell[(size_t)r * MAX_COLS + k];
    if (p.cell) {
      printf("%s: %d rows (%d layout%s x %d mesh%s)\n", o->command, t.nrows, nl, nl == 1 ? "" : "s", nm, nm == 1 ? "" : "es");
      print_table(stdout, &p);
      int nofit = 0;
      for (int r = 0; r < t.nrows; r++) nofit += !t.error[r] && t.cell[(size_t)r * MAX_COLS + t.ncols - 1] &&
                                                 strcmp(t.cell[(size_t)r * MAX_COLS + t.ncols - 1], "NO") == 0;
      if (nofit && strcmp(o->command, "check") == 0)
        printf("%d row%s do%s not fit: `shardc check` on %s alone lists changes that would make it fit\n", nofit,
               nofit == 1 ? "" : "s", nofit == 1 ? "es" : "", nofit == 1 ? "it" : "one");
      /* what each row would have said on stderr, in short: its first warning */
      for (int r = 0; r < t.nrows; r++) {
        const cJSON *row = cJSON_GetArrayItem(rows, r), *w = cJSON_GetObjectItem(row, "warnings");
        int nw = cJSON_GetArraySize(w);
        if (nw == 0 || t.error[r]) continue;
        const cJSON *m = cJSON_GetObjectItem(cJSON_GetArrayItem(w, 0), "message");
        printf("%s on %s: %d warning%s (the row alone shows %s), the first: %s\n", t.cell[(size_t)r * MAX_COLS],
               t.cell[(size_t)r * MAX_COLS + 1], nw, nw == 1 ? "" : "s", nw == 1 ? "it" : "them",
               cJSON_IsString(m) ? m->valuestring : "?");
      }
    }
    free(p.cell);
    cJSON_Delete(rows);
  }
  for (int r = 0; r < t.nrows * MAX_COLS; r++) free(t.cell[r]);
  free(t.cell), free(t.error);
  return worst;
}
