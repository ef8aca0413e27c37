/* shardrt_mpi.h: the MPI backend's process-level calls (library shardrt_mpi, built where CMake finds
 * MPI; docs/runtime.md, "The MPI backend"). A process that calls rt_mpi_init may open runtimes with
 * RtConfig.backend = RT_BACKEND_MPI: their devices are spread over the job's ranks, rank r running
 * devices r T .. r T + T - 1 (T = RtConfig.threads_per_rank), and every rank must open, run and
 * close the same runtimes in the same order. */
#ifndef SHARDRT_MPI_H
#define SHARDRT_MPI_H

#include "shardrt.h"

/* Whether this process was started by mpirun (or another MPI launcher), read from the environment
 * (OMPI_COMM_WORLD_SIZE, PMIX_RANK, PMI_SIZE); callable before rt_mpi_init. */
int rt_mpi_launched(void);
/* Starts MPI (MPI_Init_thread, MPI_THREAD_MULTIPLE) and registers the backend. RT_OK, or RT_E_SYS
 * with the reason in err. A second call does nothing. */
int rt_mpi_init(int *argc, char ***argv, char *err, size_t n);
/* Ends MPI (MPI_Finalize); after it no runtime of this process may use the MPI backend. */
void rt_mpi_finalize(void);
int rt_mpi_rank(void); /* this process's rank (0 before rt_mpi_init) */
int rt_mpi_size(void); /* the job's ranks (1 before rt_mpi_init) */
/* Rank 0's x on every rank (the verdict, an exit status). */
int rt_mpi_bcast_int(int x);
/* 1 when ok is nonzero on every rank. */
int rt_mpi_all(int ok);
/* main() of an executable built with `shardc build --backend mpi`: rt_mpi_init, rt_launch_main on
 * the MPI backend, the ranks agree on rank 0's exit status, rt_mpi_finalize. */
int rt_mpi_main(int argc, char **argv, const RtProgram *p);

/* The launcher's side (`shardc run --backend mpi`, compiler/driver/run_mpi.c). It creates the
 * status file (in $TMPDIR, path into path[n]) before starting mpirun and passes its path to the
 * ranks in SHARDC_MPI_STATUS; after mpirun ends it reads what each rank last said. RT_OK or
 * RT_E_SYS. */
int rt_mpi_status_create(int ndev, int ranks, int threads_per_rank, char *path, size_t n);
/* One line per rank that ended abnormally (killed, crashed, or gone without finishing), naming
 * its devices (cfg: the mesh's axes, for their coordinates) and the op each was in, with its line;
 * "" when every rank finished or was stopped by mpirun. Returns the number of such ranks, -1 when
 * the file cannot be read. */
int rt_mpi_status_report(const char *path, const RtConfig *cfg, char *buf, size_t n);

#endif
