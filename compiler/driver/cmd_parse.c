/* cmd_parse.c: `shardc parse FILE`: the main file's syntax tree (not its imports'), in the stable
 * text form of ast_print.c, or with --format json as one object:
 *   {"file": F, "decls": [NODE, ...]}   NODE = {"kind", "word" (when the text form has one),
 *   "line", "col", "file", "children": [NODE, ...] (in the text form's order)}
 * After errors: the diagnostics (JSON: report.h's errors object) and exit 1. */
#include <stdio.h>

#include "driver.h"
#include "report.h"

static const char *const binop_names[] = {"add", "sub", "mul", "div", "matmul"};

static cJSON *node_json(const Node *n, const char *file);

static void add_list(cJSON *arr, const Node *n, const char *file) {
  for (; n; n = n->next) cJSON_AddItemToArray(arr, node_json(n, file));
}

static void add_child(cJSON *arr, const Node *n, const char *file) {
  if (n) cJSON_AddItemToArray(arr, node_json(n, file));
}

/* One node as ast_print prints it: its kind, its word, where it starts, its children in order. */
static cJSON *node_json(const Node *n, const char *file) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "kind", n->kind == N_STEP ? (n->flag == STEP_SERVE ? "serve" : "train") : ast_kind_name(n->kind));
  char num[64];
  switch (n->kind) {
  case N_IMPORT:
  case N_STRING: cJSON_AddStringToObject(o, "word", n->str ? n->str : ""); break;
  case N_NUM:
    snprintf(num, sizeof num, "%.*s", n->num.text_len, n->num.text ? n->num.text : "0");
    cJSON_AddStringToObject(o, "word", num);
    break;
  case N_BINARY: cJSON_AddStringToObject(o, "word", (unsigned)n->op < 5 ? binop_names[n->op] : "?"); break;
  case N_UNARY: cJSON_AddStringToObject(o, "word", "neg"); break;
  case N_TYPE:
    if (n->name) cJSON_AddStringToObject(o, "word", n->name);
    cJSON_AddBoolToObject(o, "brackets", n->flag != 0);
    break;
  default:
    if (n->name) cJSON_AddStringToObject(o, "word", n->name);
    break;
  }
  cJSON_AddNumberToObject(o, "line", n->loc.line);
  cJSON_AddNumberToObject(o, "col", n->loc.col);
  cJSON_AddStringToObject(o, "file", file);
  cJSON *ch = cJSON_AddArrayToObject(o, "children");
  if (n->kind == N_FN) {
    add_list(ch, n->items, file);
    add_child(ch, n->type, file);
    add_list(ch, n->body, file);
  } else {
    add_child(ch, n->target, file);
    add_child(ch, n->type, file);
    add_child(ch, n->value, file);
    add_child(ch, n->lhs, file);
    add_child(ch, n->rhs, file);
    add_list(ch, n->items, file);
    add_list(ch, n->kvs, file);
    add_list(ch, n->body, file);
  }
  return o;
}

int cmd_parse(const Options *o) {
  Arena arena;
  arena_init(&arena);
  ParsedProgram *prog = driver_load_program(o, &arena);
  int rc = EXIT_PROGRAM_ERROR;
  if (prog && diag_error_count() == 0) {
    const Ast *ast = prog->files[prog->nfiles - 1];
    if (o->format == FORMAT_JSON) {
      const char *file = ast->src ? ast->src->path : o->input;
      cJSON *j = cJSON_CreateObject();
      cJSON_AddStringToObject(j, "file", file);
      cJSON *decls = cJSON_AddArrayToObject(j, "decls");
      add_list(decls, ast->decls, file);
      report_json(j);
    } else {
      ast_print(stdout, ast);
    }
    rc = EXIT_OK;
  }
  arena_free(&arena);
  return rc;
}
