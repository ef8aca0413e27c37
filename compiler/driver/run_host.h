/* run_host.h: the host side of running a lowered program on the runtime (cmd_run.c, the tests):
 * each device's blocks of the whole inputs and params placed on it, the entry run on one thread per
 * device, a train step's params and optimizer state carried to the next step, and the outputs
 * reassembled from the devices' blocks (partial sums added; a replicated output from the devices at
 * coordinate 0 on the axes it is replicated over), as interp_run_spmd does. */
#ifndef SHARDC_RUN_HOST_H
#define SHARDC_RUN_HOST_H

#include "interp.h"
#include "shardrt.h"

typedef struct RunSide RunSide;

/* m's entry lowered as fn: mesh NULL for the global program on one device (the module before
 * partitioning), else m's localised per-device program on that mesh (cfg's axes are set from it;
 * its timeout, cap and failure injection are kept). NULL with the reason in err. */
RunSide *run_side_open(const IrModule *m, const Mesh *mesh, RtEntry fn, const RtConfig *cfg, char *err, size_t n);
void run_side_close(RunSide *s);
/* Places every device's blocks of the whole inputs (main's order) and params (m->params order). */
bool run_side_fill(RunSide *s, Tensor *const *inputs, Tensor *const *params, char *err, size_t n);
/* One run of the entry on every device (timed). */
bool run_side_step(RunSide *s, char *err, size_t n);
/* A train step's updated params, master copies and moments become the next step's inputs, adam's
 * step count goes up by one; the other outputs are freed. */
void run_side_carry(RunSide *s);
/* Output j of the last run, whole (the caller frees it). */
Tensor *run_side_output(RunSide *s, int j);
/* Tests: adds delta to element 0 of device 0's block of output j. */
void run_side_perturb(RunSide *s, int j, double delta);
double run_side_seconds(const RunSide *s);  /* summed over the runs */
size_t run_side_peak(const RunSide *s);     /* the largest per-device peak of rt_alloc'd bytes */
int run_side_devices(const RunSide *s);
#endif
