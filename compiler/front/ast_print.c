/* ast_print.c: the stable text form of a syntax tree (`shardc parse`, golden tests).
 *
 * Format: one node per line, children indented two spaces under their parent, closing parens at
 * the end of the last child's line (Lisp style):
 *
 *   (model mlp @3:1
 *     (param w_in @4:3
 *       (type bf16[] @4:16
 *         (tdim embed @4:21)
 *         (tdim hidden @4:28))))
 *
 * A line is `(KIND [WORD] @LINE:COL` where KIND is the node kind's name from ast.h and WORD, when
 * present, is the node's own datum: the declared name, key, dim, loop variable or member name as
 * written; a number as written (4_096 stays 4_096, a negative value keeps its '-'); a string in
 * double quotes (bytes below 0x20 shown as \xNN; strings cannot contain '"'); the operator of a
 * binary (add sub mul div matmul) or unary (neg) node; `train`/`serve` for a step (printed as the
 * KIND); a type's dtype or model name, followed by `[]` when it had brackets. LINE:COL is where
 * the node starts (1-based, COL in bytes).
 *
 * Children come in a fixed order: mesh: target name, axes; fn: args, return type, statements;
 * let: type (if any), value; for: iterable, statements; step: function, entries; call: callee,
 * args; binary and arrow: left, right; other nodes: their only child or their list in order. */
#include "ast.h"

static const char *const binop_names[] = {"add", "sub", "mul", "div", "matmul"};

static void print_string(FILE *f, const char *s) {
  fputc('"', f);
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p < 0x20 || *p == 0x7F) fprintf(f, "\\x%02x", *p);
    else fputc(*p, f);
  }
  fputc('"', f);
}

static void print_node(FILE *f, const Node *n, int indent);

static void print_list(FILE *f, const Node *n, int indent) {
  for (; n; n = n->next) {
    fputc('\n', f);
    print_node(f, n, indent);
  }
}

static void print_child(FILE *f, const Node *n, int indent) {
  if (!n) return;
  fputc('\n', f);
  print_node(f, n, indent);
}

static void print_node(FILE *f, const Node *n, int indent) {
  fprintf(f, "%*s(", indent, "");
  if (n->kind == N_STEP) fputs(n->flag == STEP_SERVE ? "serve" : "train", f);
  else fputs(ast_kind_name(n->kind), f);

  switch (n->kind) {
  case N_IMPORT:
  case N_STRING: fputc(' ', f); print_string(f, n->str ? n->str : ""); break;
  case N_NUM: fprintf(f, " %.*s", n->num.text_len, n->num.text ? n->num.text : "0"); break;
  case N_BINARY: fprintf(f, " %s", (unsigned)n->op < 5 ? binop_names[n->op] : "?"); break;
  case N_UNARY: fputs(" neg", f); break;
  case N_TYPE: fprintf(f, " %s%s", n->name, n->flag ? "[]" : ""); break;
  default:
    if (n->name) fprintf(f, " %s", n->name);
    break;
  }
  fprintf(f, " @%d:%d", n->loc.line, n->loc.col);

  int in = indent + 2;
  if (n->kind == N_FN) {
    print_list(f, n->items, in);
    print_child(f, n->type, in);
    print_list(f, n->body, in);
  } else {
    print_child(f, n->target, in);
    print_child(f, n->type, in);
    print_child(f, n->value, in);
    print_child(f, n->lhs, in);
    print_child(f, n->rhs, in);
    print_list(f, n->items, in);
    print_list(f, n->kvs, in);
    print_list(f, n->body, in);
  }
  fputc(')', f);
}

void ast_print(FILE *out, const Ast *ast) {
  for (const Node *d = ast->decls; d; d = d->next) {
    print_node(out, d, 0);
    fputc('\n', out);
  }
}
