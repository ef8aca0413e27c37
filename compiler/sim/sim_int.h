/* sim_int.h: what timeline.c shares with trace.c inside the sim stage (not part of its API). */
#ifndef SHARDC_SIM_INT_H
#define SHARDC_SIM_INT_H

#include "timeline.h"

bool sim__ran(const SimGraph *g);
const char *sim__device_name(const SimGraph *g, int device);
int64_t sim__device_represents(const SimGraph *g, int device);
const char *sim__stream_name(const SimGraph *g, int stream);
/* The task's name; *file (NULL when it has no location) and *line from its SrcLoc. */
const char *sim__task_name(const SimGraph *g, int task, const char **file, int *line);

#endif
