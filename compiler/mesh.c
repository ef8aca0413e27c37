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
 * TPU: the axes of one slice fill the torus dims minor-first, like digits of a mixed-radix number:
 *   the minor axis starts on torus dim 0 and, when a dim is full, continues on the next. An axis
 *   may span several torus dims (its bandwidth then adds up), but it may move on to the next dim
 *   only after filling the current one exactly, so every axis has a whole extent along every dim
 *   (a legal sub-torus; [a:3, b:16] on 16x16 is not one). An axis closes its ring (wraparound,
 *   bidirectional) when every extent it spans is a multiple of the target's wrap_multiple.
 *   A mesh larger than one slice is several *full* slices joined by the data-center network: the
 *   devices must be a whole number of slices, the most-major axes must multiply to exactly that
 *   number (they ride DCN) and the rest must form one full slice. An axis that would have to be
 *   cut between ICI and DCN is an error naming it. */
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "sema_int.h"

const char *link_kind_name(LinkKind k) {
  switch (k) {
  case LINK_ICI: return "ici";
  case LINK_DCN: return "dcn";
  case LINK_NVLINK: return "nvlink";
  case LINK_NETWORK: return "network";
  }
  return "?";
}

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

/* Places axes [first, naxes) of one slice on the torus, minor-first (file comment). */
static bool mesh_place_slice(Mesh *m, int first) {
  const Target *t = m->target;
  int j = 0;        /* torus dim being filled */
  int64_t fill = 1; /* chips of dim j already taken by more-minor axes */
  char tbuf[64];
  for (int i = m->naxes - 1; i >= first; i--) {
    MeshAxis *ax = &m->axes[i];
    for (int d = 0; d < MAX_TORUS_DIMS; d++) ax->torus_extent[d] = 1;
    int64_t rem = ax->size;
    while (rem > 1) {
      if (j >= t->ntorus) {
        diag_error(ax->loc, "axis '%s' (%d) does not fit on %s's %s torus", ax->name, ax->size, t->name,
                   torus_text(t, tbuf, sizeof tbuf));
        return false;
      }
      int64_t room = t->torus[j] / fill;
      if (fill * rem <= t->torus[j]) {
        ax->torus_extent[j] *= (int)rem;
        fill *= rem;
        rem = 1;
      } else if (t->torus[j] % fill != 0 || rem % room != 0) {
        if (fill > 1)
          diag_error(ax->loc,
                     "axis '%s' (%d) cannot continue from torus dim %d, where the axes minor to it take %lld of "
                     "%d chips, onto dim %d: a slice of %s's %s torus must fill one dim before the next",
                     ax->name, ax->size, j, (long long)fill, t->torus[j], j + 1, t->name,
                     torus_text(t, tbuf, sizeof tbuf));
        else
          diag_error(ax->loc,
                     "axis '%s' (%d) does not divide into whole rows of %d chips along torus dim %d of %s's %s torus",
                     ax->name, ax->size, t->torus[j], j, t->name, torus_text(t, tbuf, sizeof tbuf));
        return false;
      } else {
        ax->torus_extent[j] *= (int)room;
        rem /= room;
        fill = t->torus[j];
      }
      if (fill == t->torus[j]) j++, fill = 1;
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

static bool mesh_form_tpu(Mesh *m) {
  const Target *t = m->target;
  char tbuf[64];
  int64_t slice = 1;
  for (int j = 0; j < t->ntorus; j++) slice *= t->torus[j];
  int first_ici = 0; /* axes [0, first_ici) ride DCN */
  m->slices = 1;
  if (m->devices > slice) {
    if (m->devices % slice != 0) {
      diag_error(m->loc,
                 "mesh '%s' needs %lld devices; %s slices hold at most %lld (%s), and %lld is not a whole "
                 "number of slices",
                 m->name, (long long)m->devices, t->name, (long long)slice, torus_text(t, tbuf, sizeof tbuf),
                 (long long)m->devices);
      return false;
    }
    int64_t slices = m->devices / slice, major = 1;
    while (first_ici < m->naxes && major < slices) major *= m->axes[first_ici++].size;
    if (major != slices) {
      /* The axis that crosses from "fits in a slice" to "more than a slice", minor-first. */
      int64_t minor = 1;
      int i = m->naxes - 1;
      while (i > 0 && minor * m->axes[i].size <= slice) minor *= m->axes[i--].size;
      const MeshAxis *ax = &m->axes[i];
      diag_error(ax->loc,
                 "mesh '%s' needs %lld devices; %s slices hold at most %lld (%s), and axis '%s' (%d) would "
                 "straddle ICI and DCN (the axes minor to it hold %lld devices; the major axes must multiply "
                 "to the %lld slices exactly)",
                 m->name, (long long)m->devices, t->name, (long long)slice, torus_text(t, tbuf, sizeof tbuf),
                 ax->name, ax->size, (long long)minor, (long long)slices);
      return false;
    }
    m->slices = slices;
    for (int i = 0; i < first_ici; i++) {
      MeshAxis *ax = &m->axes[i];
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
    if (stride > INT_MAX / ax->size) {
      diag_error(ax->loc, "mesh '%s' has more than %d devices", m->name, INT_MAX);
      return false;
    }
    stride *= ax->size;
  }
  m->devices = stride;
  if (t->kind == TARGET_GPU) {
    mesh_form_gpu(m);
    return true;
  }
  return mesh_form_tpu(m);
}
