/* args.c: the values of command-line options, parsed alike by a built executable (launch.c) and
 * by shardc's driver: the whole string must be the value, in range, or it is a usage error. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "shardrt.h"

const char *rt_arg_value(int argc, char **argv, int *i, const char *opt) {
  const char *a = argv[*i];
  size_t n = strlen(opt);
  if (strncmp(a, opt, n) != 0) return NULL;
  if (a[n] == '=') return a + n + 1;
  if (a[n] != '\0') return NULL;
  if (*i + 1 >= argc) return "";
  return argv[++*i];
}

int rt_arg_uint(const char *s, uint64_t min, uint64_t max, uint64_t *out) {
  if (!s || !isdigit((unsigned char)s[0])) return 0; /* no sign, no space: strtoull would take " -1" */
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (*end || errno || v < min || v > max) return 0;
  *out = v;
  return 1;
}

int rt_arg_seconds(const char *s, double *out) {
  if (!s || !*s || isspace((unsigned char)s[0])) return 0;
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (*end || !isfinite(v) || !(v > 0) || v > RT_MAX_TIMEOUT_S) return 0; /* nan, inf, 0, -1, 1e9 */
  *out = v;
  return 1;
}
