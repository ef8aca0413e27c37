/* suggest.h: "did you mean" for names that are not declared.
 *
 * A name is close to another when it is a likely typo of it: at most 2 edits apart (1 for names of
 * up to 3 bytes), counting an insertion, a deletion, a substitution or a swap of two neighbours as
 * one edit and ignoring case; or when one is a prefix of the other (`tpu_v5` for `tpu_v5e`, `lay`
 * for `layers`), the shorter being at least 3 bytes; or when they share a start of at least 4 bytes
 * covering 2/3 of the shorter (`hbm_bandwidth` for `hbm_bw`). Among close candidates the fewest
 * edits win (a typo that is also a prefix first: `tpu_v5` suggests `tpu_v5e`, not `tpu_v4`), then
 * the prefix match leaving the fewest bytes unshared, then the first tried: suggestions are
 * deterministic.
 *
 *   Suggest s = suggest_begin(name);
 *   for (...) suggest_try(&s, candidate);
 *   diag_error(loc, "unknown dim '%s'%s", name, suggest_text(&s, buf, sizeof buf));
 */
#ifndef SHARDC_SUGGEST_H
#define SHARDC_SUGGEST_H

#include <stdbool.h>
#include <stddef.h>

typedef struct Suggest {
  const char *want;  /* the unknown name */
  const char *best;  /* the closest candidate so far, or NULL */
  int score;         /* its rank (suggest_try); lower is better */
} Suggest;

/* A search that finds nothing (suggest_try returns at once) when `want` is NULL: callers pass NULL
 * when the diagnostic will not be printed (diag_would_show), which keeps floods linear. */
Suggest suggest_begin(const char *want);
void suggest_try(Suggest *s, const char *candidate);
/* "; did you mean 'best'?", or "" when nothing is close. Returns buf. */
const char *suggest_text(const Suggest *s, char *buf, size_t size);

/* Edit distance (optimal string alignment: a swap of neighbours is one edit), ignoring case; names
 * longer than 64 bytes are not compared (a large number). */
int suggest_distance(const char *a, const char *b);
/* Is `cand` within typo distance of `want` (the edit rule above, not the prefix rule)? */
bool suggest_is_typo(const char *want, const char *cand);

#endif
