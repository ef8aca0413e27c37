/* test_verdict.c: verdict.h's rules on hand-made tensors (docs/run.md, "How run decides PASS").
 * Expected verdicts follow from the rules by hand: each case says why. */
#include "rt_test.h"
#include "verdict.h"

#define N 8

static RtCmpDesc value_desc(double noise) {
  return (RtCmpDesc){.name = "t", .kind = RT_CMP_VALUE, .dtype = RT_F32, .noise = noise, .before = -1, .m = -1, .v = -1};
}

/* one tensor compared alone: the verdict */
static RtVerdict one(const RtCmpDesc *d, const double *shd, const double *ref, const double *before, const double *m,
                     const double *v, bool allow, double lr, double t) {
  RtVerdict V;
  rt_verdict_init(&V, allow);
  V.lr = lr, V.t = t;
  RtCmpData x = {.n = N, .shd = shd, .ref = ref, .before = before, .m = m, .v = v};
  rt_verdict_add(&V, d, &x, 0);
  return V;
}

static void nonfinite(void) {
  double ref[N] = {1, -2, 3, 0.5, 0, 0, 1, 1}, shd[N];
  RtCmpDesc d = value_desc(0.01);
  ut_begin("verdict.nonfinite.all_nan"); /* both runs all NaN: no longer "PASS, worst error 0" */
  double nan_[N];
  for (int i = 0; i < N; i++) nan_[i] = NAN;
  RtVerdict V = one(&d, nan_, nan_, NULL, NULL, NULL, false, 0, 1);
  UT_CHECK(!V.pass, "all NaN passed");
  UT_CHECK(strstr(V.why, "t: non-finite values (8 in the sharded run, 8 in the one-device run") != NULL, "why: %s", V.why);
  ut_end();

  ut_begin("verdict.nonfinite.allowed"); /* the same NaNs at the same places, allowed: nothing else to compare */
  V = one(&d, nan_, nan_, NULL, NULL, NULL, true, 0, 1);
  UT_CHECK(V.pass, "allowed NaN failed: %s", V.why);
  ut_end();

  ut_begin("verdict.nonfinite.one_side"); /* a NaN in the sharded run only fails, allowed or not */
  memcpy(shd, ref, sizeof shd);
  shd[3] = NAN;
  V = one(&d, shd, ref, NULL, NULL, NULL, true, 0, 1);
  UT_CHECK(!V.pass && strstr(V.why, "element 3") && strstr(V.why, "not at the same places"), "why: %s", V.why);
  ut_end();

  ut_begin("verdict.nonfinite.different_infinities"); /* +inf against -inf: not the same value */
  double a[N] = {INFINITY, 0, 0, 0, 0, 0, 0, 0}, b[N] = {-INFINITY, 0, 0, 0, 0, 0, 0, 0};
  V = one(&d, a, b, NULL, NULL, NULL, true, 0, 1);
  UT_CHECK(!V.pass, "+inf vs -inf passed");
  ut_end();

  ut_begin("verdict.huge_finite"); /* +-3.4e38 on both sides, equal: finite, scale 3.4e38, error 0 */
  double h[N] = {3.4e38, -3.4e38, 3.4e38, -3.4e38, 1, 2, 3, 4}, h2[N];
  memcpy(h2, h, sizeof h2);
  V = one(&d, h, h2, NULL, NULL, NULL, false, 0, 1);
  UT_CHECK(V.pass && V.worst_abs == 0, "equal huge values: pass %d, worst %g", V.pass, V.worst_abs);
  h2[4] = -3.4e38; /* a huge error: |1 - -3.4e38| = 3.4e38 > 0.01 x 3.4e38 */
  V = one(&d, h, h2, NULL, NULL, NULL, false, 0, 1);
  UT_CHECK(!V.pass && strstr(V.why, "element 4"), "why: %s", V.why);
  ut_end();
}

static void values(void) {
  double ref[N] = {1, -2, 4, 0.5, 0, 1e-6, 1, 1}, shd[N];
  RtCmpDesc d = value_desc(0.01); /* tolerance 0.01 x 4 = 0.04 for every element */
  ut_begin("verdict.value.scale");
  memcpy(shd, ref, sizeof shd);
  shd[5] += 0.039; /* an element near zero off by less than the tensor's tolerance: rounding can do that */
  RtVerdict V = one(&d, shd, ref, NULL, NULL, NULL, false, 0, 1);
  UT_CHECK(V.pass, "within 0.04 failed: %s", V.why);
  ut_near("worst over scale", V.worst_rel, 0.039 / 4, 1e-9);
  ut_near("tolerance over scale", V.worst_tol_rel, 0.01, 1e-9);
  UT_CHECK(!strcmp(V.worst, "t"), "worst names %s", V.worst);
  memcpy(shd, ref, sizeof shd);
  shd[2] = ref[2] + 0.041; /* the largest element off by 0.041: beyond 0.04 */
  V = one(&d, shd, ref, NULL, NULL, NULL, false, 0, 1);
  UT_CHECK(!V.pass && strstr(V.why, "t: element 2: 4.041 sharded, 4 expected (tolerance 0.04)"), "why: %s", V.why);
  ut_end();

  ut_begin("verdict.value.all_zero_reference"); /* a zero tensor: the sharded run must give zeros */
  double z[N] = {0}, s[N] = {0};
  s[1] = 1e-30;
  V = one(&d, s, z, NULL, NULL, NULL, false, 0, 1);
  UT_CHECK(!V.pass, "a nonzero element against an all-zero reference passed");
  V = one(&d, z, z, NULL, NULL, NULL, false, 0, 1);
  UT_CHECK(V.pass, "zeros against zeros failed");
  ut_end();

  ut_begin("verdict.exact");
  RtCmpDesc e = {.name = "tokens", .kind = RT_CMP_EXACT, .dtype = RT_I32, .before = -1, .m = -1, .v = -1};
  double i1[N] = {1, 2, 3, 4, 5, 6, 7, 8}, i2[N] = {1, 2, 3, 4, 5, 6, 7, 9};
  UT_CHECK(one(&e, i1, i1, NULL, NULL, NULL, false, 0, 1).pass, "equal integers failed");
  UT_CHECK(!one(&e, i2, i1, NULL, NULL, NULL, false, 0, 1).pass, "8 vs 9 passed");
  ut_end();
}

/* adam: the update a param must get from its new moments (language.md): at step 1, m = 0.1 g,
 * v = 0.001 g^2, so m^ = g, v^ = g^2 and the update is -lr g / (|g| + 1e-8) */
static void adam(void) {
  double lr = 1e-2, before[N], g[N] = {0.5, -0.25, 1e-9, -1e-9, 0.125, 2, -3, 1e-3}, m[N], v[N], want[N];
  for (int i = 0; i < N; i++) {
    before[i] = 0.1 * (i + 1);
    m[i] = 0.1 * g[i], v[i] = 0.001 * g[i] * g[i];
    want[i] = before[i] - lr * g[i] / (fabs(g[i]) + 1e-8);
  }
  RtCmpDesc d = {.name = "master.w", .kind = RT_CMP_ADAM, .dtype = RT_F32, .before = -1, .m = 0, .v = 1};
  ut_begin("verdict.adam.consistent");
  double shd[N];
  for (int i = 0; i < N; i++) shd[i] = (float)want[i];
  RtVerdict V = one(&d, shd, want, before, m, v, false, lr, 1);
  UT_CHECK(V.pass, "adam's own update failed: %s", V.why);
  ut_end();

  ut_begin("verdict.adam.sign_flip_near_zero"); /* g = 1e-9 in one run, -1e-9 in the other: the updates
    differ by about 2 lr x 0.95 (|g| / (|g| + 1e-8) = 0.09 here: 0.0018), which the old comparison
    called a FAIL; each is adam's rule applied to its own (right, within noise) moments */
  double ref[N];
  memcpy(ref, shd, sizeof ref);
  double m2[N], v2[N], shd2[N];
  memcpy(m2, m, sizeof m2), memcpy(v2, v, sizeof v2), memcpy(shd2, shd, sizeof shd2);
  m2[2] = -m[2]; /* the sharded run's gradient of element 2 has the other sign */
  shd2[2] = (float)(before[2] + lr * g[2] / (fabs(g[2]) + 1e-8));
  V = one(&d, shd2, ref, before, m2, v2, false, lr, 1);
  UT_CHECK(V.pass, "a sign flip within noise failed: %s", V.why);
  UT_CHECK(fabs(shd2[2] - ref[2]) > 1e-4, "the flip should move the element: %g", fabs(shd2[2] - ref[2]));
  ut_end();

  ut_begin("verdict.adam.wrong_update"); /* the update applied twice to one element */
  memcpy(shd2, shd, sizeof shd2);
  shd2[4] = (float)(want[4] - lr);
  V = one(&d, shd2, ref, before, m, v, false, lr, 1);
  UT_CHECK(!V.pass && strstr(V.why, "master.w: element 4"), "why: %s", V.why);
  ut_end();

  ut_begin("verdict.adam.stale"); /* a param not updated at all */
  V = one(&d, before, ref, before, m, v, false, lr, 1);
  UT_CHECK(!V.pass, "a stale param passed");
  ut_end();

  ut_begin("verdict.adam.step2"); /* t = 2: bias corrections 1 - 0.9^2 = 0.19, 1 - 0.999^2 = 0.001999 */
  double m3 = 0.19 * 0.5, v3 = 0.001999 * 0.25, u = -lr * (m3 / 0.19) / (sqrt(v3 / 0.001999) + 1e-8); /* = -lr */
  double b3[N] = {1}, s3[N] = {(float)(1 + u)}, mm[N] = {m3}, vv[N] = {v3};
  for (int i = 1; i < N; i++) b3[i] = s3[i] = mm[i] = vv[i] = 0;
  V = one(&d, s3, s3, b3, mm, vv, false, lr, 2);
  UT_CHECK(V.pass, "step 2's update failed: %s", V.why);
  ut_near("update", s3[0] - 1, -lr, 1e-6);
  ut_end();
}

static void updates(void) {
  /* sgd: p' = p - lr g. The updates (out - before) are compared: scale = max |ref - before| */
  double before[N] = {1, 1, 1, 1, 1, 1, 1, 1}, ref[N], shd[N];
  double g[N] = {0.1, -0.2, 0.05, 0, 0.3, -0.1, 0.01, 0.2}, lr = 10;
  for (int i = 0; i < N; i++) ref[i] = before[i] - lr * g[i];
  RtCmpDesc d = {.name = "w", .kind = RT_CMP_UPDATE, .dtype = RT_F32, .noise = 0.01, .before = -1, .m = -1, .v = -1};
  ut_begin("verdict.update.sgd");
  memcpy(shd, ref, sizeof shd);
  shd[1] += 0.029; /* 0.01 x max |update| = 0.03: within */
  RtVerdict V = one(&d, shd, ref, before, NULL, NULL, false, lr, 1);
  UT_CHECK(V.pass, "within 0.03 failed: %s", V.why);
  ut_end();

  ut_begin("verdict.update.wrong_gradient_at_lr_10"); /* g off by 5% in one element: 10 x 0.005 = 0.05 */
  memcpy(shd, ref, sizeof shd);
  shd[6] = before[6] - lr * (g[6] + 0.005);
  V = one(&d, shd, ref, before, NULL, NULL, false, lr, 1);
  UT_CHECK(!V.pass && strstr(V.why, "w: element 6"), "why: %s", V.why);
  ut_end();

  ut_begin("verdict.update.bf16_ulp"); /* a bf16 param whose update rounds either way: one ulp allowed */
  RtCmpDesc b = d;
  b.dtype = RT_BF16;
  double pb[N], rb[N], sb[N];
  for (int i = 0; i < N; i++) pb[i] = rb[i] = sb[i] = 0.25;
  rb[0] = 0.25 - 0x1p-10; /* the bf16 just below 0.25 (binade [2^-3, 2^-2): ulp 2^-10) */
  sb[0] = 0.25;
  V = one(&b, sb, rb, pb, NULL, NULL, false, lr, 1);
  UT_CHECK(V.pass, "a one-ulp rounding difference failed: %s", V.why);
  ut_near("ulp of bf16 at 0.25", rt_ulp(RT_BF16, 0.25), 0x1p-9, 0);
  ut_near("ulp of bf16 just below 0.25", rt_ulp(RT_BF16, 0.24), 0x1p-10, 0);
  ut_near("ulp of f32 at 1", rt_ulp(RT_F32, 1.0), 0x1p-23, 0);
  ut_end();

  ut_begin("verdict.rounded"); /* a param with a master copy: the master rounded to bf16 */
  RtCmpDesc r = {.name = "w", .kind = RT_CMP_ROUNDED, .dtype = RT_BF16, .before = -1, .m = 0, .v = -1};
  double master[N] = {0.30000001, -0.7, 1, 2, 3, 4, 5, 6}, p[N];
  for (int i = 0; i < N; i++) p[i] = rt_round_to(RT_BF16, master[i]);
  V = one(&r, p, p, NULL, master, NULL, false, 0, 1);
  UT_CHECK(V.pass, "the rounded master failed: %s", V.why);
  p[1] = -0.75; /* a stale bf16 param two ulps off its master */
  V = one(&r, p, p, NULL, master, NULL, false, 0, 1);
  UT_CHECK(!V.pass, "a param 0.05 off its master passed");
  ut_end();
}

static void worst_across(void) {
  ut_begin("verdict.worst_names_its_tensor"); /* two tensors: the worst is the larger error over tolerance */
  double r1[N] = {1, 1, 1, 1, 1, 1, 1, 1}, s1[N], r2[N] = {100, 0, 0, 0, 0, 0, 0, 0}, s2[N];
  memcpy(s1, r1, sizeof s1), memcpy(s2, r2, sizeof s2);
  s1[0] += 0.009; /* 0.9 of a tolerance of 0.01 */
  s2[3] += 0.5;   /* 0.5 of a tolerance of 1 */
  RtCmpDesc a = value_desc(0.01), b = value_desc(0.01);
  a.name = "small", b.name = "large";
  RtVerdict V;
  rt_verdict_init(&V, false);
  RtCmpData x = {.n = N, .shd = s1, .ref = r1}, y = {.n = N, .shd = s2, .ref = r2};
  rt_verdict_add(&V, &b, &y, 0);
  rt_verdict_add(&V, &a, &x, 0);
  UT_CHECK(V.pass && !strcmp(V.worst, "small"), "pass %d, worst %s", V.pass, V.worst);
  ut_near("its error over its scale", V.worst_rel, 0.009, 1e-9);
  char text[400];
  rt_verdict_text(&V, text, sizeof text);
  UT_CHECK(strstr(text, "in small, 0.009 of its scale (tolerance 0.01)") != NULL, "text: %s", text);
  ut_end();
}

/* A gradient that is zero exactly (a key bias's: softmax ignores a shift shared by every key) is
 * rounding noise in both runs, as large as a rounding of the other gradients' terms: its own
 * scale is that noise. The group floor (rt_verdict_step): one bf16 rounding x 3 of the step's
 * largest first-moment update, 3 x 2^-8 x 1e-3 = 1.17e-5, admits it; alone it fails. */
static void group_floor(void) {
  double zero[N] = {0}, big_ref[N], big_shd[N], bias_ref[N] = {3.8e-7, -2e-7, 1e-7, 0, 0, 0, 0, 0}, bias_shd[N];
  for (int i = 0; i < N; i++) big_ref[i] = big_shd[i] = 1e-3 * (i + 1) / N;
  memcpy(bias_shd, bias_ref, sizeof bias_shd);
  bias_shd[0] = -1.05e-6; /* the other sign, three times the one-device run's noise */
  RtCmpDesc d[2] = {{.name = "adam.m.wq", .kind = RT_CMP_UPDATE, .dtype = RT_F32, .noise = 0.1, .before = 0, .m = -1, .v = -1,
                     .group = RT_CMP_GROUP_M, .floor = 3 * 0x1p-8},
                    {.name = "adam.m.bk", .kind = RT_CMP_UPDATE, .dtype = RT_F32, .noise = 0.1, .before = 0, .m = -1, .v = -1,
                     .group = RT_CMP_GROUP_M, .floor = 3 * 0x1p-8}};
  RtCmpData x[2] = {{.n = N, .shd = big_shd, .ref = big_ref, .before = zero}, {.n = N, .shd = bias_shd, .ref = bias_ref, .before = zero}};
  ut_begin("verdict.group_floor.cancelled_gradient");
  RtVerdict V;
  rt_verdict_init(&V, false);
  rt_verdict_step(&V, d, x, 2);
  UT_CHECK(V.pass, "the key bias's noise failed with the floor: %s", V.why);
  rt_verdict_init(&V, false);
  rt_verdict_add(&V, &d[1], &x[1], 0);
  UT_CHECK(!V.pass, "without the floor the noise should fail (0.1 x 3.8e-7 tolerance)");
  bias_shd[0] = 2e-5; /* beyond the floor: a wrong gradient */
  rt_verdict_init(&V, false);
  rt_verdict_step(&V, d, x, 2);
  UT_CHECK(!V.pass && strstr(V.why, "adam.m.bk: element 0"), "why: %s", V.why);
  ut_end();
}

/* ---- routing followed in the tokens' logical order (route_log.c, nn.c's rt_nn_route) ----
 * One group of T = 8 tokens, E = 4 experts, top 2, C = 4 slots. The one-device run routes the
 * tokens in logical order and records; the "sharded" run holds the same sequence in a causal
 * ring's zigzag order over 2 devices (chunks of 2: storage holds logical chunks 0, 3, 1, 2) and
 * passes rt_nn_route each logical token's storage position. Token 3's second choice is a near tie
 * (experts 1 and 2 at 1.0 and 1.0 + 1e-6) that the sharded run's rounding flips (1.0 - 1e-6). */
enum { RT_T = 8, RT_E = 4, RT_K = 2, RT_C = 4 };

typedef struct RouteCase {
  const float *logits;  /* [RT_T][RT_E] in the run's storage order */
  const int64_t *order; /* storage position of logical token i, or NULL */
  float out[RT_T * RT_E * RT_C];
  int rc;
} RouteCase;

static int route_device(RtDevice *dev, void *arg) {
  RouteCase *c = arg;
  RtRows rows = {.nd = 0, .dtype = {RT_F32, RT_F32}};
  c->rc = rt_nn_route(dev, &rows, RT_K, RT_E, RT_T, RT_C, 1, RT_E, RT_C, RT_E * RT_C, 1, c->logits, c->out,
                      RT_T * RT_E * RT_C, c->order);
  return c->rc;
}

static void route_once(RtRouteLog *log, int mode, RouteCase *c) {
  RtConfig cfg = test_mesh(0, NULL);
  cfg.route_log = log, cfg.route_mode = mode;
  Runtime *rt;
  rt_open(&cfg, &rt);
  UT_CHECK(rt_run(rt, route_device, c) == RT_OK && c->rc == RT_OK, "rt_run: %s", rt_errmsg(rt));
  rt_close(rt);
}

static void routing_order(void) {
  /* logical logits: every token's largest first, so that tokens differ by far more than 1/16 of
   * the largest magnitude (a permuted group never matches the recorded one) */
  float ref[RT_T][RT_E] = {{4, 0, 1, 2}, {0, 4, 2, 1}, {1, 2, 4, 0}, {3, 1.0f, 1.000001f, 0}, {4, 2, 0, 1},
                           {0, 1, 2, 4}, {2, 4, 0, 1}, {1, 0, 4, 2}};
  float flip[RT_T][RT_E];
  memcpy(flip, ref, sizeof flip);
  flip[3][2] = 0.999999f; /* token 3's second choice: expert 2 on one device, 1 sharded */
  static const int64_t order[RT_T] = {0, 1, 4, 5, 6, 7, 2, 3}; /* logical i at storage order[i] */
  float stored[RT_T][RT_E];
  for (int i = 0; i < RT_T; i++) memcpy(stored[order[i]], flip[i], sizeof stored[0]);

  RtRouteLog *log = rt_route_log_new();
  RouteCase one = {.logits = &ref[0][0]};
  route_once(log, RT_ROUTE_RECORD, &one);

  ut_begin("verdict.routing.zigzag_followed"); /* the flip is followed, token by logical token */
  RouteCase shd = {.logits = &stored[0][0], .order = order};
  route_once(log, RT_ROUTE_FOLLOW, &shd);
  int64_t tokens, followed;
  rt_route_log_counts(log, &tokens, &followed);
  UT_CHECK(tokens == RT_T && followed == 1, "%lld tokens, %lld followed (want 8, 1)", (long long)tokens, (long long)followed);
  int bad = 0;
  for (int i = 0; i < RT_T; i++)
    bad += memcmp(&shd.out[order[i] * RT_E * RT_C], &one.out[i * RT_E * RT_C], sizeof(float) * RT_E * RT_C) != 0;
  UT_CHECK(bad == 0, "%d tokens' slots differ from the one-device run's", bad);
  ut_end();

  ut_begin("verdict.routing.own_differs"); /* routed by its own logits the same run differs at token 3 */
  RouteCase own = {.logits = &stored[0][0], .order = order};
  route_once(log, RT_ROUTE_OWN, &own);
  UT_CHECK(memcmp(&own.out[order[3] * RT_E * RT_C], &one.out[3 * RT_E * RT_C], sizeof(float) * RT_E * RT_C) != 0,
           "token 3 routed as the one-device run without following");
  ut_end();

  ut_begin("verdict.routing.far_not_followed"); /* logits off by more than 1/16 of their scale: own choices */
  float far[RT_T][RT_E];
  for (int i = 0; i < RT_T; i++) memcpy(far[order[i]], flip[i], sizeof far[0]);
  far[order[0]][0] = 4.5f; /* 0.5 > 4.5 / 16 */
  RouteCase off = {.logits = &far[0][0], .order = order};
  int64_t before = followed;
  route_once(log, RT_ROUTE_FOLLOW, &off);
  rt_route_log_counts(log, &tokens, &followed);
  UT_CHECK(followed == before, "%lld decisions followed from a group that does not match", (long long)(followed - before));
  UT_CHECK(memcmp(&off.out[order[3] * RT_E * RT_C], &own.out[order[3] * RT_E * RT_C], sizeof(float) * RT_E * RT_C) == 0,
           "token 3 not routed by its own logits");
  ut_end();
  rt_route_log_free(log);
}

int main(void) {
  routing_order();
  group_floor();
  nonfinite();
  values();
  adam();
  updates();
  worst_across();
  return ut_summary();
}
