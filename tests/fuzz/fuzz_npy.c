/* fuzz_npy.c: libFuzzer target for the .npy reader (compiler/driver/npy.c), which `run --load`
 * feeds files that other people send.
 *
 * In: arbitrary bytes, taken as a whole .npy file. Out: nothing; the contract under test is that
 * any input yields an array or a message, never a crash, a sanitizer report, a leak, a hang or an
 * allocation larger than the input justifies (libFuzzer's -rss_limit_mb and -malloc_limit_mb catch
 * those: the reader allocates 8 bytes per element only after the header's element count is known to
 * need exactly the bytes that follow it). An array that is read must be consistent: n the product
 * of its shape, every value finite for int32 and within int32's range.
 *
 * Build: cmake -DCMAKE_C_COMPILER=clang-19 -DSHARDC_FUZZ=ON; run: FUZZ_TARGET=fuzz_npy
 * tests/fuzz/run.sh BUILD_DIR (seeded from tests/fuzz/npy/). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "npy.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  NpyArray a;
  char err[600];
  if (!npy_decode(data, size, "fuzz.npy", &a, err, sizeof err)) return 0;
  int64_t n = 1;
  for (int d = 0; d < a.rank; d++) n *= a.shape[d];
  if (n != a.n || a.n > (int64_t)(size / 4)) abort(); /* the count is the shape's, and the file holds it */
  for (int64_t i = 0; a.is_int && i < a.n; i++)
    if (!(a.data[i] >= -2147483648.0 && a.data[i] <= 2147483647.0 && a.data[i] == floor(a.data[i]))) abort();
  npy_free(&a);
  return 0;
}
