/* outfile.h: every file shardc writes, and the files it reads that an output must never replace.
 *
 * Outputs (`build -o`, `sim --trace`, `run --save`'s arrays) are written to a new file in the
 * output's own directory, created with O_CREAT|O_EXCL|O_NOFOLLOW (a file or symlink planted under
 * that name is never reused or followed), every write checked, flushed to disk (fsync), and only
 * then renamed over the output: a full disk, an I/O error, a signal or a crash leaves the old file
 * as it was, never a truncated or half-written one. The rename replaces the directory entry, so a
 * symlink at the output's path is replaced, not written through. An existing character device,
 * FIFO or socket (`-o /dev/null`, `--trace /dev/stdout` into a pipe) is written directly: it cannot
 * be replaced, only written to. A directory is refused.
 *
 * Inputs: every regular file shardc reads (the program's sources and imports, `--load`'s arrays)
 * is noted by identity (st_dev, st_ino). An output that is one of them (the same file, through a
 * hard link or a symlink too) is refused, as gcc refuses `gcc x.c -o x.c`.
 *
 * Sets: `run --save DIR` writes several files as one set (OutSet). Each member is written as above;
 * then, with DIR locked (flock LOCK_EX) and SIGINT/SIGTERM/SIGHUP held back, all are renamed into
 * place one after the other. Readers (`run --load`) hold LOCK_SH on the directory while they read
 * (outfile_dir_open), so two saves into one directory never interleave into a mixed set, and a load
 * never sees half of one. (Only a crash or SIGKILL in the microseconds of the renames could leave a
 * mix; each file is whole in every case.)
 *
 * Cleanup: temporary files, `build`'s private directory of intermediate files (in $TMPDIR) and a
 * child process (the C compiler, in its own process group) are registered here; SIGINT, SIGTERM
 * and SIGHUP kill and reap the child's process group, remove the files, then end the process by the
 * same signal. Every function here is for the main thread. */
#ifndef SHARDC_OUTFILE_H
#define SHARDC_OUTFILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/types.h>

#define OUTFILE_DATA 0666       /* modes of new outputs, less the umask */
#define OUTFILE_EXECUTABLE 0777

/* ---- inputs ---- */

/* Notes the file open on fd (shown as path) as an input, when it is a regular file. */
void outfile_note_input(int fd, const char *path);
/* The input (as noted) that writing path would replace, following symlinks; NULL if none. */
const char *outfile_input_at(const char *path);
/* Can path be an output? False, with the reason in err ("'x.shard' is an input of this run:
 * refusing to overwrite it", "'d' is a directory"), when it is an input or a directory. Commands
 * call it before their work; outfile_open checks again. */
bool outfile_check(const char *path, char *err, size_t n);

/* ---- one output ---- */

typedef struct OutFile OutFile;
/* Starts writing path (see above); NULL with the reason in err. mode: OUTFILE_DATA or
 * OUTFILE_EXECUTABLE. */
OutFile *outfile_open(const char *path, int mode, char *err, size_t n);
/* Where to write: a stdio stream whose errors are sticky (ferror), checked by outfile_commit. */
FILE *outfile_stream(OutFile *f);
/* Flushes, checks every write, fsyncs and renames into place; frees f. False with the reason in err
 * (the old file is then untouched and the temporary one removed). */
bool outfile_commit(OutFile *f, char *err, size_t n);
/* Gives up: removes the temporary file; frees f. NULL is fine. */
void outfile_discard(OutFile *f);

/* ---- a set of outputs in one directory ---- */

typedef struct OutSet OutSet;
/* Opens dir for a set, creating it (one level) when missing, and locks it. NULL with the reason. */
OutSet *outfile_set_open(const char *dir, char *err, size_t n);
/* A new member dir/name: its stream (owned by the set). NULL with the reason: name is an input, a
 * directory, or the file cannot be created. */
FILE *outfile_set_add(OutSet *s, const char *name, char *err, size_t n);
/* Checks and fsyncs every member, then renames them all into place; unlocks and frees s. False with
 * the reason in err: then no member has replaced anything. */
bool outfile_set_commit(OutSet *s, char *err, size_t n);
/* Gives up: removes the members' temporary files, unlocks, frees s. NULL is fine. */
void outfile_set_discard(OutSet *s);

/* Opens an existing directory for reading and locks it shared (exclusive: for writing); the lock
 * holds until the descriptor is closed. -1 with the reason in err ("no such directory", "not a
 * directory"). */
int outfile_dir_open(const char *dir, bool exclusive, char *err, size_t n);

/* ---- cleanup on signals ---- */

/* path is removed (a file: unlink; is_dir: rmdir, after the files) if a signal ends the process
 * before outfile_untrack(path). The string is copied. */
void outfile_track(const char *path, bool is_dir);
void outfile_untrack(const char *path);
/* Starts argv[0] (looked up in PATH) with argv, in its own process group, registered so that a
 * signal ending shardc kills its whole group and waits for it; waits for it here. Returns its exit
 * status (0..255), or -1 with the reason in err (it could not start, or a signal killed it). */
int outfile_spawn_wait(char *const argv[], char *err, size_t n);

#endif
