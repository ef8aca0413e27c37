/* mpi_int.h: what the MPI backend's two files share (mpi.c, the backend; mpi_host.c, the process:
 * MPI's start and end, the launcher's status file, signals). Never included by generated code. */
#ifndef SHARDRT_MPI_INT_H
#define SHARDRT_MPI_INT_H

#include <stdatomic.h>
#include <stdint.h>

#include "shardrt_mpi.h"

/* The launcher's status file (SHARDC_MPI_STATUS): a small shared mapping through which every rank
 * on the launcher's host says how far it got, so that the launcher can name a rank that died
 * (SIGKILL leaves no time to say anything) and what it was doing. */
#define RT_STATUS_MAGIC 0x53484d50u /* "SHMP" */
enum { RT_RANK_UNSEEN, RT_RANK_RUNNING, RT_RANK_FINISHED, RT_RANK_TERMINATED, RT_RANK_SIGNALLED };

typedef struct RtStatusRank {
  _Atomic int32_t state;  /* RT_RANK_* */
  _Atomic int32_t pid;
  _Atomic int32_t sig;    /* RT_RANK_SIGNALLED: the signal */
  int32_t pad;
} RtStatusRank;

typedef struct RtStatusDevice {
  _Atomic uint64_t where; /* RT_WHERE (rt_internal.h) of what it is in */
  _Atomic int32_t line;   /* the op's line (rt_at_line) */
  _Atomic int32_t done;   /* returned from its entry function in the current run */
} RtStatusDevice;

typedef struct RtStatusFile {
  uint32_t magic, ndev, ranks, threads_per_rank;
  /* then RtStatusRank[ranks], RtStatusDevice[ndev] */
} RtStatusFile;

static inline RtStatusRank *rt_status_ranks(RtStatusFile *f) { return (RtStatusRank *)(f + 1); }
static inline RtStatusDevice *rt_status_devices(RtStatusFile *f) {
  return (RtStatusDevice *)(rt_status_ranks(f) + f->ranks);
}
static inline size_t rt_status_bytes(int ndev, int ranks) {
  return sizeof(RtStatusFile) + (size_t)ranks * sizeof(RtStatusRank) + (size_t)ndev * sizeof(RtStatusDevice);
}

/* mpi_host.c: this process's mapping of the status file, or NULL (none, or it does not fit the
 * mesh: ndev and ranks must match). */
RtStatusFile *rtmpi_status(int ndev, int ranks);
/* ... this rank ends the job on purpose (MPI_Abort): not to be blamed as a rank that died. */
void rtmpi_mark_aborting(void);

/* mpi.c */
extern const struct RtBackend rt_mpi_backend;

#endif
