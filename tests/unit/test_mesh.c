/* test_mesh.c: forming meshes on targets (compiler/mesh.c through sema_program).
 *
 * Each case parses a small program that declares its own targets (the figures of
 * hardware-and-costs.md, so the test does not depend on stdlib/targets.shard) and meshes, runs the
 * declaration checker, and compares every axis's placement with what language.md's forming rules
 * say: GPU minor axes fill the NVLink domain; TPU axes fill the torus dims minor-first; beyond one
 * slice the major axes count whole slices over DCN. Unformable meshes must be errors naming why.
 * Prints PASS/FAIL per case and "N passed, N failed"; exits 1 on any failure. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "diag.h"
#include "parse.h"
#include "program.h"
#include "unit_test.h"

static void check_int(const char *what, long long got, long long want) {
  if (got == want) return;
  ut_fail("%s: got %lld, want %lld", what, got, want);
}

static void check_num(const char *what, double got, double want) {
  if (got == want) return;
  ut_fail("%s: got %g, want %g", what, got, want);
}

/* The targets of hardware-and-costs.md (only the figures mesh forming reads matter here). */
static const char *const TARGETS =
    "target v5e { kind = tpu  flops = { bf16 = 1.97e14 }  hbm = 16e9  hbm_bw = 8.1e11\n"
    "  ici_bw = 4.5e10  torus = [16, 16]  wrap_multiple = 16  hop_latency = 1e-6  dcn_bw = 3.125e9 }\n"
    "target v5p { kind = tpu  flops = { bf16 = 4.59e14 }  hbm = 96e9  hbm_bw = 2.8e12\n"
    "  ici_bw = 9e10  torus = [16, 20, 28]  wrap_multiple = 4  hop_latency = 1e-6  dcn_bw = 6.25e9 }\n"
    "target h100 { kind = gpu  flops = { bf16 = 9.9e14 }  hbm = 80e9  hbm_bw = 3.35e12\n"
    "  nvlink_bw = 4.5e11  node_size = 8  network_bw = 5e10  nvlink_latency = 1e-6  network_latency = 3e-6 }\n"
    "target small_v5e { base = v5e  hbm = 8e9 }\n";

/* ---- running the checker on a program text ---- */

static Arena arena;
static char *diag_text;
static size_t diag_len;

/* Parses TARGETS + text and checks it; diagnostics (machine form) end up in diag_text. */
static Program *check(const char *text) {
  static char buf[8192];
  snprintf(buf, sizeof buf, "%s%s", TARGETS, text);
  diag_reset();
  free(diag_text);
  diag_text = NULL;
  FILE *f = open_memstream(&diag_text, &diag_len);
  diag_configure(f, DIAG_MACHINE, false);
  Source *src = source_from_memory("test.shard", buf, strlen(buf));
  Ast *ast = parse_source(&arena, src);
  ParsedProgram pp = {&ast, 1};
  SemaOptions opt = {0};
  Program *p = sema_program(&arena, &pp, &opt);
  fclose(f);
  diag_configure(stderr, DIAG_TEXT, false);
  return p;
}

static const Mesh *mesh(const Program *p, const char *name) {
  const Mesh *m = program_find_mesh(p, intern_cstr(name));
  if (!m) ut_fail("no mesh '%s'", name);
  return m;
}

static const MeshAxis *axis(const Mesh *m, const char *name) {
  int i = m ? mesh_axis_index(m, intern_cstr(name)) : -1;
  if (i < 0) {
    ut_fail("no axis '%s'", name);
    return NULL;
  }
  return &m->axes[i];
}

/* One TPU ICI axis: its extents along the torus dims, torus_dims and wraparound. */
static void expect_ici(const Mesh *m, const char *name, int e0, int e1, int e2, int dims, bool wrap) {
  const MeshAxis *a = axis(m, name);
  if (!a) return;
  char what[64];
  int want[3] = {e0, e1, e2};
  for (int j = 0; j < 3; j++) {
    snprintf(what, sizeof what, "%s.torus_extent[%d]", name, j);
    check_int(what, a->torus_extent[j], want[j]);
  }
  snprintf(what, sizeof what, "%s.torus_dims", name);
  check_int(what, a->torus_dims, dims);
  snprintf(what, sizeof what, "%s.wraparound", name);
  check_int(what, a->wraparound, wrap);
  snprintf(what, sizeof what, "%s.link", name);
  check_int(what, a->link, LINK_ICI);
  snprintf(what, sizeof what, "%s.bw", name);
  check_num(what, a->bw, m->target->ici_bw);
  snprintf(what, sizeof what, "%s.latency", name);
  check_num(what, a->latency, m->target->hop_latency);
}

static void expect_gpu(const Mesh *m, const char *name, LinkKind link, int per_node, long long stride) {
  const MeshAxis *a = axis(m, name);
  if (!a) return;
  char what[64];
  snprintf(what, sizeof what, "%s.link", name);
  check_int(what, a->link, link);
  snprintf(what, sizeof what, "%s.per_node", name);
  check_int(what, a->per_node, per_node);
  snprintf(what, sizeof what, "%s.stride", name);
  check_int(what, a->stride, stride);
  snprintf(what, sizeof what, "%s.bw", name);
  check_num(what, a->bw, link == LINK_NVLINK ? m->target->nvlink_bw : m->target->network_bw);
  snprintf(what, sizeof what, "%s.latency", name);
  check_num(what, a->latency, link == LINK_NVLINK ? m->target->nvlink_latency : m->target->network_latency);
  snprintf(what, sizeof what, "%s.wraparound", name);
  check_int(what, a->wraparound, true);
}

static void expect_clean(void) {
  if (diag_error_count() == 0) return;
  ut_fail("unexpected errors:\n%s", diag_text ? diag_text : "");
}

/* The program has exactly one error, containing every fragment. */
static void expect_error(const char *frag1, const char *frag2) {
  check_int("errors", diag_error_count(), 1);
  const char *t = diag_text ? diag_text : "";
  if ((frag1 && !strstr(t, frag1)) || (frag2 && !strstr(t, frag2))) {
    ut_fail("the error should mention '%s' and '%s'; got:\n%s", frag1 ? frag1 : "", frag2 ? frag2 : "", t);
  }
}

/* ---- cases ---- */

static void test_v5e_full_slice(void) {
  ut_begin("v5e [data:16, model:16]: both axes close their rings, one torus dim each");
  const Program *p = check("mesh pod = v5e[data: 16, model: 16]\n");
  expect_clean();
  const Mesh *m = mesh(p, "pod");
  if (m) {
    check_int("devices", m->devices, 256);
    check_int("slices", m->slices, 1);
    expect_ici(m, "model", 16, 1, 1, 1, true);
    expect_ici(m, "data", 1, 16, 1, 1, true);
    check_int("data.stride", m->axes[0].stride, 16);
    check_int("model.stride", m->axes[1].stride, 1);
  }
  ut_end();
}

static void test_v5e_small(void) {
  ut_begin("v5e [data:4, model:2]: a 2x4 sub-slice, no wraparound");
  const Program *p = check("mesh pod = v5e[data: 4, model: 2]\n");
  expect_clean();
  const Mesh *m = mesh(p, "pod");
  if (m) {
    check_int("devices", m->devices, 8);
    expect_ici(m, "model", 2, 1, 1, 1, false);
    expect_ici(m, "data", 1, 4, 1, 1, false); /* each axis on its own torus dim: a 2x4 slice */
  }
  ut_end();
}

static void test_v5e_span(void) {
  ut_begin("v5e: an axis continuing onto the next torus dim spans two dims");
  const Program *p = check("mesh pod = v5e[data: 4, model: 8]\n mesh row = v5e[data: 32]\n");
  expect_clean();
  const Mesh *m = mesh(p, "pod");
  if (m) {
    expect_ici(m, "model", 8, 1, 1, 1, false);
    expect_ici(m, "data", 1, 4, 1, 1, false); /* its own torus dim: an 8x4 slice */
  }
  m = mesh(p, "row");
  if (m) expect_ici(m, "data", 16, 2, 1, 2, false); /* 16 wraps, 2 does not: no wraparound */
  ut_end();
}

static void test_v5p_3d(void) {
  ut_begin("v5p 3D torus: axes per torus dim, one spanning two dims, wraparound per multiple of 4");
  const Program *p = check("mesh full = v5p[data: 28, seq: 20, model: 16]\n"
                           "mesh cube = v5p[data: 4, model: 64]\n"
                           "mesh part = v5p[data: 2, model: 8]\n");
  expect_clean();
  const Mesh *m = mesh(p, "full");
  if (m) {
    check_int("full.devices", m->devices, 8960);
    expect_ici(m, "model", 16, 1, 1, 1, true);
    expect_ici(m, "seq", 1, 20, 1, 1, true);
    expect_ici(m, "data", 1, 1, 28, 1, true);
  }
  m = mesh(p, "cube");
  if (m) {
    expect_ici(m, "model", 16, 4, 1, 2, true); /* spans torus dims 0 and 1; 16 and 4 are multiples of 4 */
    expect_ici(m, "data", 1, 1, 4, 1, true); /* the fresh torus dim 2 */
  }
  m = mesh(p, "part");
  if (m) {
    expect_ici(m, "model", 8, 1, 1, 1, true);
    expect_ici(m, "data", 1, 2, 1, 1, false); /* 2 along dim 1; 2 is not a multiple of 4 */
  }
  ut_end();
}

static void test_v5e_two_slices(void) {
  ut_begin("v5e two slices [dcn:2, data:16, model:16]: dcn rides DCN, the rest one full slice");
  const Program *p = check("mesh two = v5e[dcn: 2, data: 16, model: 16]\n");
  expect_clean();
  const Mesh *m = mesh(p, "two");
  if (m) {
    check_int("devices", m->devices, 512);
    check_int("slices", m->slices, 2);
    const MeshAxis *d = axis(m, "dcn");
    if (d) {
      check_int("dcn.link", d->link, LINK_DCN);
      check_num("dcn.bw", d->bw, 3.125e9);
      check_int("dcn.wraparound", d->wraparound, false);
      check_int("dcn.torus_dims", d->torus_dims, 0);
      check_int("dcn.stride", d->stride, 256);
    }
    expect_ici(m, "model", 16, 1, 1, 1, true);
    expect_ici(m, "data", 1, 16, 1, 1, true);
  }
  ut_end();
}

static void test_unformable(void) {
  ut_begin("v5e [data:512]: one axis larger than a slice would straddle ICI and DCN");
  check("mesh big = v5e[data: 512]\n");
  expect_error("axis 'data' (512) is larger than", "would straddle ICI and DCN");
  ut_end();

  ut_begin("v5e [data:3, model:128]: three 128-chip slices over DCN");
  const Program *p = check("mesh odd = v5e[data: 3, model: 128]\n");
  expect_clean();
  const Mesh *m = mesh(p, "odd");
  if (m) {
    check_int("odd.slices", m->slices, 3);
    const MeshAxis *d = axis(m, "data");
    if (d) check_int("odd.data.link", d->link, LINK_DCN);
    expect_ici(m, "model", 16, 8, 1, 2, false); /* 16 wraps, 8 does not */
  }
  ut_end();

  ut_begin("v5e [data:17]: a prime larger than any torus dim does not fit");
  check("mesh far = v5e[data: 17]\n");
  expect_error("axis 'data' (17)", "does not fit");
  ut_end();

  ut_begin("v5e [a:2, b:5, c:5, d:5]: no room left for 'b' beside 'c' and 'd' (5x5 on 16x16)");
  check("mesh wide = v5e[a: 2, b: 5, c: 5, d: 5]\n");
  expect_error("axis 'b' (5)", "does not fit");
  ut_end();
}

static void test_h100(void) {
  ut_begin("h100: minor axes fill the 8-GPU NVLink node, an axis may straddle nodes");
  const Program *p = check("mesh a = h100[data: 4, model: 8]\n"
                           "mesh b = h100[data: 2, model: 16]\n"
                           "mesh c = h100[x: 2, y: 2, z: 4]\n");
  expect_clean();
  const Mesh *m = mesh(p, "a");
  if (m) {
    check_int("a.devices", m->devices, 32);
    expect_gpu(m, "model", LINK_NVLINK, 8, 1);
    expect_gpu(m, "data", LINK_NETWORK, 1, 8);
  }
  m = mesh(p, "b");
  if (m) {
    expect_gpu(m, "model", LINK_NETWORK, 8, 1); /* 16 GPUs straddle two nodes of 8 */
    expect_gpu(m, "data", LINK_NETWORK, 1, 16);
  }
  m = mesh(p, "c");
  if (m) {
    expect_gpu(m, "z", LINK_NVLINK, 4, 1);
    expect_gpu(m, "y", LINK_NVLINK, 2, 4); /* stride 4 x size 2 = 8: still one node */
    expect_gpu(m, "x", LINK_NETWORK, 1, 8);
  }
  ut_end();
}

static void test_base_and_reform(void) {
  ut_begin("a target with `base`, and mesh_form on a changed copy");
  Program *p = check("mesh pod = small_v5e[data: 8, model: 16]\n");
  expect_clean();
  const Mesh *m = mesh(p, "pod");
  if (m) {
    check_num("hbm (overridden)", m->target->hbm, 8e9);
    check_num("ici_bw (inherited)", m->target->ici_bw, 4.5e10);
    expect_ici(m, "data", 1, 8, 1, 1, false);
    /* memory.c re-forms a changed copy: doubling `data` makes the full slice, so it wraps. */
    Mesh big = *m;
    big.axes[0].size *= 2;
    ut_true("mesh_form(copy)", mesh_form(&big));
    expect_ici(&big, "data", 1, 16, 1, 1, true);
    check_int("big.devices", big.devices, 256);
    big.axes[0].size = 1;
    big.axes[1].size = 1024; /* one axis of 1024 chips: larger than a slice */
    FILE *null = fopen("/dev/null", "w");
    diag_configure(null ? null : stderr, DIAG_MACHINE, false);
    ut_true("mesh_form(straddling copy) fails", !mesh_form(&big));
    diag_configure(stderr, DIAG_TEXT, false);
    if (null) fclose(null);
  }
  ut_end();
}

int main(void) {
  arena_init(&arena);
  test_v5e_full_slice();
  test_v5e_small();
  test_v5e_span();
  test_v5p_3d();
  test_v5e_two_slices();
  test_unformable();
  test_h100();
  test_base_and_reform();
  int rc = ut_summary();
  free(diag_text);
  arena_free(&arena);
  source_free_all();
  return rc;
}
