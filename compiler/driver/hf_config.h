/* hf_config.h: a Hugging Face config.json, read key by key with its places (`shardc import`).
 *
 * In: the file's path. Out: its top-level keys in file order, each with its cJSON value and where
 * its name and its value sit in the text (cJSON keeps no places; a small scan of the text does),
 * so that every complaint is a diagnostic at file:line:col with a caret. A JSON syntax error is
 * one at the byte where cJSON stopped. Each key is then read (hf_int, hf_str, ...), or ignored
 * with the reason the generated program's header gives (hf_ignore), or left unread: hf_import.c
 * lists the unread ones as not understood. Families' rules live in hf_import.c, not here. */
#ifndef SHARDC_HF_CONFIG_H
#define SHARDC_HF_CONFIG_H

#include <cjson/cJSON.h>

#include "common.h"

typedef enum { HF_UNREAD, HF_READ, HF_IGNORED } HfKeyState;

typedef struct HfKey {
  const char *name;     /* as written (no escapes in the names hf_import.c reads) */
  const cJSON *value;
  SrcLoc name_loc;      /* the quoted name */
  SrcLoc value_loc;     /* a scalar whole; an object or an array its opening bracket */
  HfKeyState state;
  const char *why;      /* HF_IGNORED: why it changes nothing here (the header's note) */
} HfKey;

typedef struct HfConfig {
  const Source *src;
  Arena *arena;
  cJSON *root;
  HfKey *keys;          /* top-level keys, in file order */
  int nkeys;
  VEC(const char *) asked; /* every name a reader or hf_ignore was given, present or not: the keys
                              this model type knows, for a did-you-mean at a key it does not */
} HfConfig;

/* Reads and parses `path`. False after a diagnostic (unreadable, not JSON, not an object, a key
 * given twice). hf_config_free releases the cJSON tree (the arena holds the rest). */
bool hf_config_load(HfConfig *c, Arena *a, const char *path);
void hf_config_free(HfConfig *c);

/* The key, or NULL when the file lacks it. A JSON null counts as absent for the readers below
 * (Hugging Face writes `"q_lora_rank": null` for "none"), though hf_key still finds it. */
HfKey *hf_key(HfConfig *c, const char *name);
bool hf_has(HfConfig *c, const char *name);             /* present and not null */
/* Where a complaint about the whole file goes (its first line) when there is no key to point at. */
SrcLoc hf_file_loc(const HfConfig *c);

/* Readers: each marks the key read. A present value of the wrong kind is an error at the value
 * ("hidden_size = \"4096\": expected a whole number from 1 to 2^50"); *ok turns false (it is never
 * set true, so one flag collects a family's errors). Missing or null: the default, or with
 * HF_REQUIRED an error naming the key and the model type that needs it. */
#define HF_REQUIRED INT64_MIN
int64_t hf_int(HfConfig *c, const char *name, int64_t dflt, const char *model_type, bool *ok);
double hf_num(HfConfig *c, const char *name, double dflt, bool *ok);
bool hf_bool(HfConfig *c, const char *name, bool dflt, bool *ok);
const char *hf_str(HfConfig *c, const char *name, const char *dflt, bool *ok); /* in the arena */
/* True when the key holds an empty list (or is missing / null); marks it read. */
bool hf_empty_list(HfConfig *c, const char *name, bool *ok);

/* The key changes nothing the program states: noted in the header with `why`. */
void hf_ignore(HfConfig *c, const char *name, const char *why);

/* A short text of a value for messages and the header: `4096`, `"silu"`, `{"type": ...}` cut at
 * about 60 bytes. In the arena. */
const char *hf_value_text(HfConfig *c, const cJSON *v);

#endif
