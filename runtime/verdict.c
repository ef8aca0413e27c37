/* verdict.c: verdict.h's comparison of the sharded run with the one-device run. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "shardrt.h"
#include "verdict.h"

/* adam's constants (language.md, Numerics; compiler/ir/ir.h's IR_ADAM_*) */
#define ADAM_BETA1 0.9
#define ADAM_BETA2 0.999
#define ADAM_EPS 1e-8

double rt_round_to(int dtype, double x) {
  switch (dtype) {
  case RT_BF16: return rt_bf16_to_f32(rt_f32_to_bf16((float)x));
  case RT_F16: return rt_f16_to_f32(rt_f32_to_f16((float)x));
  case RT_F8E4M3: return rt_f8e4m3_to_f32(rt_f32_to_f8e4m3((float)x));
  case RT_F8E5M2: return rt_f8e5m2_to_f32(rt_f32_to_f8e5m2((float)x));
  case RT_I32: return nearbyint(x);
  default: return (float)x;
  }
}

double rt_ulp(int dtype, double x) {
  int bits, emin; /* significand bits after the point; the least normal exponent */
  switch (dtype) {
  case RT_BF16: bits = 7, emin = -126; break;
  case RT_F16: bits = 10, emin = -14; break;
  case RT_F8E4M3: bits = 3, emin = -6; break;
  case RT_F8E5M2: bits = 2, emin = -14; break;
  case RT_I32: return 1;
  default: bits = 23, emin = -126; break;
  }
  int e;
  frexp(fabs(x), &e); /* |x| = f 2^e, f in [0.5, 1): the binade's exponent is e - 1 */
  if (x == 0 || e - 1 < emin) e = emin + 1;
  return ldexp(1.0, e - 1 - bits);
}

void rt_verdict_init(RtVerdict *v, bool allow_nonfinite) {
  memset(v, 0, sizeof *v);
  v->pass = true;
  v->allow_nonfinite = allow_nonfinite;
  v->t = 1;
}

static void fail(RtVerdict *v, const char *name, const char *fmt, double a, double b, double c, int64_t i) {
  if (v->pass) {
    int len = snprintf(v->why, sizeof v->why, "%s: ", name);
    if (len > 0 && (size_t)len < sizeof v->why) snprintf(v->why + len, sizeof v->why - (size_t)len, fmt, (long long)i, a, b, c);
  }
  v->pass = false;
}

/* adam's update of one element from its new moments at step t (ir.h's OP_ADAM_UPDATE) */
static double adam_step(double lr, double t, double m, double vv) {
  double mh = m / (1 - pow(ADAM_BETA1, t)), vh = vv / (1 - pow(ADAM_BETA2, t));
  return -lr * mh / (sqrt(vh > 0 ? vh : 0) + ADAM_EPS);
}

/* the largest update of an RT_CMP_UPDATE tensor in the one-device run */
static double update_scale(const RtCmpData *x) {
  double scale = 0;
  for (int64_t i = 0; i < x->n; i++)
    if (isfinite(x->ref[i]) && isfinite(x->before[i])) scale = fmax(scale, fabs(x->ref[i] - x->before[i]));
  return scale;
}

void rt_verdict_step(RtVerdict *v, const RtCmpDesc *d, const RtCmpData *x, int n) {
  double group[RT_CMP_GROUPS] = {0};
  for (int j = 0; j < n; j++)
    if (d[j].kind == RT_CMP_UPDATE && d[j].group > 0 && d[j].group < RT_CMP_GROUPS && x[j].before)
      group[d[j].group] = fmax(group[d[j].group], update_scale(&x[j]));
  for (int j = 0; j < n; j++) {
    int g = d[j].group > 0 && d[j].group < RT_CMP_GROUPS ? d[j].group : 0;
    rt_verdict_add(v, &d[j], &x[j], g ? d[j].floor * group[g] : 0);
  }
}

void rt_verdict_add(RtVerdict *v, const RtCmpDesc *d, const RtCmpData *x, double floor) {
  v->tensors++;
  const char *name = d->name ? d->name : "?";
  /* non-finite values: a FAIL, unless allowed where both runs hold the same one */
  int64_t bad_s = 0, bad_r = 0, first = -1;
  bool same = true;
  for (int64_t i = 0; i < x->n; i++) {
    bool fs = isfinite(x->shd[i]), fr = isfinite(x->ref[i]);
    if (fs && fr) continue;
    bad_s += !fs, bad_r += !fr;
    if (first < 0) first = i;
    if (fs != fr || !(isnan(x->shd[i]) ? isnan(x->ref[i]) : x->shd[i] == x->ref[i])) same = false;
  }
  v->nonfinite_shd += bad_s, v->nonfinite_ref += bad_r;
  if ((bad_s || bad_r) && !(v->allow_nonfinite && same)) {
    if (v->pass) {
      snprintf(v->why, sizeof v->why, "%s: non-finite values (%lld in the sharded run, %lld in the one-device run; element %lld: %g sharded, %g one device)%s",
               name, (long long)bad_s, (long long)bad_r, (long long)first, x->shd[first], x->ref[first],
               v->allow_nonfinite ? ", not at the same places" : "");
    }
    v->pass = false;
    if (v->worst_ratio < INFINITY) {
      snprintf(v->worst, sizeof v->worst, "%s", name);
      v->worst_ratio = INFINITY, v->worst_abs = INFINITY, v->worst_rel = INFINITY, v->worst_tol_rel = 0;
    }
    return;
  }
  /* the expected value and the tolerance of each element, by kind */
  double scale = 0, worst = 0, worst_tol = 0, ratio = 0;
  int64_t at = -1;
  if (d->kind == RT_CMP_UPDATE) {
    scale = update_scale(x);
  } else if (d->kind == RT_CMP_ADAM) {
    for (int64_t i = 0; i < x->n; i++) scale = fmax(scale, fabs(adam_step(v->lr, v->t, x->m[i], x->v[i])));
  } else {
    for (int64_t i = 0; i < x->n; i++)
      if (isfinite(x->ref[i])) scale = fmax(scale, fabs(x->ref[i]));
    if (scale == 0) /* an all-zero reference: the sharded run's own magnitude, so that any is an error */
      for (int64_t i = 0; i < x->n; i++)
        if (isfinite(x->shd[i])) scale = fmax(scale, fabs(x->shd[i]));
  }
  for (int64_t i = 0; i < x->n; i++) {
    if (!isfinite(x->shd[i]) || !isfinite(x->ref[i])) continue; /* allowed above */
    double want = x->ref[i], tol;
    switch (d->kind) {
    case RT_CMP_EXACT: tol = 0; break;
    case RT_CMP_UPDATE: tol = fmax(d->noise * scale, floor) + rt_ulp(d->dtype, x->ref[i]); break;
    case RT_CMP_ADAM: {
      double u = adam_step(v->lr, v->t, x->m[i], x->v[i]);
      want = rt_round_to(d->dtype, x->before[i] + u);
      tol = rt_ulp(d->dtype, want) + 1e-4 * fabs(u); /* f32's 1 - 0.999^t is good to ~1e-5 */
      break;
    }
    case RT_CMP_ROUNDED:
      want = rt_round_to(d->dtype, x->m[i]);
      tol = rt_ulp(d->dtype, want);
      break;
    default: tol = fmax(d->noise * scale, floor); break;
    }
    double err = fabs(x->shd[i] - want);
    double r = err > tol ? (tol > 0 ? err / tol : INFINITY) : (tol > 0 ? err / tol : 0);
    if (r > ratio || at < 0) ratio = r, worst = err, worst_tol = tol, at = i;
    if (err > tol) fail(v, name, "element %lld: %.9g sharded, %.9g expected (tolerance %.3g)", x->shd[i], want, tol, i);
  }
  if (v->trace)
    fprintf(v->trace, "verdict: step %g %-40s kind %d n %lld scale %.4g worst %.4g at %lld (tolerance %.4g): %.3g of its scale, ratio %.3g%s\n",
            v->t, name, d->kind, (long long)x->n, scale, worst, (long long)at, worst_tol, scale > 0 ? worst / scale : 0, ratio,
            ratio > 1 ? "  FAIL" : "");
  /* the worst line shows the noise-bounded comparisons; a rounding rule's one-ulp differences only
   * when nothing else was compared, or when they fail */
  bool ulp_rule = d->kind == RT_CMP_ADAM || d->kind == RT_CMP_ROUNDED;
  if (at >= 0 && (ratio > v->worst_ratio || v->worst[0] == 0) && (!ulp_rule || ratio > 1 || v->worst[0] == 0 || v->worst_ulp)) {
    v->worst_ulp = ulp_rule;
    snprintf(v->worst, sizeof v->worst, "%s", name);
    v->worst_ratio = ratio, v->worst_abs = worst;
    v->worst_rel = scale > 0 ? worst / scale : 0, v->worst_tol_rel = scale > 0 ? worst_tol / scale : 0;
  }
}

void rt_verdict_text(const RtVerdict *v, char *buf, size_t n) {
  if (!v->pass) {
    snprintf(buf, n, "%s", v->why);
    return;
  }
  if (!v->worst[0]) {
    snprintf(buf, n, "nothing compared");
    return;
  }
  snprintf(buf, n, "%.3g abs in %s, %.3g of its scale (tolerance %.3g)", v->worst_abs, v->worst, v->worst_rel, v->worst_tol_rel);
}

void rt_verdict_print(const RtVerdict *v, FILE *out) {
  if (v->worst[0])
    fprintf(out, "  worst error    %.3g abs in %s, %.3g of its scale (tolerance %.3g)\n", v->worst_abs, v->worst, v->worst_rel,
            v->worst_tol_rel);
  else
    fprintf(out, "  worst error    none: nothing finite was compared\n");
  if (!v->pass) fprintf(out, "  failure        %s\n", v->why);
  else if (v->nonfinite_shd)
    fprintf(out, "  non-finite     %lld elements NaN or infinite in both runs at the same places (--allow-nonfinite)\n",
            (long long)v->nonfinite_shd);
}

