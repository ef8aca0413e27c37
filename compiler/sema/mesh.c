/* mesh.c: forming a mesh on its target: where each axis lands and which links a ring over it rides.
 *
 * In: a Mesh with its target and axes (name, size; major to minor). Out: per axis its stride, link
 * class, one-way bandwidth per device, latency and wraparound, and for TPUs its extent along each
 * torus dim; the mesh's device and slice counts. The cost model reads only these figures. The
 * rules are language.md's (fixed):
 *
 * GPU: devices are numbered minor-first, so the minor axes fill an NVLink domain (node_size GPUs)
 *   and the major ones cross nodes. An axis whose whole span (stride x size) fits in a node rides
 *   NVLink; any other rides the network, though `per_node` of its devices still share a node.
 *
 * TPU: the axes of one slice are laid on the torus minor-first, each starting on a torus dim no
 *   more-minor axis uses yet (a 16-chip [data: 4, model: 4] is the 4x4 slice real hardware gives),
 *   continuing onto further fresh dims when it is longer than one, and sharing the room left on a
 *   used dim only when no fresh dim remains. The extents on each torus dim multiply to at most its
 *   size. An axis spanning several torus dims gets their bandwidth combined; it closes its ring
 *   (wraparound, bidirectional) when every extent it spans is a multiple of the target's
 *   wrap_multiple. A mesh larger than the largest slice is several slices joined by the data-center
 *   network: the minor axes whose product fits one slice form it, the major axes count slices and
 *   ride DCN; an axis that would have to be cut between ICI and DCN is an error naming it. */
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "checked.h"
#include "sema_int.h"

int mesh_axis_index(const Mesh *m, Name axis) {
  if (!m) return -1;
  for (int i = 0; i < m->naxes; i++)
    if (m->axes[i].name == axis) return i;
  return -1;
}

/* "16x16" */
static const char *torus_text(const Target *t, char *buf, size_t n) {
  size_t used = 0;
  buf[0] = 0;
  for (int j = 0; j < t->ntorus && used < n; j++)
    used += (size_t)snprintf(buf + used, n - used, "%s%d", j ? "x" : "", t->torus[j]);
  return buf;
}

static void mesh_form_gpu(Mesh *m) {
  const Target *t = m->target;
  int64_t node = t->node_size;
  for (int i = 0; i < m->naxes; i++) {
    MeshAxis *ax = &m->axes[i];
    int64_t span = ax->stride * ax->size;
    if (ax->stride < node) {
      int64_t per = node / ax->stride;
      if (per < 1) per = 1;
      ax->per_node = (int)(per < ax->size ? per : ax->size);
    } else {
      ax->per_node = 1;
    }
    bool nvlink = span <= node;
    ax->link = nvlink ? LINK_NVLINK : LINK_NETWORK;
    ax->bw = nvlink ? t->nvlink_bw : t->network_bw;
    ax->latency = nvlink ? t->nvlink_latency : t->network_latency;
    ax->wraparound = true;
    ax->torus_dims = 0;
    for (int j = 0; j < MAX_TORUS_DIMS; j++) ax->torus_extent[j] = 1;
  }
  m->slices = 1;
}

/* The largest divisor of n that is at most cap (1 if none above 1). */
static int64_t largest_divisor_upto(int64_t n, int64_t cap) {
  for (int64_t f = cap < n ? cap : n; f > 1; f--)
    if (n % f == 0) return f;
  return 1;
}

/* Places axes [first, naxes) of one slice on the torus, minor-first. Each axis starts on a torus
 * dim no more-minor axis uses yet (so a 16-chip [data: 4, model: 4] is the 4x4 slice it is on real
 * hardware, one axis per torus dim); an axis larger than that dim continues onto the next fresh
 * dims, and only when none is left shares the room more-minor axes left on a used dim. Each torus
 * dim's extents multiply to at most its size. An axis's wraparound, bandwidth and hop count follow
 * from the extents it gets (the file comment). */
static bool mesh_place_slice(Mesh *m, int first) {
  const Target *t = m->target;
  int64_t cap[MAX_TORUS_DIMS]; /* how much more each torus dim can still be multiplied */
  bool used[MAX_TORUS_DIMS] = {false};
  char tbuf[64];
  for (int j = 0; j < t->ntorus; j++) cap[j] = t->torus[j];
  for (int i = m->naxes - 1; i >= first; i--) {
    MeshAxis *ax = &m->axes[i];
    for (int d = 0; d < MAX_TORUS_DIMS; d++) ax->torus_extent[d] = 1;
    int64_t rem = ax->size;
    int order[2 * MAX_TORUS_DIMS], n = 0;
    for (int j = 0; j < t->ntorus; j++)
      if (!used[j]) order[n++] = j;
    for (int j = 0; j < t->ntorus; j++)
      if (used[j]) order[n++] = j;
    for (int k = 0; k < n && rem > 1; k++) {
      int j = order[k];
      int64_t f = largest_divisor_upto(rem, cap[j]);
      if (f <= 1) continue;
      ax->torus_extent[j] *= (int)f;
      cap[j] /= f;
      rem /= f;
      used[j] = true;
    }
    if (rem > 1) {
      diag_error(ax->loc,
                 "axis '%s' (%d) does not fit on %s's %s torus beside the axes minor to it (%lld of it is "
                 "left over)",
                 ax->name, ax->size, t->name, torus_text(t, tbuf, sizeof tbuf), (long long)rem);
      return false;
    }
    int spanned = 0;
    bool wrap = true;
    for (int d = 0; d < MAX_TORUS_DIMS; d++) {
      if (ax->torus_extent[d] <= 1) continue;
      spanned++;
      if (t->wrap_multiple <= 0 || ax->torus_extent[d] % t->wrap_multiple != 0) wrap = false;
    }
    ax->torus_dims = spanned;
    ax->wraparound = spanned > 0 && wrap;
    ax->link = LINK_ICI;
    ax->bw = t->ici_bw;
    ax->latency = t->hop_latency;
    ax->per_node = 1;
  }
  return true;
}

/* Beyond one slice, the most-major axes count slices and ride DCN (language.md, fixed): the
 * minor axes whose product still fits the largest slice form one slice, the rest are DCN axes, so
 * no axis straddles ICI and DCN. */
static bool mesh_form_tpu(Mesh *m) {
  const Target *t = m->target;
  char tbuf[64];
  int64_t slice = 1;
  for (int j = 0; j < t->ntorus; j++) slice *= t->torus[j];
  int first_ici = 0; /* axes [0, first_ici) ride DCN */
  m->slices = 1;
  if (m->devices > slice) {
    int64_t minor = 1;
    int i = m->naxes - 1;
    while (i >= 0 && minor * m->axes[i].size <= slice) minor *= m->axes[i--].size;
    first_ici = i + 1;
    if (minor == 1 && m->naxes > 0) {
      const MeshAxis *ax = &m->axes[m->naxes - 1];
      diag_error(ax->loc,
                 "mesh '%s': axis '%s' (%d) is larger than %s's largest slice (%lld chips, %s) and would "
                 "straddle ICI and DCN; split it into a DCN axis and ICI axes",
                 m->name, ax->name, ax->size, t->name, (long long)slice, torus_text(t, tbuf, sizeof tbuf));
      return false;
    }
    m->slices = m->devices / minor;
    for (int a = 0; a < first_ici; a++) {
      MeshAxis *ax = &m->axes[a];
      ax->link = LINK_DCN;
      ax->bw = t->dcn_bw;
      ax->latency = t->hop_latency; /* no DCN latency figure in the targets; see docs/targets.md */
      ax->wraparound = false;
      ax->torus_dims = 0;
      ax->per_node = 1;
      for (int d = 0; d < MAX_TORUS_DIMS; d++) ax->torus_extent[d] = 1;
    }
  }
  return mesh_place_slice(m, first_ici);
}

bool mesh_form(Mesh *m) {
  const Target *t = m->target;
  if (!t) return false;
  /* A broken target (missing torus or node size) was reported where it is declared. */
  if (t->kind == TARGET_TPU && (t->ntorus < 1 || t->ntorus > MAX_TORUS_DIMS)) return false;
  if (t->kind == TARGET_GPU && t->node_size < 1) return false;
  for (int j = 0; t->kind == TARGET_TPU && j < t->ntorus; j++)
    if (t->torus[j] < 1) return false;

  int64_t stride = 1;
  for (int i = m->naxes - 1; i >= 0; i--) {
    MeshAxis *ax = &m->axes[i];
    if (ax->size < 1) return false;
    ax->stride = stride;
    if (ckd_mul(&stride, stride, ax->size) || stride > MESH_MAX_DEVICES) {
      diag_error(ax->loc, "mesh '%s' would have more than %d devices with axis '%s'; a mesh has at most %d devices "
                          "(2^24)", m->name, MESH_MAX_DEVICES, ax->name, MESH_MAX_DEVICES);
      return false;
    }
  }
  m->devices = stride;
  if (t->kind == TARGET_GPU) {
    mesh_form_gpu(m);
    return true;
  }
  return mesh_form_tpu(m);
}

const char *mesh_axes_text(Arena *a, const Mesh *m, uint16_t axes) {
  char *t = "";
  int n = 0;
  for (int i = 0; i < m->naxes; i++)
    if (axes & (1u << i)) t = arena_printf(a, "%s%s%s", t, n++ ? ", " : "", m->axes[i].name);
  return n > 1 ? arena_printf(a, "(%s)", t) : t;
}
