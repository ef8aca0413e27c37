/* run_mpi.h: `shardc run --backend mpi` (run_mpi.c). Outside mpirun, run_mpi_launch starts mpirun
 * with this very command line (-np: the mesh's devices over --threads-per-rank) and reports a rank
 * that died; under mpirun (each rank runs shardc), run_mpi_rank_begin starts MPI and checks the
 * job's size against the mesh before any work, and run_mpi_rank_end makes every rank exit with
 * rank 0's status. docs/run.md, "Over MPI". */
#ifndef SHARDC_RUN_MPI_H
#define SHARDC_RUN_MPI_H

#include <stdbool.h>

#include "driver.h"

/* Whether this process is one of an mpirun job's ranks (from the environment). */
bool run_mpi_under_mpirun(void);
/* Outside mpirun: starts the job and waits for it; returns the exit status. */
int run_mpi_launch(const Options *o, const Mesh *mesh);
/* Under mpirun: MPI started, the ranks other than 0 silenced, the job's size checked (false with
 * a diagnostic on rank 0). */
bool run_mpi_rank_begin(const Options *o, const Mesh *mesh);
/* Rank 0 prints and saves; the others only take part. */
bool run_mpi_root(void);
/* Whether ok holds on every rank (ok itself outside MPI): the ranks decide together, so that a
 * failure on one (rank 0's one-device run, a file it could not write) ends them all. */
bool run_mpi_agree(bool ok);
/* Every rank ends with rank 0's rc; MPI ended. rc itself when MPI was not started. */
int run_mpi_rank_end(int rc);

#endif
