"""The Python twin of examples/elastic_train.c, driven by collie.elastic.run:
same environment knobs (ELASTIC_STEPS, ELASTIC_STEP_MS, ELASTIC_KILL_SLOT,
ELASTIC_KILL_STEP, ELASTIC_KILL_ALWAYS, ELASTIC_WAIT_SIZE), same output
("worker N: final step=... hash=... OK"), same state hash, so
tests/elastic/test_elastic.sh checks both alike."""
import os
import signal
import sys
import time

import numpy as np

import collie
import collie.elastic

DIM = 1000


def env(name, default):
    v = os.environ.get(name, "")
    return int(v) if v else default


STEPS = env("ELASTIC_STEPS", 40)
STEP_MS = env("ELASTIC_STEP_MS", 20)
KILL_STEP = env("ELASTIC_KILL_STEP", -1)
KILL_ALWAYS = env("ELASTIC_KILL_ALWAYS", 0)
WAIT_SIZE = env("ELASTIC_WAIT_SIZE", 0)
DOOMED = (os.environ.get("ELASTIC_KILL_SLOT") is not None
          and os.environ.get("ELASTIC_KILL_SLOT") == os.environ.get("COLLIE_ELASTIC_SLOT")
          and (env("COLLIE_ELASTIC_RESTARTS", 0) == 0 or KILL_ALWAYS))
IDX = np.arange(DIM, dtype=np.int64)


def contribution(s):
    return ((s * 31 + IDX * 7) % 17).astype(np.float64)


def fnv(x, step):
    h = 0xcbf29ce484222325 ^ step
    for b in x.tobytes():
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


@collie.elastic.run
def train(state):
    while state.step < STEPS:
        if WAIT_SIZE and state.step == STEPS - 1 and collie.size() < WAIT_SIZE:
            time.sleep(0.05)
            state.check_host_updates()
            continue
        if DOOMED and (state.step >= KILL_STEP if KILL_ALWAYS else state.step == KILL_STEP):
            collie.allreduce_async(contribution(state.step), op=collie.Average, name="grad")
            time.sleep(0.001)
            os.kill(os.getpid(), signal.SIGKILL)
        state.x += collie.allreduce(contribution(state.step), op=collie.Average, name="grad")
        state.step += 1
        if STEP_MS:
            time.sleep(STEP_MS / 1000.0)
        state.commit()


def main():
    collie.elastic.init()
    me = collie.elastic.worker_id()
    state = collie.elastic.ObjectState(step=0, x=np.zeros(DIM))

    def on_reset():
        print("worker %d: %s at step %d; resetting -> epoch %d, rank %d of %d"
              % (me, state.last_reset_reason, state.step, collie.elastic.epoch(), collie.rank(),
                 collie.size()), flush=True)

    state.register_reset_callbacks([on_reset])
    train(state)
    want = sum(contribution(s) for s in range(STEPS))
    ok = bool(np.array_equal(state.x, want))
    print("worker %d: final step=%d sum=%.1f hash=%016x size=%d epoch=%d resets=%d%s"
          % (me, state.step, state.x.sum(), fnv(state.x, state.step), collie.size(),
             collie.elastic.epoch(), collie.elastic.resets(), " OK" if ok else " WRONG"), flush=True)
    collie.elastic.shutdown()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
