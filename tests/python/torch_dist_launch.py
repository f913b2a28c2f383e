#!/usr/bin/python3
"""Launches a torch.distributed job of N ranks for the tests of the "collie"
backend (tests/python/test_torch_dist*.py, python/collie/torch/distributed.py).

Usage: torch_dist_launch.py MODE N [--timeout S] -- COMMAND...
  collie-run  COLLIE_RUN -n N COMMAND (env:// from collie-run's variables;
              COLLIE_RUN names the collie-run binary, from the environment)
  env         this script starts N processes with torchrun's variables
              (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK, ...)
  store       as env, plus COLLIE_TEST_INIT=store: the test builds a TCPStore
              itself and passes it to init_process_group(store=...)
  torchrun    /usr/bin/torchrun --standalone --nproc_per_node N COMMAND
  single      COMMAND once (it launches jobs itself); N is ignored
Exits 77 (ctest's skip) when torch or torch.distributed is missing, or for
torchrun when no torchrun is installed. One failing rank stops the others;
the whole job is bounded by --timeout (default 400 s).
"""

import os
import shutil
import signal
import subprocess
import sys
import time


def skip(msg):
    print("SKIPPED: " + msg)
    sys.exit(77)


def free_port():
    from ports import free_ports
    return free_ports(1)


def stop(procs):
    """SIGTERM every rank still running, SIGKILL what is left after 10 s."""
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    end = time.monotonic() + 10
    for p in procs:
        while p.poll() is None and time.monotonic() < end:
            time.sleep(0.05)
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


def run_ranks(n, cmd, extra_env, timeout):
    port = free_port()
    procs = []
    for r in range(n):
        env = dict(os.environ)
        # collie-run's variables would take precedence; this mode is torchrun's.
        for k in ("COLLIE_RANK", "COLLIE_SIZE", "COLLIE_LOCAL_RANK", "COLLIE_LOCAL_SIZE", "NCCL_COMM_ID"):
            env.pop(k, None)
        env.update(extra_env)
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r), WORLD_SIZE=str(n),
                   LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(n), GROUP_RANK="0")
        procs.append(subprocess.Popen(cmd, env=env, start_new_session=True))
    end = time.monotonic() + timeout
    rc = 0
    try:
        while True:
            codes = [p.poll() for p in procs]
            bad = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
            if bad:
                r, c = bad[0]
                print("torch_dist_launch: rank %d exited with %d; stopping the others" % (r, c), flush=True)
                rc = c if c > 0 else 128 - c
                break
            if all(c == 0 for c in codes):
                break
            if time.monotonic() > end:
                print("torch_dist_launch: job still running after %d s; stopping it" % timeout, flush=True)
                rc = 124
                break
            time.sleep(0.05)
    finally:
        stop(procs)
    return rc


def main(argv):
    if "--" not in argv or len(argv) < 4:
        print(__doc__)
        return 2
    sep = argv.index("--")
    head, cmd = argv[1:sep], argv[sep + 1:]
    mode, n = head[0], int(head[1])
    timeout = 400
    if "--timeout" in head:
        timeout = int(head[head.index("--timeout") + 1])
    try:
        import torch.distributed as dist
    except ImportError:
        skip("%s cannot import torch (apt-get install python3-torch)" % sys.executable)
    if not dist.is_available():
        skip("this torch has no torch.distributed")
    if mode == "single":
        return subprocess.call(cmd)
    if mode == "collie-run":
        collie_run = os.environ.get("COLLIE_RUN")
        if not collie_run:
            print("torch_dist_launch: COLLIE_RUN must name the collie-run binary")
            return 2
        return subprocess.call([collie_run, "-n", str(n), "--tag-output", "--timeout", str(timeout)] + cmd)
    if mode in ("env", "store"):
        extra = {"COLLIE_TEST_INIT": "store"} if mode == "store" else {}
        return run_ranks(n, cmd, extra, timeout)
    if mode == "torchrun":
        tr = shutil.which("torchrun") or ("/usr/bin/torchrun" if os.path.exists("/usr/bin/torchrun") else None)
        if tr is None:
            skip("no torchrun executable")
        env = dict(os.environ)
        for k in ("COLLIE_RANK", "COLLIE_SIZE", "COLLIE_LOCAL_RANK", "COLLIE_LOCAL_SIZE", "NCCL_COMM_ID"):
            env.pop(k, None)
        probe = subprocess.run([tr, "--standalone", "--nproc_per_node", "1", "--no_python", "true"], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
        if probe.returncode != 0:
            # Debian's torch 1.13 torchrun dies in its own setup under Python
            # 3.11 (IntFlag 'Std' parsing); nothing of collie's runs by then.
            last = probe.stdout.decode("utf-8", "replace").strip().splitlines()[-1:]
            skip("%s cannot start even 'true': %s" % (tr, last[0] if last else "rc %d" % probe.returncode))
        # torchrun's argument is a script: run "python -m pytest ..." through -m.
        if len(cmd) >= 3 and cmd[1] == "-m":
            tr_cmd = [tr, "--standalone", "--nproc_per_node", str(n), "--no_python", cmd[0]] + cmd[1:]
        else:
            tr_cmd = [tr, "--standalone", "--nproc_per_node", str(n), "--no_python"] + cmd
        p = subprocess.Popen(tr_cmd, env=env, start_new_session=True)
        try:
            return p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            print("torch_dist_launch: torchrun still running after %d s; stopping it" % timeout)
            return 124
        finally:
            stop([p])  # torchrun's workers are in its session too
    print("torch_dist_launch: unknown mode %s" % mode)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
