/* lower_rt.c: the runtime's interface as the lowering sees it, made from runtime/rt_api.def (the
 * one definition of the boundary; runtime/rt_api_check.c holds shardrt.h to the same table):
 *
 *   - every call of an entry point goes through lower_rt, which declares the function with the
 *     table's LLVM type and checks the arguments' number and kinds against it;
 *   - every struct the generated code builds has its LLVM type made from the table (natural
 *     alignment, as C lays it out; lower_rt_check_layouts compares every field's offset with the C
 *     compiler's), and constant ones are made from a C struct of the real type (the C compiler
 *     checks the names and types of what the lowering fills in) by lower_rt_const, which reads its
 *     fields by the table. A pointer in such a struct is a key: the host object (a DevGroups, a
 *     region's IrFunc, an arena array) that lower_rt_bind has tied to an LLVM value. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <llvm-c/Target.h>
#include <llvm-c/TargetMachine.h>

#include "diag.h"
#include "lower_int.h"

/* ---- the table ---- */

typedef struct FieldDef {
  const char *name;
  int kind;             /* RT_KIND_* */
  int n;                /* 0: one; else an array of n (a two-dim array flattened) */
  int sub;              /* RT_KIND_STRUCT: RTS_* */
  size_t offset, size;  /* the C offset; one element's size */
} FieldDef;

#define RT_STRUCT(S) static const FieldDef fields_##S[] = {
#define RT_END(S) };
#define RT_FIELD(S, f, t) {#f, RTK_##t, 0, -1, offsetof(S, f), sizeof(RTC_##t)},
#define RT_ARRAY(S, f, t, n) {#f, RTK_##t, n, -1, offsetof(S, f), sizeof(RTC_##t)},
#define RT_ARRAY2(S, f, t, n, m) {#f, RTK_##t, (n) * (m), -1, offsetof(S, f), sizeof(RTC_##t)},
#define RT_NEST(S, f, T) {#f, RT_KIND_STRUCT, 0, RTS_##T, offsetof(S, f), sizeof(T)},
#define RT_NESTS(S, f, T, n) {#f, RT_KIND_STRUCT, n, RTS_##T, offsetof(S, f), sizeof(T)},
#include "rt_api.def"

typedef struct StructDef {
  const char *name;
  const FieldDef *fields;
  int nfields;
  size_t size;
} StructDef;

static const StructDef structs[RTS__COUNT] = {
#define RT_STRUCT(S) [RTS_##S] = {#S, fields_##S, (int)(sizeof fields_##S / sizeof fields_##S[0]), sizeof(S)},
#include "rt_api.def"
};

typedef struct FnDef {
  const char *name;
  int ret;
  int nparams;
  int params[16];
} FnDef;

static const FnDef fns[RTFN__COUNT] = {
#define RT_FN(name, ret, ...)                                                                   \
  [RTFN_##name] = {#name, RTK_##ret, (int)(sizeof((int[]){RT_MAP(RT_KIND, __VA_ARGS__)}) / sizeof(int)), \
                   {RT_MAP(RT_KIND, __VA_ARGS__)}},
#include "rt_api.def"
};

/* ---- types ---- */

static LLVMTypeRef kind_type(Lower *L, int kind) {
  switch (kind) {
  case RT_KIND_VOID: return LLVMVoidTypeInContext(L->C);
  case RT_KIND_I8: return L->i8;
  case RT_KIND_I16: return L->i16;
  case RT_KIND_I32: return L->i32;
  case RT_KIND_I64: return L->i64;
  case RT_KIND_F32: return L->f32;
  case RT_KIND_F64: return L->f64;
  default: return L->ptr;
  }
}

LLVMTypeRef lower_rt_type(Lower *L, int s) {
  char name[64];
  snprintf(name, sizeof name, "%s", structs[s].name);
  LLVMTypeRef t = LLVMGetTypeByName2(L->C, name);
  if (t) return t;
  const StructDef *sd = &structs[s];
  LLVMTypeRef el[64];
  for (int i = 0; i < sd->nfields && i < 64; i++) {
    const FieldDef *f = &sd->fields[i];
    LLVMTypeRef e = f->kind == RT_KIND_STRUCT ? lower_rt_type(L, f->sub) : kind_type(L, f->kind);
    el[i] = f->n ? LLVMArrayType2(e, (uint64_t)f->n) : e;
  }
  t = LLVMStructCreateNamed(L->C, name);
  LLVMStructSetBody(t, el, (unsigned)sd->nfields, 0);
  return t;
}

LLVMValueRef lower_rt_field(Lower *L, int s, int field, LLVMValueRef p) {
  return LLVMBuildStructGEP2(L->B, lower_rt_type(L, s), p, (unsigned)field, "");
}

/* ---- calls ---- */

static bool kind_matches(Lower *L, int kind, LLVMValueRef v) {
  LLVMTypeRef t = LLVMTypeOf(v);
  return t == kind_type(L, kind);
}

LLVMValueRef lower_rt(Lower *L, int fn, LLVMValueRef *args, int n) {
  const FnDef *f = &fns[fn];
  LLVMTypeRef pt[16];
  for (int i = 0; i < f->nparams; i++) pt[i] = kind_type(L, f->params[i]);
  LLVMTypeRef ft = LLVMFunctionType(kind_type(L, f->ret), pt, (unsigned)f->nparams, 0);
  bool ok = n == f->nparams;
  for (int i = 0; ok && i < n; i++) ok = kind_matches(L, f->params[i], args[i]);
  if (!ok) { /* a lowering mistake: the call does not match rt_api.def */
    diag_error((SrcLoc){0}, "internal error: run: a call of %s that does not match runtime/rt_api.def (%d arguments, %d wanted)",
               f->name, n, f->nparams);
    L->failed = true;
    return f->ret == RT_KIND_VOID ? NULL : LLVMConstNull(kind_type(L, f->ret));
  }
  LLVMValueRef fv = LLVMGetNamedFunction(L->M, f->name);
  if (!fv) fv = LLVMAddFunction(L->M, f->name, ft);
  return LLVMBuildCall2(L->B, ft, fv, args, (unsigned)n, "");
}

/* ---- constants ---- */

void lower_rt_bind(Lower *L, const void *key, LLVMValueRef v) {
  Lowered *lw = L->lw;
  for (int i = 0; i < lw->nbound; i++)
    if (lw->bound[i].key == key) {
      lw->bound[i].value = v;
      return;
    }
  if (lw->nbound == lw->cap_bound) {
    int cap = lw->cap_bound ? 2 * lw->cap_bound : 64;
    LowerBinding *b = ARENA_ARRAY(&lw->arena, LowerBinding, cap);
    if (lw->nbound) memcpy(b, lw->bound, sizeof *b * (size_t)lw->nbound);
    lw->bound = b, lw->cap_bound = cap;
  }
  lw->bound[lw->nbound++] = (LowerBinding){key, v};
}

LLVMValueRef lower_rt_bound(Lower *L, const void *key) {
  for (int i = 0; i < L->lw->nbound; i++)
    if (L->lw->bound[i].key == key) return L->lw->bound[i].value;
  return NULL;
}

static LLVMValueRef scalar_const(Lower *L, int kind, const char *p) {
  switch (kind) {
  case RT_KIND_I8: return LLVMConstInt(L->i8, *(const uint8_t *)p, 0);
  case RT_KIND_I16: return LLVMConstInt(L->i16, *(const uint16_t *)p, 0);
  case RT_KIND_I32: return LLVMConstInt(L->i32, (unsigned long long)(int64_t) * (const int32_t *)p, 1);
  case RT_KIND_I64: return LLVMConstInt(L->i64, (unsigned long long)*(const int64_t *)p, 1);
  case RT_KIND_F32: return LLVMConstReal(L->f32, *(const float *)p);
  case RT_KIND_F64: return LLVMConstReal(L->f64, *(const double *)p);
  default: {
    const void *key;
    memcpy(&key, p, sizeof key);
    if (!key) return LLVMConstNull(L->ptr);
    LLVMValueRef v = lower_rt_bound(L, key);
    if (!v) {
      diag_error((SrcLoc){0}, "internal error: run: a host pointer in a constant of the runtime's (nothing bound to it)");
      L->failed = true;
      return LLVMConstNull(L->ptr);
    }
    return v;
  }
  }
}

static LLVMValueRef struct_const(Lower *L, int s, const char *c) {
  const StructDef *sd = &structs[s];
  LLVMValueRef el[64];
  for (int i = 0; i < sd->nfields && i < 64; i++) {
    const FieldDef *f = &sd->fields[i];
    int n = f->n ? f->n : 1;
    LLVMValueRef e[256];
    for (int k = 0; k < n && k < 256; k++) {
      const char *p = c + f->offset + (size_t)k * f->size;
      e[k] = f->kind == RT_KIND_STRUCT ? struct_const(L, f->sub, p) : scalar_const(L, f->kind, p);
    }
    LLVMTypeRef et = f->kind == RT_KIND_STRUCT ? lower_rt_type(L, f->sub) : kind_type(L, f->kind);
    el[i] = f->n ? LLVMConstArray2(et, e, (uint64_t)n) : e[0];
  }
  return LLVMConstNamedStruct(lower_rt_type(L, s), el, (unsigned)sd->nfields);
}

static LLVMValueRef global_const(Lower *L, LLVMTypeRef t, LLVMValueRef init, const char *name) {
  LLVMValueRef g = LLVMAddGlobal(L->M, t, name);
  LLVMSetInitializer(g, init);
  LLVMSetGlobalConstant(g, 1);
  LLVMSetLinkage(g, LLVMPrivateLinkage);
  return g;
}

LLVMValueRef lower_rt_const(Lower *L, int s, const void *c, const char *name) {
  return global_const(L, lower_rt_type(L, s), struct_const(L, s, c), name);
}

LLVMValueRef lower_rt_consts(Lower *L, int s, const void *c, int n, const char *name) {
  LLVMValueRef e[512], *el = n > 512 ? malloc(sizeof *el * (size_t)n) : e;
  for (int i = 0; i < n; i++) el[i] = struct_const(L, s, (const char *)c + (size_t)i * structs[s].size);
  LLVMValueRef g = global_const(L, LLVMArrayType2(lower_rt_type(L, s), (uint64_t)(n > 0 ? n : 1)),
                                n > 0 ? LLVMConstArray2(lower_rt_type(L, s), el, (uint64_t)n) : LLVMConstArray2(lower_rt_type(L, s), NULL, 0),
                                name);
  if (el != e) free(el);
  return g;
}

LLVMValueRef lower_rt_array(Lower *L, int kind, const void *v, int n, const char *name) {
  LLVMValueRef e[256], *el = n > 256 ? malloc(sizeof *el * (size_t)n) : e;
  size_t size = kind == RT_KIND_I8 ? 1 : kind == RT_KIND_I16 ? 2 : kind == RT_KIND_I32 || kind == RT_KIND_F32 ? 4 : 8;
  for (int i = 0; i < n; i++) el[i] = scalar_const(L, kind, (const char *)v + (size_t)i * size);
  LLVMTypeRef t = kind_type(L, kind);
  LLVMValueRef g = global_const(L, LLVMArrayType2(t, (uint64_t)(n > 0 ? n : 1)),
                                n > 0 ? LLVMConstArray2(t, el, (uint64_t)n) : LLVMConstArray2(t, (LLVMValueRef[]){LLVMConstNull(t)}, 1), name);
  if (el != e) free(el);
  return g;
}

/* ---- the device program's replica groups ---- */

LLVMValueRef lower_rt_groups(Lower *L, const DevGroups *g) {
  LLVMValueRef v = lower_rt_bound(L, g);
  if (v) return v;
  int ndev = L->m->dev ? L->m->dev->ndev : 1;
  lower_rt_bind(L, g->members, lower_rt_array(L, RT_KIND_I32, g->members, g->ngroups * g->size, "groups_members"));
  lower_rt_bind(L, g->group_of, lower_rt_array(L, RT_KIND_I32, g->group_of, ndev, "groups_of"));
  lower_rt_bind(L, g->rank_of, lower_rt_array(L, RT_KIND_I32, g->rank_of, ndev, "groups_rank"));
  lower_rt_bind(L, g->text, LLVMBuildGlobalStringPtr(L->B, g->text, "groups_text"));
  RtGroups c = {.naxes = g->naxes, .ngroups = g->ngroups, .size = g->size, .subset = g->subset, .members = g->members,
                .group_of = g->group_of, .rank_of = g->rank_of, .text = g->text};
  for (int k = 0; k < g->naxes; k++) c.axes[k] = g->axes[k];
  v = lower_rt_const(L, RTS_RtGroups, &c, "groups");
  lower_rt_bind(L, g, v);
  return v;
}

/* ---- the layouts, checked (tests) ---- */

bool lower_rt_check_layouts(char *err, size_t n) {
  LLVMInitializeNativeTarget();
  char *triple = LLVMGetDefaultTargetTriple(), *msg = NULL;
  LLVMTargetRef target;
  if (LLVMGetTargetFromTriple(triple, &target, &msg)) {
    snprintf(err, n, "no target for %s: %s", triple, msg ? msg : "?");
    LLVMDisposeMessage(msg);
    LLVMDisposeMessage(triple);
    return false;
  }
  LLVMTargetMachineRef tm = LLVMCreateTargetMachine(target, triple, "", "", LLVMCodeGenLevelNone, LLVMRelocDefault, LLVMCodeModelDefault);
  LLVMTargetDataRef td = LLVMCreateTargetDataLayout(tm);
  Lowered *lw = lower_new();
  Lower L = {.lw = lw, .C = lw->C, .M = lw->M};
  lower_types(&L);
  bool ok = true;
  err[0] = 0;
  for (int s = 0; s < RTS__COUNT && ok; s++) {
    LLVMTypeRef t = lower_rt_type(&L, s);
    if (LLVMABISizeOfType(td, t) != structs[s].size) {
      snprintf(err, n, "%s: LLVM's size %llu, C's %zu", structs[s].name, (unsigned long long)LLVMABISizeOfType(td, t), structs[s].size);
      ok = false;
    }
    for (int i = 0; i < structs[s].nfields && ok; i++)
      if (LLVMOffsetOfElement(td, t, (unsigned)i) != structs[s].fields[i].offset) {
        snprintf(err, n, "%s.%s: LLVM's offset %llu, C's %zu", structs[s].name, structs[s].fields[i].name,
                 (unsigned long long)LLVMOffsetOfElement(td, t, (unsigned)i), structs[s].fields[i].offset);
        ok = false;
      }
  }
  lower_free(lw);
  LLVMDisposeTargetData(td);
  LLVMDisposeTargetMachine(tm);
  LLVMDisposeMessage(triple);
  return ok;
}
