/* backend.h: the interface a backend implements: how device threads are started and how their
 * bytes move. The front end (collective.c) has already checked every argument, built the
 * group and the RtCall, and set the device's `where`; a backend only executes.
 *
 * threads.c is the shared-memory backend: one process, one thread per device. mpi.c runs T devices
 * per MPI rank (docs/runtime.md, "The MPI backend"): `run` starts the rank's devices, the
 * collectives are MPI calls on a communicator per replica group the compiler emitted (RtGroups;
 * made at its first use, keyed by its members in rank order), and `stop` tells the other ranks.
 * Whatever the backend, it must keep the runtime's promises:
 *   - reductions in rank order (gather the group's blocks, then rtk_reduce), never the
 *     transport's own order, so that results do not depend on the backend or on timing;
 *   - every wait through rtsync_wait or its equivalent: abandoned on stop and after the
 *     timeout, with a message naming the device, the collective and its axes;
 *   - a device never returns from a collective while a peer may still read its buffers. */
#ifndef SHARDRT_BACKEND_H
#define SHARDRT_BACKEND_H

#include "rt_internal.h"

typedef struct RtBackend {
  const char *name;
  /* Sets up the state shared by the devices (rt->backend_state), and frees it. */
  int (*open)(Runtime *rt);
  void (*close)(Runtime *rt);
  /* Runs rtrun_device_main on every local device and returns once all of them returned:
   * RT_OK, or RT_E_SYS if a device could not be started (then already recorded). */
  int (*run)(Runtime *rt);
  /* The run stopped (rt->stopped is set): wake every local device that waits. */
  void (*stop)(Runtime *rt);
  /* The five collectives and the barrier, on the calling device. */
  int (*all_gather)(RtDevice *dev, const RtGroup *g, const RtCall *c);
  int (*reduce_scatter)(RtDevice *dev, const RtGroup *g, const RtCall *c);
  int (*all_reduce)(RtDevice *dev, const RtGroup *g, const RtCall *c);
  int (*all_to_all)(RtDevice *dev, const RtGroup *g, const RtCall *c);
  int (*permute)(RtDevice *dev, const RtGroup *g, const RtCall *c);
  int (*barrier)(RtDevice *dev, const RtGroup *g, const RtCall *c);
  /* Optional: a program's all-gather, reduce-scatter or all-reduce of several members or parts
   * (c->coll, c->ins, c->outs), each member's blocks moved where its parts put them, in one
   * rendezvous. NULL: the front end packs the members into one buffer and calls the plain op. */
  int (*members)(RtDevice *dev, const RtGroup *g, const RtCall *c);
  /* Point to point by device index; send returns once the bytes are copied. */
  int (*send)(RtDevice *dev, int dst, int tag, const void *buf, size_t bytes);
  int (*recv)(RtDevice *dev, int src, int tag, void *buf, size_t bytes);
  /* Optional. A permute posted now and completed by wait_request (NULL: `permute` runs when it is
   * posted and the wait has nothing to do). */
  int (*permute_start)(RtDevice *dev, const RtGroup *g, const RtCall *c, RtRequest *req);
  int (*wait_request)(RtDevice *dev, RtRequest *req);
  /* Optional, for a backend whose devices live in several processes (NULL: one process runs them
   * all): rt_fetch_to_root. */
  const void *(*fetch_to_root)(Runtime *rt, int device, const void *buf, size_t bytes, void *scratch);
  int (*processes_agree)(Runtime *rt, int ok, char *msg, size_t n);
  void (*bcast_from_root)(Runtime *rt, void *buf, size_t bytes); /* rt_bcast_from_root */
} RtBackend;

extern const RtBackend rt_threads_backend;

#endif
