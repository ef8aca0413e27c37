/* timeline.h: the simulator's timeline engine: a discrete-event scheduler over a task DAG.
 *
 * In: devices (each the representative of `represents` real devices that do the same work), their
 * streams, and tasks: a duration, a name and a source location, placed on one stream, with
 * dependencies (optionally a lag: the successor may start lag seconds after its predecessor
 * ends). Out: each task's start and end, per-device figures (step time, compute busy time,
 * communication time, the exposed part of it, idle time) and a Chrome trace.
 *
 * The rules, those of CUDA streams and of XLA's scheduled per-device programs:
 *   - a stream runs one task at a time; an in-order stream (the default, SIM_ORDER_PROGRAM) runs
 *     its tasks in the order they were added, a SIM_ORDER_READY stream in the order they become
 *     ready (ties by the order added);
 *   - a task starts when its stream is free, it is the stream's next task, and every dependency has
 *     ended (plus its lag);
 *   - streams run concurrently: an asynchronous collective on a `comm` stream overlaps compute
 *     wherever the dependencies allow;
 *   - tasks joined by sim_task_join start together, when the last of them could start (a
 *     collective among several simulated devices: each holds its stream while it waits).
 * Time starts at 0; sim_run computes everything in O((tasks + deps) log tasks).
 *
 * Typical use (the IR-to-tasks translation; tests/unit/test_sim.c has small examples):
 *
 *   SimGraph *g = sim_graph_new();
 *   int dev = sim_device_add(g, "stage 0", 1024);            // 1024 devices do this work
 *   int cs = sim_stream_add(g, dev, SIM_STREAM_COMPUTE, NULL);
 *   int ms = sim_stream_add(g, dev, SIM_STREAM_COMM, NULL);
 *   int ag = sim_task_add(g, ms, 1.2e-3, "all_gather wq", loc);    // FSDP: gather layer i+1 ...
 *   int mm = sim_task_add(g, cs, 3.0e-3, "matmul", loc);           // ... while layer i computes
 *   int mm2 = sim_task_add(g, cs, 3.0e-3, "matmul", loc2);
 *   sim_dep_add(g, ag, mm2, 0);                                    // layer i+1 needs its weights
 *   sim_run(g);
 *   SimDeviceStats st; sim_device_stats(g, dev, &st);             // st.exposed_comm_s == 0
 *   sim_trace_write(g, "out.json");
 *   sim_graph_free(g);
 *
 * Names are not copied: pass interned names, string literals, or strings that outlive the graph.
 */
#ifndef SHARDC_SIM_TIMELINE_H
#define SHARDC_SIM_TIMELINE_H

#include <stdbool.h>
#include <stdint.h>

#include "common.h"

/* ---- stream kinds: X(enum, name in traces and reports), in this order ---- */
#define SIM_STREAM_KINDS(X)          \
  X(SIM_STREAM_COMPUTE, "compute")   \
  X(SIM_STREAM_COMM, "comm")         \
  X(SIM_STREAM_P2P, "p2p")
typedef enum {
#define X(e, s) e,
  SIM_STREAM_KINDS(X)
#undef X
  SIM_STREAM__COUNT
} SimStreamKind;
const char *sim_stream_kind_name(SimStreamKind k); /* "compute", "comm", "p2p"; "?" */

typedef enum { SIM_ORDER_PROGRAM, SIM_ORDER_READY } SimOrder;

typedef struct SimGraph SimGraph;

SimGraph *sim_graph_new(void);
void sim_graph_free(SimGraph *g);
/* Preallocates room for this many tasks and dependencies (optional; the graph grows anyway). */
void sim_graph_reserve(SimGraph *g, int tasks, int deps);

/* A simulated device standing for `represents` (>= 1) real devices. Returns its id (0, 1, ...). */
int sim_device_add(SimGraph *g, const char *name, int64_t represents);
/* While any comm or p2p task of the device runs, its compute tasks progress `factor` (>= 1) times
 * slower: a GPU's collective kernels hold SMs the compute kernels then lack (cost-model.md,
 * "Collectives take SMs"). A compute task's end moves when a collective starts or ends during it;
 * its duration stays the work it stands for. 1 (the default) turns it off. */
void sim_device_set_contention(SimGraph *g, int device, double factor);
/* A stream on a device; name NULL means the kind's name. Returns its id, or -1 (bad device). */
int sim_stream_add(SimGraph *g, int device, SimStreamKind kind, const char *name);
/* SIM_ORDER_PROGRAM (default) or SIM_ORDER_READY, before sim_run. */
void sim_stream_set_order(SimGraph *g, int stream, SimOrder order);

/* A task of duration_s (>= 0; NaN and negatives count as 0) on a stream. Returns its id (0, 1,
 * ...), or -1 for a bad stream. */
int sim_task_add(SimGraph *g, int stream, double duration_s, const char *name, SrcLoc loc);
/* `after` may start only lag_s (>= 0) after `before` ends. False for bad ids or a self edge. */
bool sim_dep_add(SimGraph *g, int before, int after, double lag_s);
/* a and b (and everything joined to either) start at the same time. False for bad ids. */
bool sim_task_join(SimGraph *g, int a, int b);

/* The dependencies as added (e = 0 .. sim_dep_count - 1): false for a bad index. */
int sim_dep_count(const SimGraph *g);
bool sim_dep_get(const SimGraph *g, int e, int *before, int *after);
/* The task standing for task's join group (itself when it was joined to none), -1 for a bad id. */
int sim_task_join_group(const SimGraph *g, int task);

/* Schedules every task. False when some task can never start (a dependency cycle, or an order of
 * in-order streams that waits on itself); sim_unscheduled says how many. Adding tasks after a run
 * and running again is allowed (everything is recomputed). */
bool sim_run(SimGraph *g);
int sim_unscheduled(const SimGraph *g);

int sim_task_count(const SimGraph *g);
int sim_device_count(const SimGraph *g);
int sim_stream_count(const SimGraph *g);
double sim_task_start(const SimGraph *g, int task); /* NaN before sim_run or when unscheduled */
double sim_task_end(const SimGraph *g, int task);
int sim_task_stream(const SimGraph *g, int task);
int sim_stream_device(const SimGraph *g, int stream);
SimStreamKind sim_stream_kind(const SimGraph *g, int stream);
/* The end of the last task: the step time. */
double sim_makespan(const SimGraph *g);

/* Per-device figures, each in seconds over [0, makespan]:
 *   step_s          the makespan (the step ends for every device when the last task ends)
 *   compute_s       time some compute stream of the device is busy
 *   comm_s          time some comm or p2p stream is busy
 *   exposed_comm_s  time communication runs while no compute does (comm_s minus its overlap)
 *   idle_s          time nothing runs: step_s - compute_s - exposed_comm_s. Under a pipeline this
 *                   is the bubble (waiting for other stages), and the idle time at the step's end.
 *   last_end_s      when the device's own last task ends */
typedef struct SimDeviceStats {
  double step_s, compute_s, comm_s, exposed_comm_s, idle_s, last_end_s;
  int64_t tasks;      /* tasks on the device */
  int64_t represents; /* real devices this one stands for */
} SimDeviceStats;
bool sim_device_stats(const SimGraph *g, int device, SimDeviceStats *out);

/* ---- Chrome trace (trace.c) ----
 * JSON with `traceEvents` (the Trace Event Format Perfetto and chrome://tracing open): one process
 * per simulated device (named after it), one thread per stream (named after it, sorted in order
 * of creation), one complete ("X") slice per task, named "NAME (FILE:LINE)" when the task has a
 * location, times in microseconds; args hold the location, the stream kind and, for devices that
 * stand for several, `represents`. Run the graph first. */
char *sim_trace_json(const SimGraph *g); /* malloc'd; NULL if not run or out of memory */
bool sim_trace_write(const SimGraph *g, const char *path);

/* ---- step-level arithmetic ----
 * MFU (language.md): model FLOPs (no recomputation) / (step time x devices x dense bf16 peak).
 * Time to train: total FLOPs / (devices x peak x mfu), the book's arithmetic (LLaMA-3 70B on 15T
 * tokens, 6.3e24 FLOPs on 8960 v5p at 40%: about 44 days). */
double sim_mfu(double model_flops_per_step, double step_s, double devices, double peak_flops);
double sim_train_seconds(double total_flops, double devices, double peak_flops, double mfu);

#endif
