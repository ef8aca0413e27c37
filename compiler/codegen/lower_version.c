/* lower_version.c: the version of the LLVM library shardc runs with, for `shardc --version`.
 * Named lower* because it includes the LLVM-C API, which stays in the lowering files. */
#include <stdio.h>

#include <llvm-c/Core.h>

#include "lower.h"

const char *lower_llvm_version(void) {
  static char buf[32];
  unsigned major = 0, minor = 0, patch = 0;
  LLVMGetVersion(&major, &minor, &patch);
  snprintf(buf, sizeof buf, "%u.%u.%u", major, minor, patch);
  return buf;
}
