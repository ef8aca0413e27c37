/* validate.c: docs/validation.md's tables, from `shardc sim` against bench/validation/published.json.
 *
 * Usage (from the repository's root; `build/bench/validate` after a build):
 *   validate [--shardc PATH] [--doc PATH] [--check]
 * Runs `shardc sim --format json` on every program published.json names (the book's worked cases
 * with their arguments, the measured runs as they are), computes each row's prediction and its error
 * (shardc / published - 1), prints both tables, and rewrites them in the doc between the markers
 * `<!-- validate: book -->` / `<!-- validate: runs -->` and `<!-- validate: end -->`. With --check it
 * rewrites nothing and exits 1 when the doc's tables differ from what it computed (stale rows), or
 * when a row's error exceeds the tolerance published.json states for it.
 *
 * Like with like (docs/validation.md): Megatron-LM's TFLOP/s per GPU count the recomputed forward (4
 * passes), so a row compares step times, the paper's implied step F / (TFLOP/s x GPUs) with shardc's,
 * and shows shardc's rate as F / (shardc's step x GPUs); PaLM's row compares tokens per second (its
 * MFU follows from them). */
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

static const char *shardc = "build/shardc";

static char *slurp_file(FILE *f) {
  size_t cap = 1 << 16, n = 0, got;
  char *buf = malloc(cap);
  if (!buf) return NULL;
  while ((got = fread(buf + n, 1, cap - n - 1, f)) > 0) {
    n += got;
    if (n + 1 >= cap) {
      char *b = realloc(buf, cap *= 2);
      if (!b) {
        free(buf);
        return NULL;
      }
      buf = b;
    }
  }
  buf[n] = 0;
  return buf;
}

static char *read_path(const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) return NULL;
  char *s = slurp_file(f);
  fclose(f);
  return s;
}

static double num(const cJSON *o, const char *k) {
  const cJSON *x = o ? cJSON_GetObjectItem(o, k) : NULL;
  return cJSON_IsNumber(x) ? x->valuedouble : NAN;
}

static const char *str(const cJSON *o, const char *k) {
  const cJSON *x = o ? cJSON_GetObjectItem(o, k) : NULL;
  return cJSON_IsString(x) ? x->valuestring : "";
}

/* `shardc sim PROGRAM ARGS --format json`, parsed; NULL on failure. */
static cJSON *sim(const char *program, const char *args) {
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "'%s' sim '%s' %s --format json 2>/dev/null", shardc, program, args ? args : "");
  FILE *p = popen(cmd, "r");
  if (!p) return NULL;
  char *out = slurp_file(p);
  int rc = pclose(p);
  cJSON *j = out && rc == 0 ? cJSON_Parse(out) : NULL;
  free(out);
  if (!j) fprintf(stderr, "validate: `%s` failed\n", cmd);
  return j;
}

/* Narayanan et al. (2021), eq. (3): FLOPs per iteration with full recomputation (4 passes). */
static double narayanan_flops(double b, double s, double l, double h, double v) {
  return 96 * b * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h));
}

/* ---- formatting ---- */

static void fmt_time(char *buf, size_t n, double s) {
  if (s >= 86400 * 2) snprintf(buf, n, "%.1f days", s / 86400);
  else if (s >= 1) snprintf(buf, n, "%.4g s", s);
  else if (s >= 1e-3) snprintf(buf, n, "%.4g ms", s * 1e3);
  else snprintf(buf, n, "%.4g us", s * 1e6);
}

static void fmt_err(char *buf, size_t n, double e) {
  if (!isfinite(e)) snprintf(buf, n, "-");
  else snprintf(buf, n, "%+.1f%%", 100 * e);
}

typedef struct Out {
  char *s;
  size_t len, cap;
} Out;

static void out_add(Out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void out_add(Out *o, const char *fmt, ...) {
  va_list ap;
  for (;;) {
    va_start(ap, fmt);
    int n = vsnprintf(o->s ? o->s + o->len : NULL, o->s ? o->cap - o->len : 0, fmt, ap);
    va_end(ap);
    if (o->s && (size_t)n < o->cap - o->len) {
      o->len += (size_t)n;
      return;
    }
    size_t nc = o->cap ? o->cap * 2 : 4096;
    while (nc < o->len + (size_t)n + 1) nc *= 2;
    o->s = realloc(o->s, nc);
    if (!o->s) abort();
    o->cap = nc;
  }
}

static int failures;

static void over(const char *id, double err, double tol) {
  if (isfinite(err) && isfinite(tol) && fabs(err) > tol) {
    fprintf(stderr, "validate: %s: error %+.1f%% is beyond the stated %.0f%%\n", id, 100 * err, 100 * tol);
    failures++;
  }
  if (!isfinite(err)) {
    fprintf(stderr, "validate: %s: no prediction\n", id);
    failures++;
  }
}

/* ---- the book's cases ---- */

static void book_rows(const cJSON *pub, Out *o) {
  out_add(o, "| case | published | shardc | mode | error | stated bound | command |\n");
  out_add(o, "|---|---|---|---|---|---|---|\n");
  const cJSON *c;
  cJSON_ArrayForEach(c, cJSON_GetObjectItem(pub, "book_cases")) {
    const cJSON *s = cJSON_GetObjectItem(c, "sim");
    if (!s) continue;
    const char *id = str(c, "id"), *meas = str(s, "measure"), *args = str(s, "args");
    cJSON *j = sim(str(s, "program"), args);
    double got = NAN, want = NAN;
    char pb[64], sb[64], eb[32], cmd[400];
    if (strcmp(meas, "step_time_s") == 0) {
      want = num(c, "published_s");
      got = num(j, "step_time_s");
      fmt_time(pb, sizeof pb, want);
      fmt_time(sb, sizeof sb, got);
    } else if (strcmp(meas, "bus_bandwidth") == 0) {
      /* the slowest collective is the AllReduce: bus bandwidth 2 V (N - 1) / (N T) */
      const cJSON *cs = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "slowest_collectives"), 0);
      double v = num(c, "array_bytes"), n = num(c, "group"), t = num(cs, "time_s");
      want = num(c, "published_bus_bandwidth");
      got = 2 * v * (n - 1) / (n * t);
      snprintf(pb, sizeof pb, "%.0f GB/s", want / 1e9);
      snprintf(sb, sizeof sb, "%.1f GB/s", got / 1e9);
    } else if (strcmp(meas, "train_days") == 0) {
      want = num(c, "published_days");
      got = num(cJSON_GetObjectItem(j, "train"), "days");
      snprintf(pb, sizeof pb, "%.0f days", want);
      snprintf(sb, sizeof sb, "%.1f days", got);
    }
    double err = got / want - 1, tol = num(s, "tolerance");
    over(id, err, tol);
    fmt_err(eb, sizeof eb, err);
    snprintf(cmd, sizeof cmd, "`shardc sim %s%s%s`", str(s, "program"), args[0] ? " " : "", args);
    bool ideal = strstr(args, "--ideal") != NULL;
    out_add(o, "| %s | %s | %s | %s | %s | %.0f%% | %s |\n", str(c, "what"), pb, sb, ideal ? "ideal" : "calibrated", eb,
            100 * tol, cmd);
    cJSON_Delete(j);
  }
}

/* ---- the measured runs ---- */

static void run_rows(const cJSON *pub, Out *o) {
  out_add(o, "| run | devices | published | step (derived) | shardc step | shardc rate | error (step) | stated bound | "
             "Calculon |\n");
  out_add(o, "|---|---|---|---|---|---|---|---|---|\n");
  const cJSON *r;
  cJSON_ArrayForEach(r, cJSON_GetObjectItem(pub, "runs")) {
    const char *id = str(r, "id"), *src = str(r, "source");
    cJSON *j = sim(str(r, "program"), "");
    double step = num(j, "step_time_s"), want = num(r, "derived_step_s"), tol = num(r, "tolerance");
    double err = step / want - 1;
    over(id, err, tol);
    char sb[64], eb[32], wb[64], pubtext[160], rate[160], dev[64];
    fmt_time(sb, sizeof sb, step);
    fmt_time(wb, sizeof wb, want);
    fmt_err(eb, sizeof eb, err);
    if (strcmp(src, "korthikanti2022") == 0) {
      double gpus = num(r, "gpus");
      double f = narayanan_flops(num(r, "batch"), num(r, "seq"), num(r, "layers"), num(r, "hidden"), num(r, "vocab"));
      double tf = f / (step * gpus) / 1e12;
      snprintf(pubtext, sizeof pubtext, "%.2f s per iteration", num(r, "published_step_s"));
      snprintf(rate, sizeof rate, "%.0f TFLOP/s per GPU (%.0f%%), MFU %.1f%%", tf, 100 * tf / 312, 100 * num(j, "mfu"));
      snprintf(dev, sizeof dev, "%.0f A100 (TP %.0f x PP %.0f)", gpus, num(r, "tensor"), num(r, "pipeline"));
      out_add(o, "| Korthikanti et al. GPT %s (hidden %.0f, %.0f layers, %.0f heads), batch %.0f, full recomputation | "
                 "%s | %s | %s | %s | %s | %s | %.0f%% | 2-5%% (as summarised; per row not recorded) |\n",
              str(r, "name"), num(r, "hidden"), num(r, "layers"), num(r, "heads"), num(r, "batch"), dev, pubtext, wb, sb,
              rate, eb, 100 * tol);
    } else if (strcmp(src, "narayanan2021") == 0) {
      double gpus = num(r, "gpus");
      double f = narayanan_flops(num(r, "batch"), num(r, "seq"), num(r, "layers"), num(r, "hidden"), num(r, "vocab"));
      double tf = f / (step * gpus) / 1e12;
      snprintf(pubtext, sizeof pubtext, "%.0f TFLOP/s per GPU (%.0f%%)", num(r, "published_tflops_per_gpu"),
               100 * num(r, "published_fraction_of_peak"));
      snprintf(rate, sizeof rate, "%.0f TFLOP/s per GPU (%.0f%%), MFU %.1f%%", tf, 100 * tf / 312, 100 * num(j, "mfu"));
      snprintf(dev, sizeof dev, "%.0f A100 (TP %.0f x PP %.0f x DP %.0f)", gpus, num(r, "tensor"), num(r, "pipeline"),
               num(r, "data"));
      out_add(o, "| Megatron-LM GPT %.4gB (hidden %.0f, %.0f layers, %.0f heads), batch %.0f | %s | %s | %s | %s | %s | "
                 "%s | %.0f%% | not published |\n",
              num(r, "params_billion"), num(r, "hidden"), num(r, "layers"), num(r, "heads"), num(r, "batch"), dev, pubtext,
              wb, sb, rate, eb, 100 * tol);
    } else {
      snprintf(pubtext, sizeof pubtext, "%.1fk tokens/s, MFU %.1f%% (HFU %.1f%%)", num(r, "published_tokens_per_s") / 1e3,
               100 * num(r, "published_mfu"), 100 * num(r, "published_hfu"));
      snprintf(rate, sizeof rate, "%.1fk tokens/s, MFU %.1f%% (HFU %.1f%%)", num(j, "tokens_per_s") / 1e3,
               100 * num(j, "mfu"), 100 * num(j, "hfu"));
      out_add(o, "| PaLM 540B, batch %.0f x %.0f | %.0f TPU v4 (%.0f pods) | %s | %s | %s | %s | %s | %.0f%% | not published |\n",
              num(r, "batch"), num(r, "seq"), num(r, "chips"), num(r, "pods"), pubtext, wb, sb, rate, eb, 100 * tol);
    }
    cJSON_Delete(j);
  }
}

/* Replaces the text between `<!-- validate: NAME -->\n` and `<!-- validate: end -->` in doc. */
static char *splice(const char *doc, const char *name, const char *table, bool *changed) {
  char begin[64];
  snprintf(begin, sizeof begin, "<!-- validate: %s -->\n", name);
  const char *b = strstr(doc, begin);
  const char *e = b ? strstr(b, "<!-- validate: end -->") : NULL;
  if (!b || !e) {
    fprintf(stderr, "validate: the doc has no '%s' ... '<!-- validate: end -->' markers\n", begin);
    failures++;
    return strdup(doc);
  }
  b += strlen(begin);
  size_t tl = strlen(table);
  if ((size_t)(e - b) != tl || memcmp(b, table, tl) != 0) *changed = true;
  size_t n = (size_t)(b - doc) + tl + strlen(e) + 1;
  char *out = malloc(n);
  if (!out) abort();
  snprintf(out, n, "%.*s%s%s", (int)(b - doc), doc, table, e);
  return out;
}

int main(int argc, char **argv) {
  const char *doc_path = "docs/validation.md", *pub_path = "bench/validation/published.json";
  bool check = false;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--shardc") == 0 && i + 1 < argc) shardc = argv[++i];
    else if (strcmp(argv[i], "--doc") == 0 && i + 1 < argc) doc_path = argv[++i];
    else if (strcmp(argv[i], "--check") == 0) check = true;
    else {
      fprintf(stderr, "usage: validate [--shardc PATH] [--doc PATH] [--check]   (from the repository's root)\n");
      return 2;
    }
  }
  char *ptext = read_path(pub_path);
  cJSON *pub = ptext ? cJSON_Parse(ptext) : NULL;
  free(ptext);
  if (!pub) {
    fprintf(stderr, "validate: cannot read %s (run from the repository's root)\n", pub_path);
    return 2;
  }
  Out book = {0}, runs = {0};
  book_rows(pub, &book);
  run_rows(pub, &runs);
  cJSON_Delete(pub);
  fputs(book.s, stdout);
  fputc('\n', stdout);
  fputs(runs.s, stdout);
  char *doc = read_path(doc_path);
  if (!doc) {
    fprintf(stderr, "validate: cannot read %s\n", doc_path);
    return 2;
  }
  bool changed = false;
  char *d1 = splice(doc, "book", book.s, &changed);
  char *d2 = splice(d1, "runs", runs.s, &changed);
  if (check) {
    if (changed) {
      fprintf(stderr, "validate: %s is stale: run build/bench/validate from the repository's root\n", doc_path);
      failures++;
    }
  } else if (changed) {
    FILE *f = fopen(doc_path, "w");
    if (!f || fputs(d2, f) == EOF || fclose(f) != 0) {
      fprintf(stderr, "validate: cannot write %s\n", doc_path);
      return 2;
    }
    fprintf(stderr, "validate: rewrote the tables of %s\n", doc_path);
  }
  free(doc);
  free(d1);
  free(d2);
  free(book.s);
  free(runs.s);
  return failures ? 1 : 0;
}
