/* Device connectors between ranks of one host (dev_conn.c): p2p regions in
 * device memory shared with CUDA IPC, or host shared memory registered with
 * cudaHostRegister. dev_exec.c sets them up per channel and hands them to
 * k_sched as dev_sched.h's ds_chan. */
#ifndef COLLIE_DEVICE_DEV_CONN_H
#define COLLIE_DEVICE_DEV_CONN_H

#include "device/dev_sched.h"
#include "nccl.h"

struct ncclComm;
struct dconn_tab;

/* Sets up channel ch's connectors with this rank's ring and tree peers
 * (every rank calls it for the same channels in the same order); `stream`
 * is a non-blocking cudaStream_t for clearing new regions. */
ncclResult_t dconn_setup(struct ncclComm* comm, struct dconn_tab** t, int ch, int p2p_disable, void* stream);
/* Fills one channel of a kernel's work with the connectors set up. */
void dconn_wire(const struct dconn_tab* t, int rank, int ch, struct ds_chan* out);
/* Only once no kernel uses them. */
void dconn_free(struct dconn_tab* t);

#endif
