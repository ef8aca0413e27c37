/* hf_config.c: reading a Hugging Face config.json with the places of its keys (hf_config.h).
 *
 * cJSON parses the file (a syntax error is reported where cJSON stopped); then one pass over the
 * text, which cJSON has just shown to be JSON, finds each top-level member's name and value, in
 * the order cJSON lists them, so every key carries its line and column. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "diag.h"
#include "hf_config.h"

/* ---- places in the text ---- */

typedef struct Scan {
  const Source *src;
  const char *p, *end;
  const char *line_start;
  int line;
} Scan;

static void scan_to(Scan *s, const char *to) {
  for (; s->p < to; s->p++)
    if (*s->p == '\n') s->line++, s->line_start = s->p + 1;
}

static SrcLoc scan_loc(const Scan *s, const char *from, const char *to) {
  size_t len = (size_t)(to - from);
  const char *nl = memchr(from, '\n', len);
  if (nl) len = (size_t)(nl - from);
  return (SrcLoc){s->src, s->line, (int)(from - s->line_start) + 1, len == 0 ? 1 : len > 1 << 20 ? 1 << 20 : (int)len};
}

static void scan_ws(Scan *s) {
  while (s->p < s->end && (*s->p == ' ' || *s->p == '\t' || *s->p == '\r' || *s->p == '\n')) scan_to(s, s->p + 1);
}

/* The end of the string starting at q (a '"'), after its closing quote. */
static const char *string_end(const char *q, const char *end) {
  for (q++; q < end && *q != '"'; q++)
    if (*q == '\\' && q + 1 < end) q++;
  return q < end ? q + 1 : end;
}

/* The end of the JSON value starting at q (valid JSON: cJSON said so). */
static const char *value_end(const char *q, const char *end) {
  if (q >= end) return end;
  if (*q == '"') return string_end(q, end);
  if (*q == '{' || *q == '[') {
    int depth = 0;
    for (; q < end; q++) {
      if (*q == '"') q = string_end(q, end) - 1;
      else if (*q == '{' || *q == '[') depth++;
      else if ((*q == '}' || *q == ']') && --depth == 0) return q + 1;
    }
    return end;
  }
  while (q < end && !strchr(",}] \t\r\n", *q)) q++;
  return q;
}

/* "line L, col C" of a byte, for cJSON's error position. */
static SrcLoc loc_of(const Source *src, const char *at) {
  Scan s = {src, src->text, src->text + src->len, src->text, 1};
  scan_to(&s, at);
  return scan_loc(&s, at, at + 1);
}

static bool find_places(HfConfig *c) {
  const Source *src = c->src;
  Scan s = {src, src->text, src->text + src->len, src->text, 1};
  scan_ws(&s);
  if (s.p >= s.end || *s.p != '{') return false;
  scan_to(&s, s.p + 1);
  int i = 0;
  for (const cJSON *item = c->root->child; item; item = item->next, i++) {
    scan_ws(&s);
    if (*s.p == ',') scan_to(&s, s.p + 1), scan_ws(&s);
    if (s.p >= s.end || *s.p != '"') return false;
    const char *ne = string_end(s.p, s.end);
    HfKey *k = &c->keys[i];
    k->name = item->string;
    k->value = item;
    k->name_loc = scan_loc(&s, s.p, ne);
    scan_to(&s, ne);
    scan_ws(&s);
    if (s.p >= s.end || *s.p != ':') return false;
    scan_to(&s, s.p + 1);
    scan_ws(&s);
    const char *ve = value_end(s.p, s.end);
    k->value_loc = scan_loc(&s, s.p, (*s.p == '{' || *s.p == '[') ? s.p + 1 : ve);
    scan_to(&s, ve);
  }
  return true;
}

/* ---- loading ---- */

static int by_name(const void *x, const void *y) {
  const HfKey *a = *(const HfKey *const *)x, *b = *(const HfKey *const *)y;
  int d = strcmp(a->name, b->name);
  return d ? d : a < b ? -1 : a > b;
}

SrcLoc hf_file_loc(const HfConfig *c) {
  size_t n = strcspn(c->src->text, "\n");
  return (SrcLoc){c->src, 1, 1, n == 0 ? 1 : n > 200 ? 200 : (int)n};
}

bool hf_config_load(HfConfig *c, Arena *a, const char *path) {
  memset(c, 0, sizeof *c);
  c->arena = a;
  Source *src = source_load(path);
  if (!src) {
    int e = errno;
    if (e == EFBIG)
      diag_error((SrcLoc){0}, "cannot read '%s': it is larger than %zu bytes, the most shardc reads (SHARDC_MAX_INPUT "
                              "sets another limit)", path, source_max_bytes());
    else diag_error((SrcLoc){0}, "cannot open '%s': %s", path, strerror(e));
    return false;
  }
  c->src = src;
  const char *nul = memchr(src->text, 0, src->len);
  if (nul) {
    diag_error(loc_of(src, nul), "unexpected NUL byte (a config.json is text)");
    return false;
  }
  /* The length counts the terminating NUL: cJSON's check that nothing follows the value wants it. */
  const char *end = NULL;
  c->root = cJSON_ParseWithLengthOpts(src->text, src->len + 1, &end, true);
  if (!c->root) {
    const char *at = end && end >= src->text && end <= src->text + src->len ? end : src->text;
    while (at < src->text + src->len && (*at == ' ' || *at == '\t' || *at == '\r' || *at == '\n')) at++;
    SrcLoc loc = loc_of(src, at);
    if (at >= src->text + src->len) diag_error(loc, "JSON syntax error: the file ends in the middle of a value");
    else if ((unsigned char)*at < 0x20 || (unsigned char)*at >= 0x7f)
      diag_error(loc, "JSON syntax error at byte 0x%02x", (unsigned char)*at);
    else diag_error(loc, "JSON syntax error at '%c'", *at);
    return false;
  }
  if (!cJSON_IsObject(c->root)) {
    diag_error(hf_file_loc(c), "a config.json holds one JSON object ({\"model_type\": ...}), found %s",
               cJSON_IsArray(c->root) ? "an array" : "a single value");
    return false;
  }
  c->nkeys = cJSON_GetArraySize(c->root);
  c->keys = ARENA_ARRAY(a, HfKey, c->nkeys + 1);
  if (!find_places(c)) { /* cannot happen for JSON cJSON accepted; never index past what was found */
    diag_error(hf_file_loc(c), "cannot locate the keys of this JSON object");
    return false;
  }
  /* A key given twice: cJSON would read the first, Python's json (Hugging Face's) the last. The
   * keys sorted by name (then place), so that a file of many keys costs n log n, not n^2. */
  bool ok = true;
  const HfKey **sorted = ARENA_ARRAY(a, const HfKey *, c->nkeys + 1);
  for (int i = 0; i < c->nkeys; i++) sorted[i] = &c->keys[i];
  qsort(sorted, (size_t)c->nkeys, sizeof *sorted, by_name);
  for (int i = 1; i < c->nkeys; i++)
    if (strcmp(sorted[i]->name, sorted[i - 1]->name) == 0) {
      const HfKey *first = sorted[i - 1];
      while (i < c->nkeys && strcmp(sorted[i]->name, first->name) == 0) {
        diag_error(sorted[i]->name_loc, "key \"%s\" is given twice (first at line %d); Python's json reads the last, "
                   "so say it once", sorted[i]->name, first->name_loc.line);
        i++;
      }
      ok = false;
    }
  return ok;
}

void hf_config_free(HfConfig *c) {
  cJSON_Delete(c->root);
  c->root = NULL;
}

/* ---- keys ---- */

HfKey *hf_key(HfConfig *c, const char *name) {
  for (int i = 0; i < c->nkeys; i++)
    if (strcmp(c->keys[i].name, name) == 0) return &c->keys[i];
  return NULL;
}

bool hf_has(HfConfig *c, const char *name) {
  HfKey *k = hf_key(c, name);
  return k && !cJSON_IsNull(k->value);
}

const char *hf_value_text(HfConfig *c, const cJSON *v) {
  char *s = cJSON_PrintUnformatted(v);
  if (!s) return "?";
  size_t n = strlen(s);
  const char *r = n > 60 ? arena_printf(c->arena, "%.56s ...", s) : arena_strndup(c->arena, s, n);
  cJSON_free(s);
  return r;
}

/* The key to read, marked read; NULL when missing or null. */
static void asked(HfConfig *c, const char *name) {
  for (int i = 0; i < c->asked.len; i++)
    if (strcmp(c->asked.data[i], name) == 0) return;
  VEC_PUSH(c->arena, c->asked, name);
}

static HfKey *take(HfConfig *c, const char *name) {
  asked(c, name);
  HfKey *k = hf_key(c, name);
  if (!k) return NULL;
  k->state = HF_READ;
  return cJSON_IsNull(k->value) ? NULL : k;
}

static void missing(HfConfig *c, const char *name, const char *model_type, bool *ok) {
  diag_error(hf_file_loc(c), "%s has no \"%s\" (a model_type \"%s\" config needs it)", c->src->path, name, model_type);
  *ok = false;
}

#define HF_INT_MAX ((int64_t)1 << 50)

int64_t hf_int(HfConfig *c, const char *name, int64_t dflt, const char *model_type, bool *ok) {
  HfKey *k = take(c, name);
  if (!k) {
    if (dflt == HF_REQUIRED) {
      missing(c, name, model_type, ok);
      return 1;
    }
    return dflt;
  }
  double v = k->value->valuedouble;
  if (!cJSON_IsNumber(k->value) || v != floor(v) || v < 1 || v > (double)HF_INT_MAX) {
    diag_error(k->value_loc, "\"%s\" is %s: expected a whole number from 1 to 2^50", name, hf_value_text(c, k->value));
    *ok = false;
    return 1;
  }
  return (int64_t)v;
}

double hf_num(HfConfig *c, const char *name, double dflt, bool *ok) {
  HfKey *k = take(c, name);
  if (!k) return dflt;
  if (!cJSON_IsNumber(k->value) || !isfinite(k->value->valuedouble)) {
    diag_error(k->value_loc, "\"%s\" is %s: expected a number", name, hf_value_text(c, k->value));
    *ok = false;
    return dflt;
  }
  return k->value->valuedouble;
}

bool hf_bool(HfConfig *c, const char *name, bool dflt, bool *ok) {
  HfKey *k = take(c, name);
  if (!k) return dflt;
  if (!cJSON_IsBool(k->value)) {
    diag_error(k->value_loc, "\"%s\" is %s: expected true or false", name, hf_value_text(c, k->value));
    *ok = false;
    return dflt;
  }
  return cJSON_IsTrue(k->value);
}

const char *hf_str(HfConfig *c, const char *name, const char *dflt, bool *ok) {
  HfKey *k = take(c, name);
  if (!k) return dflt;
  if (!cJSON_IsString(k->value)) {
    diag_error(k->value_loc, "\"%s\" is %s: expected a string", name, hf_value_text(c, k->value));
    *ok = false;
    return dflt;
  }
  return arena_strndup(c->arena, k->value->valuestring, strlen(k->value->valuestring));
}

bool hf_empty_list(HfConfig *c, const char *name, bool *ok) {
  HfKey *k = take(c, name);
  if (!k) return true;
  if (!cJSON_IsArray(k->value)) {
    diag_error(k->value_loc, "\"%s\" is %s: expected a list", name, hf_value_text(c, k->value));
    *ok = false;
    return true;
  }
  return cJSON_GetArraySize(k->value) == 0;
}

void hf_ignore(HfConfig *c, const char *name, const char *why) {
  asked(c, name);
  HfKey *k = hf_key(c, name);
  if (!k || k->state == HF_READ) return;
  k->state = HF_IGNORED;
  k->why = why;
}
