/* sha256.h: SHA-256 (FIPS 180-4), for the on-disk cache's keys and its entries' check (objcache.c). */
#ifndef SHARDC_SHA256_H
#define SHARDC_SHA256_H

#include <stddef.h>
#include <stdint.h>

typedef struct Sha256 {
  uint32_t h[8];
  uint64_t len;        /* bytes hashed so far */
  unsigned char buf[64];
  size_t nbuf;
} Sha256;

void sha256_init(Sha256 *s);
void sha256_update(Sha256 *s, const void *data, size_t n);
void sha256_final(Sha256 *s, unsigned char out[32]);
/* out = SHA-256 of data, as 64 lowercase hex digits and a NUL */
void sha256_hex(const unsigned char digest[32], char out[65]);

#endif
