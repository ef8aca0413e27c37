/* test_dropout.c: dropout's counter-based mask (compiler/ir/dropout.h) against figures derived
 * outside it: splitmix64's published first output, the binomial spread of the kept fraction, and
 * the agreement two independent masks must have. The numerics through the program (the backward's
 * mask, remat's recomputation, sharded == unsharded) are test_autodiff's finite differences and
 * dropout.cmake's `shardc run` cases. */
#include <math.h>
#include <stdio.h>

#include "dropout.h"
#include "unit_test.h"

int main(void) {
  ut_begin("dropout: splitmix64's first output from seed 0 (0xe220a8397b1dcdaf) sets the cut");
  /* key 0, index 0 hashes 0 + 1 * golden: splitmix64's first output from state 0, whose top 24
   * bits are 0xe220a8: kept for a threshold up to it, dropped above */
  UT_CHECK(dropout_keep(0, 0, 0xe220a8), "element 0 dropped at threshold 0xe220a8");
  UT_CHECK(!dropout_keep(0, 0, 0xe220a9), "element 0 kept at threshold 0xe220a9");
  ut_end();

  ut_begin("dropout: threshold round(p 2^24), scale f32(1 / (1 - p))");
  UT_CHECK(dropout_threshold(0.1) == 1677722, "threshold(0.1) = %llu, want 1677722 (1677721.6 rounded)",
           (unsigned long long)dropout_threshold(0.1));
  UT_CHECK(dropout_threshold(0.5) == 8388608, "threshold(0.5) = %llu", (unsigned long long)dropout_threshold(0.5));
  UT_CHECK(dropout_scale(0.5) == 2.0f, "scale(0.5) = %.9g", dropout_scale(0.5));
  UT_CHECK(dropout_scale(0.1) == (float)(1 / 0.9), "scale(0.1) = %.9g", dropout_scale(0.1));
  ut_end();

  /* the kept fraction of n = 2^20 elements is 1 - p within 5 binomial sigmas (sqrt(p (1-p) / n)) */
  const double ps[] = {0.1, 0.5, 0.9};
  const int n = 1 << 20;
  for (int i = 0; i < 3; i++) {
    char name[96];
    snprintf(name, sizeof name, "dropout: p = %.1f keeps 1 - p of 2^20 elements (5 sigma)", ps[i]);
    ut_begin(name);
    uint64_t thr = dropout_threshold(ps[i]);
    for (uint64_t seed = 1; seed <= 3; seed++) {
      long kept = 0;
      for (int k = 0; k < n; k++) kept += dropout_keep(dropout_key(seed, 0), (uint64_t)k, thr);
      double f = (double)kept / n, sigma = sqrt(ps[i] * (1 - ps[i]) / n);
      UT_CHECK(fabs(f - (1 - ps[i])) <= 5 * sigma, "seed %llu: kept %.6f, want %.6f +- %.6f", (unsigned long long)seed, f,
               1 - ps[i], 5 * sigma);
    }
    ut_end();
  }

  /* two sites' masks are independent: they agree on p^2 + (1-p)^2 of the elements (0.5 at p = 0.5),
   * and neighbouring indices are uncorrelated (runs of equal decisions: P(same) = 0.5) */
  ut_begin("dropout: two seeds, and neighbouring elements, are independent at p = 0.5 (5 sigma)");
  uint64_t thr = dropout_threshold(0.5);
  long agree = 0, same_next = 0;
  for (int k = 0; k < n; k++) {
    bool a = dropout_keep(dropout_key(7, 0), (uint64_t)k, thr);
    agree += a == dropout_keep(dropout_key(8, 0), (uint64_t)k, thr);
    same_next += a == dropout_keep(dropout_key(7, 0), (uint64_t)k + 1, thr);
  }
  double sigma = sqrt(0.25 / n);
  UT_CHECK(fabs((double)agree / n - 0.5) <= 5 * sigma, "seeds 7 and 8 agree on %.6f", (double)agree / n);
  UT_CHECK(fabs((double)same_next / n - 0.5) <= 5 * sigma, "neighbours agree on %.6f", (double)same_next / n);
  ut_end();
  return ut_summary();
}
