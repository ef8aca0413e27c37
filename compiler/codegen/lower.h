/* lower.h: the LLVM lowering's interface to the rest of the compiler. Only the files of codegen/
 * include the LLVM-C API; everything above it (the driver) sees this header alone. */
#ifndef SHARDC_LOWER_H
#define SHARDC_LOWER_H

/* The LLVM version linked in, "19.1.7". */
const char *lower_llvm_version(void);
#endif
