/* suggest.c: "did you mean" (suggest.h). */
#include <stdio.h>
#include <string.h>

#include "suggest.h"

enum { SUGGEST_MAX_LEN = 64, SUGGEST_FAR = 1 << 20 };

static char fold(char c) { return c >= 'A' && c <= 'Z' ? (char)(c - 'A' + 'a') : c; }

int suggest_distance(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b);
  if (la > SUGGEST_MAX_LEN || lb > SUGGEST_MAX_LEN) return SUGGEST_FAR;
  /* Three rows of the DP table: i-2, i-1, i. */
  int rows[3][SUGGEST_MAX_LEN + 1];
  int *pp = rows[0], *prev = rows[1], *cur = rows[2];
  for (size_t j = 0; j <= lb; j++) prev[j] = (int)j;
  for (size_t i = 1; i <= la; i++) {
    cur[0] = (int)i;
    for (size_t j = 1; j <= lb; j++) {
      int cost = fold(a[i - 1]) != fold(b[j - 1]);
      int d = prev[j - 1] + cost;
      if (prev[j] + 1 < d) d = prev[j] + 1;
      if (cur[j - 1] + 1 < d) d = cur[j - 1] + 1;
      if (i > 1 && j > 1 && fold(a[i - 1]) == fold(b[j - 2]) && fold(a[i - 2]) == fold(b[j - 1]) &&
          pp[j - 2] + 1 < d)
        d = pp[j - 2] + 1;
      cur[j] = d;
    }
    int *t = pp;
    pp = prev, prev = cur, cur = t;
  }
  return prev[lb];
}

static int typo_limit(const char *want) { return strlen(want) <= 3 ? 1 : 2; }

bool suggest_is_typo(const char *want, const char *cand) {
  if (!want || !cand || strcmp(want, cand) == 0) return false;
  int d = suggest_distance(want, cand);
  return d <= typo_limit(want) && (size_t)d < strlen(want);
}

/* Bytes the two names share at their start. */
static size_t common_prefix(const char *a, const char *b) {
  size_t n = 0;
  while (a[n] && fold(a[n]) == fold(b[n])) n++;
  return n;
}

/* One name a prefix of the other (`tpu_v5`, `tpu_v5e`), or both sharing a start of at least 4
 * bytes that covers 2/3 of the shorter (`hbm_bandwidth`, `hbm_bw`). */
static bool prefix_match(const char *want, const char *cand) {
  size_t lw = strlen(want), lc = strlen(cand), shorter = lw < lc ? lw : lc, n = common_prefix(want, cand);
  if (n == shorter) return n >= 3 && lw != lc;
  return n >= 4 && 3 * n >= 2 * shorter;
}

Suggest suggest_begin(const char *want) { return (Suggest){want, NULL, SUGGEST_FAR}; }

/* Scores, lower is better: twice the edit count for a typo, one less when the typo is also a
 * prefix (`tpu_v5` is nearer `tpu_v5e` than `tpu_v4`); for a prefix match alone, 6 plus how many
 * bytes of the longer name the shared start leaves over (`hbm_bw` beats `hbm` for
 * `hbm_bandwidth`). */
void suggest_try(Suggest *s, const char *cand) {
  if (!s->want || !cand || !*cand || strcmp(s->want, cand) == 0) return;
  int score = SUGGEST_FAR;
  if (suggest_is_typo(s->want, cand)) {
    size_t lw = strlen(s->want), lc = strlen(cand);
    bool extends = common_prefix(s->want, cand) == (lw < lc ? lw : lc);
    score = 2 * suggest_distance(s->want, cand) - (extends ? 1 : 0);
  } else if (prefix_match(s->want, cand)) {
    size_t lw = strlen(s->want), lc = strlen(cand), longer = lw > lc ? lw : lc;
    size_t left = longer - common_prefix(s->want, cand);
    score = 6 + (left < 500 ? (int)left : 500);
  }
  if (score < s->score) {
    s->score = score;
    s->best = cand;
  }
}

const char *suggest_text(const Suggest *s, char *buf, size_t size) {
  if (size == 0) return buf;
  buf[0] = '\0';
  if (s->best) snprintf(buf, size, "; did you mean '%s'?", s->best);
  return buf;
}
