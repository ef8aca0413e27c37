/* suggest.c: "did you mean" (suggest.h). */
#include <stdio.h>
#include <string.h>

#include "suggest.h"

enum { SUGGEST_MAX_LEN = 64, SUGGEST_FAR = 1000 };

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

static bool prefix_match(const char *want, const char *cand) {
  size_t lw = strlen(want), lc = strlen(cand);
  size_t n = lw < lc ? lw : lc;
  return n >= 3 && lw != lc && strncmp(want, cand, n) == 0;
}

Suggest suggest_begin(const char *want) { return (Suggest){want, NULL, SUGGEST_FAR}; }

void suggest_try(Suggest *s, const char *cand) {
  if (!s->want || !cand || !*cand || strcmp(s->want, cand) == 0) return;
  int score = SUGGEST_FAR;
  if (suggest_is_typo(s->want, cand)) score = suggest_distance(s->want, cand);
  else if (prefix_match(s->want, cand)) score = 3;
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
