/* stepset.c: --set key=value (see stepset.h). */
#include <stdio.h>
#include <string.h>

#include "diag.h"
#include "program.h"
#include "stepset.h"
#include "suggest.h"

static const char *const keys[] = {
#define X(e, s) s,
    STEP_KEYS(X)
#undef X
};

bool stepset_valid(const char *text, size_t *keylen, char *msg, size_t size) {
  size_t k = strspn(text, " \t");
  size_t n = strcspn(text + k, " \t=");
  const char *eq = strchr(text, '=');
  if (!eq || n == 0 || !eq[1 + strspn(eq + 1, " \t")]) {
    snprintf(msg, size, "bad --set '%s': expected KEY=VALUE, a train step key (--set remat=full)", text);
    return false;
  }
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
    if (strlen(keys[i]) == n && strncmp(keys[i], text + k, n) == 0) {
      *keylen = k + n;
      return true;
    }
  char key[80];
  snprintf(key, sizeof key, "%.*s", (int)(n < 64 ? n : 64), text + k);
  Suggest sg = suggest_begin(key);
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) suggest_try(&sg, keys[i]);
  char sb[160];
  snprintf(msg, size, "--set %s: not a train step key%s (the keys: loss, optimizer, master, remat, microbatches, "
                      "schedule, lr, zero, stage_layers, tp_overlap, dp_overlap, grad_reduce)", key,
           suggest_text(&sg, sb, sizeof sb));
  return false;
}

/* The parse's locations moved onto the user's text: the wrapper's second line is its first. */
static void relocate(Node *n, const Source *to) {
  for (; n; n = n->next) {
    if (n->loc.file) n->loc.file = to, n->loc.line--;
    if (n->name_loc.file) n->name_loc.file = to, n->name_loc.line--;
    relocate(n->type, to), relocate(n->value, to), relocate(n->target, to);
    relocate(n->lhs, to), relocate(n->rhs, to), relocate(n->items, to), relocate(n->kvs, to);
    relocate(n->body, to);
  }
}

/* The `key = value` node of one --set, located in a source named `--set` holding the text alone. */
static Node *set_node(Arena *arena, const char *text) {
  const char *wrapped = arena_printf(arena, "train set.key {\n%s\n}\n", text);
  Source *src = source_from_memory("--set", wrapped, strlen(wrapped));
  Source *own = source_from_memory("--set", text, strlen(text));
  if (!src || !own) return NULL;
  /* parsed quietly: the parser's complaints would show the wrapper; one located error says it */
  int before = diag_quiet_error_count();
  diag_push_quiet();
  Ast *ast = parse_source(arena, src);
  diag_pop_quiet();
  bool bad = diag_quiet_error_count() > before;
  Node *step = ast && !bad ? ast->decls : NULL;
  Node *kv = step && step->kind == N_STEP && !step->next ? step->kvs : NULL;
  if (!kv || kv->kind != N_KV || kv->next || strchr(text, '\n')) {
    diag_error((SrcLoc){.file = own, .line = 1, .col = 1, .len = (int)strcspn(text, "\n") + 1},
               "--set '%s': expected one KEY=VALUE, the value as a train block would hold it "
               "(a name, a number, interleaved(2), [4, 4])", text);
    return NULL;
  }
  relocate(kv, own);
  return kv;
}

int stepset_apply(Arena *arena, ParsedProgram *parsed, const char *const *sets, int nsets) {
  if (nsets == 0) return 0;
  Node **nodes = ARENA_ARRAY(arena, Node *, nsets);
  for (int i = 0; i < nsets; i++)
    if (!(nodes[i] = set_node(arena, sets[i]))) return 1;
  int steps = 0;
  for (int f = 0; f < parsed->nfiles; f++)
    for (Node *d = parsed->files[f] ? parsed->files[f]->decls : NULL; d; d = d->next) {
      if (d->kind != N_STEP || d->flag != STEP_TRAIN) continue;
      steps++;
      for (int i = 0; i < nsets; i++) { /* a copy per step: the list's links are the step's own */
        Node *kv = ARENA_NEW(arena, Node);
        *kv = *nodes[i];
        kv->next = NULL;
        Node **at = &d->kvs;
        while (*at && !((*at)->kind == N_KV && (*at)->name && strcmp((*at)->name, kv->name) == 0)) at = &(*at)->next;
        if (*at) kv->next = (*at)->next; /* the written key, replaced in place */
        *at = kv;
      }
    }
  if (steps == 0) {
    diag_usage("--set %s: the program has no train step for it to set", sets[0]);
    return 2;
  }
  return 0;
}
