/* size.c: the sizes of tensors, checked against SIZE_LIMIT (checked.h).
 *
 * Every tensor a program names or computes (boundary types here and in sema.c, every value the IR
 * builder makes) must hold at most SIZE_LIMIT = 2^62 bytes, and so at most 2^62 elements: later
 * stages multiply and add such sizes freely (with sat_add/sat_mul where several are summed). A
 * tensor over the limit is an error whose message shows the product, dim by dim, and which of
 * those dims -D set, so `-D seq=17592186044416` is reported as the cause it is. */
#include <stdio.h>
#include <string.h>

#include "checked.h"
#include "program.h"

const char *tensor_size_error(Arena *a, Dim *const *dims, int rank, DType dt) {
  int64_t bytes = dtype_bytes(dt) > 0 ? dtype_bytes(dt) : 1;
  bool over = false;
  double approx = (double)bytes;
  for (int i = 0; i < rank; i++) {
    if (!dims[i]) continue;
    approx *= (double)dims[i]->size;
    if (ckd_mul(&bytes, bytes, dims[i]->size) || bytes > SIZE_LIMIT) over = true;
  }
  if (!over) return NULL;

  char prod[512], type[256], cause[256];
  size_t np = 0, nt = 0, nc = 0;
  prod[0] = type[0] = cause[0] = '\0';
  nt += (size_t)snprintf(type, sizeof type, "%s[", dtype_name(dt));
  for (int i = 0; i < rank; i++) {
    const Dim *d = dims[i];
    if (!d) continue;
    if (np < sizeof prod)
      np += (size_t)snprintf(prod + np, sizeof prod - np, "%s%s %lld", np ? " x " : "", d->name, (long long)d->size);
    if (nt < sizeof type) nt += (size_t)snprintf(type + nt, sizeof type - nt, "%s%s", i ? ", " : "", d->name);
    if (d->overridden && nc < sizeof cause)
      nc += (size_t)snprintf(cause + nc, sizeof cause - nc, "%s-D %s=%lld", nc ? ", " : "; set by ", d->name,
                             (long long)d->size);
  }
  if (nt < sizeof type) snprintf(type + nt, sizeof type - nt, "]");
  if (np < sizeof prod)
    snprintf(prod + np, sizeof prod - np, " x %d byte%s", dtype_bytes(dt), dtype_bytes(dt) == 1 ? "" : "s");
  return arena_printf(a, "tensor too large: %s would hold %.3g bytes (%s%s); a tensor holds at most 2^62 bytes",
                      type, approx, prod, cause);
}
