/* collie's own extensions to the NCCL API: library version, launcher-aware
 * world initialisation and per-peer information. Everything here is exported
 * with the collie_ prefix; the NCCL API itself is in nccl.h. */
#ifndef COLLIE_H_
#define COLLIE_H_

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"

#ifdef __cplusplus
extern "C" {
#endif

/** collie's own version (the NCCL API level it implements is NCCL_VERSION_CODE). */
#define COLLIE_VERSION_MAJOR 0
#define COLLIE_VERSION_MINOR 1
#define COLLIE_VERSION_PATCH 0
#define COLLIE_VERSION_CODE (COLLIE_VERSION_MAJOR * 10000 + COLLIE_VERSION_MINOR * 100 + COLLIE_VERSION_PATCH)

/**
 * @brief Version of the loaded collie library.
 * @return COLLIE_VERSION_CODE of the library (not of this header).
 * Thread-safe.
 */
int collie_version(void);

/**
 * @brief Creates the world communicator from whatever launcher started the process.
 *
 * Rank and size come from the first complete set found among: collie-run
 * (COLLIE_RANK, COLLIE_SIZE), Open MPI (OMPI_COMM_WORLD_RANK/SIZE), PMI
 * (PMI_RANK/PMI_SIZE), Slurm (SLURM_PROCID/SLURM_NTASKS) and torchrun-style
 * RANK/WORLD_SIZE. The bootstrap root is NCCL_COMM_ID when set, otherwise
 * MASTER_ADDR with port MASTER_PORT+1 (MASTER_PORT itself belongs to the
 * launcher's own store); rank 0 serves the root. COLLIE_BOOTSTRAP_SECRET, when
 * the launcher sets it (collie-run does), authenticates the bootstrap.
 *
 * @param [out] comm  the new communicator
 * @return ncclSuccess; ncclInvalidArgument if comm is NULL; ncclInvalidUsage
 *         if no launcher environment or root address is found (the message
 *         from ncclGetLastError says what is missing); any ncclCommInitRank error.
 * Blocking: returns when all ranks have joined, or on error/timeout.
 */
ncclResult_t collie_comm_init_from_env(ncclComm_t* comm);

/** What a communicator learned about one of its ranks at init. */
typedef struct {
  size_t size;            /**< [in] sizeof(collie_peer_info_t) as compiled by the caller */
  int rank;               /**< rank in the communicator */
  int pid;                /**< process id on its host */
  uint64_t host_hash;     /**< hash of hostname + boot id, or of NCCL_HOSTID */
  char hostname[64];      /**< host name (NCCL_HOSTID when set) */
  int numa_node;          /**< NUMA node the process is bound to or runs on; -1 unknown */
  char cpuset[128];       /**< CPUs the process may run on, as a list ("0-3,8") */
  int cuda_dev;           /**< CUDA device index, -1 when none */
  char pci_bus_id[32];    /**< PCI bus id of that device, "" when none */
  int local_rank;         /**< index among the ranks with the same host_hash */
  int local_size;         /**< number of ranks with that host_hash */
} collie_peer_info_t;

/**
 * @brief Copies what `comm` knows about `rank`.
 * @param [in]  comm  communicator
 * @param [in]  rank  0..ncclCommCount-1
 * @param [in,out] info  info->size must be set by the caller; at most that many bytes are written
 * @return ncclSuccess, or ncclInvalidArgument for a bad comm, rank, info or info->size.
 * Thread-safe.
 */
ncclResult_t collie_comm_peer_info(ncclComm_t comm, int rank, collie_peer_info_t* info);

#ifdef __cplusplus
}
#endif

#endif /* COLLIE_H_ */
