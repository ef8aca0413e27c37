/* driver.h: the command line: parsed options and the subcommands that use them.
 *
 * main.c parses argv into an Options and dispatches through its command table, one line per
 * subcommand ({name, function, help}). Adding a subcommand is one `int cmd_x(const Options *)`
 * and one table line. A command returns the process's exit code: 0 success, 1 the program is wrong
 * or does not fit (diagnostics printed), 2 a usage error. */
#ifndef SHARDC_DRIVER_H
#define SHARDC_DRIVER_H

#include "diag.h"
#include "parse.h"
#include "lower.h"
#include "pipeline.h"

typedef enum { FORMAT_TEXT, FORMAT_JSON } OutputFormat;

/* -D name=N: a command-line size for a dim. */
typedef struct DimOption {
  const char *name; /* as written (not interned) */
  int64_t value;    /* > 0 */
} DimOption;

typedef struct Options {
  const char *argv0;
  const char *command;     /* "parse", "check", ... */
  const char *input;       /* the .shard file */
  DimOption *dims;         /* -D, in command-line order (a dim given twice has the same size twice:
                              two sizes are a usage error) */
  int ndims;
  const char **sets;       /* --set KEY=VALUE, in command-line order (stepset.h; a key given twice
                              must have the same value both times) */
  int nsets;
  const char *layout;      /* --layout NAME, or NULL: the first declared */
  const char *mesh;        /* --mesh NAME, or NULL: the first declared */
  const char **layouts;    /* every --layout given (check, explain and sim take several: table.h); */
  int nlayouts;            /* layout is the first */
  const char **meshes;     /* every --mesh given, likewise */
  int nmeshes;
  const char *entry;       /* --entry model.fn, or NULL */
  OutputFormat format;     /* --format text|json */
  bool emit_llvm;          /* --emit-llvm */
  bool emit_ir;            /* --emit-ir (check: print the IR, shardings included) */
  const char *output;      /* -o FILE, or NULL */
  const char *trace;       /* --trace FILE (sim), or NULL */
  bool ideal;              /* --ideal (sim: peak figures, no efficiency factors) */
  double tokens;           /* --tokens N (sim: days to train on N tokens), 0 if not given */
  double mfu;              /* --mfu R (sim: with --tokens, at this MFU), 0 if not given */
  bool shardings;          /* --shardings (explain: print every value's sharding) */
  const char *show;        /* --show NAME (explain: draw that value's blocks over the devices), or NULL */
  DiagFormat diag_format;  /* --diag-format text|machine */
  /* run, build */
  int steps;               /* --steps N (a train step's steps; 0: 1) */
  uint64_t seed;           /* --seed N */
  double timeout;          /* --timeout S (a collective's longest wait; 0: the runtime's 60 s) */
  int64_t hbm;             /* --hbm BYTES (cap per device; 0: none) */
  bool allow_nonfinite;    /* --allow-nonfinite (a NaN or infinity where both runs hold it passes) */
  const char *load;        /* --load DIR */
  const char *save;        /* --save DIR */
  const char *backend;     /* --backend threads|mpi */
  int threads_per_rank;    /* --threads-per-rank T (mpi; 0: 1) */
  const char *hostfile;    /* --hostfile FILE (run --backend mpi) */
  bool no_reference;       /* --no-reference: the one-device program neither run nor compared */
  bool no_cache;           /* --no-cache: run compiles without the on-disk object cache */
  /* plan */
  int64_t devices;         /* --devices N (0: the program's first mesh's) */
  const char *target;      /* --target NAME (NULL: the program's first mesh's) */
  int top;                 /* --top K (0: 5) */
  int argc;                /* the command line as given (run --backend mpi starts it again under mpirun) */
  char **argv;
} Options;

/* Subcommands. Those without a function yet are listed in the table with NULL and answer
 * "'x' is not implemented yet" (exit 2). */
int cmd_parse(const Options *o);
int cmd_check(const Options *o);
int cmd_explain(const Options *o);   /* explain.c */
int cmd_sim(const Options *o);       /* cmd_sim.c */
int cmd_run(const Options *o);       /* cmd_run.c */
int cmd_build(const Options *o);     /* cmd_run.c */
int cmd_import(const Options *o);    /* cmd_import.c: FILE is a Hugging Face config.json */
int cmd_plan(const Options *o);      /* cmd_plan.c: the search, plan_search.h */
int cmd_report(const Options *o);    /* cmd_report.c: one self-contained HTML page (-o FILE) */

/* Load opts->input and its imports (stdlib located from argv0). NULL with a diagnostic printed
 * when the main file cannot be opened; otherwise the program, possibly with errors reported (check
 * diag_error_count()). */
ParsedProgram *driver_load_program(const Options *o, Arena *arena);

#endif
