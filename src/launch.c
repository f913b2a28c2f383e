/* collie_comm_init_from_env: finds rank, size and the root address from
 * whichever launcher started the process (collie-run, Open MPI, PMI, Slurm,
 * torchrun) and builds the world communicator through ncclCommInitRank. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bootstrap/bootstrap.h"
#include "core.h"

struct launcher {
  const char* name;
  const char* rank_var;
  const char* size_var;
};

static const struct launcher launchers[] = {
    {"collie-run", "COLLIE_RANK", "COLLIE_SIZE"},
    {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
    {"PMI", "PMI_RANK", "PMI_SIZE"},
    {"Slurm", "SLURM_PROCID", "SLURM_NTASKS"},
    {"torchrun", "RANK", "WORLD_SIZE"},
};

static int env_int(const char* name, int64_t* out) {
  const char* v = getenv(name);
  return v && *v && param_parse_int(v, out) == 0 ? 0 : -1;
}

COLLIE_EXPORT ncclResult_t collie_comm_init_from_env(ncclComm_t* comm) {
  if (comm == NULL) return err_set(ncclInvalidArgument, "collie_comm_init_from_env: comm is NULL");
  *comm = NULL;
  const struct launcher* l = NULL;
  int64_t rank = -1, size = -1;
  for (size_t i = 0; i < sizeof(launchers) / sizeof(launchers[0]); i++) {
    if (!getenv(launchers[i].rank_var) && !getenv(launchers[i].size_var)) continue;
    if (env_int(launchers[i].rank_var, &rank) != 0 || env_int(launchers[i].size_var, &size) != 0)
      return err_set(ncclInvalidUsage, "collie_comm_init_from_env: %s environment incomplete: %s=\"%s\" %s=\"%s\"",
                     launchers[i].name, launchers[i].rank_var,
                     getenv(launchers[i].rank_var) ? getenv(launchers[i].rank_var) : "(unset)", launchers[i].size_var,
                     getenv(launchers[i].size_var) ? getenv(launchers[i].size_var) : "(unset)");
    l = &launchers[i];
    break;
  }
  if (!l)
    return err_set(ncclInvalidUsage,
                   "collie_comm_init_from_env: no launcher environment found (COLLIE_RANK/COLLIE_SIZE, "
                   "OMPI_COMM_WORLD_RANK/SIZE, PMI_RANK/SIZE, SLURM_PROCID/NTASKS or RANK/WORLD_SIZE)");
  if (size < 1 || size > (1 << 24) || rank < 0 || rank >= size)
    return err_set(ncclInvalidUsage, "collie_comm_init_from_env: %s gave rank %lld of %lld", l->name, (long long)rank,
                   (long long)size);

  union sock_addr addr;
  const char* comm_id = param_str(P_NCCL_COMM_ID);
  if (comm_id) {
    NCCLCHECK(sock_parse_addr(comm_id, "NCCL_COMM_ID", &addr));
  } else {
    const char* host = param_str(P_MASTER_ADDR);
    int64_t port;
    if (!host || env_int("MASTER_PORT", &port) != 0 || port < 1 || port > 65534)
      return err_set(ncclInvalidUsage,
                     "collie_comm_init_from_env: started by %s but no root address: set NCCL_COMM_ID=host:port "
                     "(e.g. mpirun -x NCCL_COMM_ID=node0:29500) or MASTER_ADDR and MASTER_PORT, or create a "
                     "unique ID with ncclGetUniqueId and broadcast it yourself",
                     l->name);
    char buf[300];
    /* torchrun's own store owns MASTER_PORT; the bootstrap root takes the next port. */
    snprintf(buf, sizeof(buf), strchr(host, ':') ? "[%s]:%lld" : "%s:%lld", host, (long long)port + 1);
    NCCLCHECK(sock_parse_addr(buf, "MASTER_ADDR/MASTER_PORT", &addr));
  }
  ncclUniqueId id;
  NCCLCHECK(bootstrap_id_from_addr(&addr, &id));
  INFO(LOG_INIT, "collie_comm_init_from_env: %s launcher, rank %lld of %lld", l->name, (long long)rank,
       (long long)size);
  return ncclCommInitRank(comm, (int)size, id, (int)rank);
}
