/* ibemu: test-only hooks of the libibverbs emulator (tests/ibemu/ibemu.c).
 * Programs that talk verbs use the real <infiniband/verbs.h>; only the
 * emulator's own tests include this to count live objects. */
#ifndef COLLIE_IBEMU_H
#define COLLIE_IBEMU_H

struct ibemu_counts {
  int contexts, pds, mrs, cqs, qps, channels;
  long mr_regs; /* not a live count: MRs registered since the process started */
  long dmabuf_regs; /* of which through ibv_reg_dmabuf_mr */
};

/* Live object counts of this process (all zero after a clean teardown). */
void ibemu_get_counts(struct ibemu_counts* c);
/* Live QPs of this process on the emulated device `dev`. */
int ibemu_qps_on(const char* dev);

#endif
