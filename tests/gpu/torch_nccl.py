#!/usr/bin/env python3
"""PyTorch's own process-group backend driven over collie (or over gloo).

Usage:
  python3 tests/gpu/torch_nccl.py --nprocs N [--backend nccl|gloo]
          [--device cuda|cpu] [--ddp-steps K] [--quick] [--large M]
          [--filter REGEX] [--timeout S]

The parent spawns N copies of this script (--child), each one rank with
MASTER_ADDR=127.0.0.1, a free MASTER_PORT, RANK and WORLD_SIZE in its
environment. With --device cuda every rank uses cuda:0, so two or more ranks
share one GPU (collie allows that; NVIDIA's NCCL refuses it). To run it over
collie, preload collie's libnccl.so.2 ahead of the NCCL that PyTorch ships:

  LD_PRELOAD=/path/to/build/libnccl.so.2 python3 tests/gpu/torch_nccl.py \
      --nprocs 2 --backend nccl --device cuda

Every check compares against a float64/int64 reference computed on the CPU from
deterministic, rank-dependent, non-zero inputs (a torch.Generator seeded from
the check's name and the rank). Each rank writes its results to a JSON-lines
file; the parent merges them (a check fails if it fails on any rank or is
missing on any rank), prints one PASS/FAIL/SKIP line per check with the largest
error, then `torch_nccl: N checks, F failed`, and exits non-zero on a failure.
A rank that runs past --timeout dumps its Python stacks and exits; the parent
kills every child that outlives the deadline and prints the stderr tails.
"""

import argparse
import datetime
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import zlib

LARGE_CUDA = 4 * 1024 * 1024 + 1   # ~4M elements, odd
LARGE_CPU = 1024 * 1024 + 1        # gloo on the CPU: keep the run short
LARGE_QUICK = 65537


# ----------------------------------------------------------------------------
# parent
# ----------------------------------------------------------------------------

def free_port():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def tail(path, nlines=40):
    try:
        with open(path, "r", errors="replace") as f:
            lines = f.readlines()
    except OSError:
        return "<no output>"
    return "".join(lines[-nlines:])


def merge_results(nprocs, resdir):
    order = []
    merged = {}
    for r in range(nprocs):
        path = os.path.join(resdir, "rank%d.jsonl" % r)
        if not os.path.exists(path):
            continue
        with open(path) as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                name = rec["name"]
                if name not in merged:
                    order.append(name)
                    merged[name] = {}
                merged[name][r] = rec
    return order, merged


def parent(args):
    nprocs = args.nprocs
    port = free_port()
    workdir = tempfile.mkdtemp(prefix="torch_nccl.")
    env = dict(os.environ)
    env.pop("TORCH_NCCL_BLOCKING_WAIT", None)
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               WORLD_SIZE=str(nprocs), PYTHONUNBUFFERED="1")
    child_argv = [sys.executable, os.path.abspath(__file__), "--child",
                  "--results", workdir] + args.passthrough
    procs = []

    # Each child runs in its own session (so that it can be killed with
    # everything it started); a parent stopped from outside (a harness's
    # time limit) takes them down with it instead of leaving them running.
    def kill_children():
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except OSError:
                    pass

    def stop_children(signum, frame):
        kill_children()
        sys.exit(128 + signum)
    signal.signal(signal.SIGTERM, stop_children)
    signal.signal(signal.SIGINT, stop_children)
    t0 = time.time()
    for r in range(nprocs):
        e = dict(env)
        e["RANK"] = str(r)
        e["LOCAL_RANK"] = str(r)
        out = open(os.path.join(workdir, "rank%d.out" % r), "w")
        err = open(os.path.join(workdir, "rank%d.err" % r), "w")
        p = subprocess.Popen(child_argv, env=e, stdout=out, stderr=err,
                             start_new_session=True)
        out.close()
        err.close()
        procs.append(p)

    deadline = t0 + args.timeout + 30
    timed_out = False
    while True:
        if all(p.poll() is not None for p in procs):
            break
        if time.time() > deadline:
            timed_out = True
            break
        # once one rank failed, give the others a short grace period
        if any(p.poll() not in (None, 0) for p in procs):
            deadline = min(deadline, time.time() + 30)
        time.sleep(0.2)
    if timed_out or any(p.poll() is None for p in procs):
        kill_children()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
    wall = time.time() - t0

    # rank 0's informational lines
    sys.stdout.write(tail(os.path.join(workdir, "rank0.out"), 100000))

    order, merged = merge_results(nprocs, workdir)
    nchecks = 0
    nfailed = 0
    nskipped = 0
    for name in order:
        recs = merged[name]
        nchecks += 1
        missing = [r for r in range(nprocs) if r not in recs]
        statuses = [rec["status"] for rec in recs.values()]
        errs = [rec.get("err") for rec in recs.values()
                if rec.get("err") is not None]
        tols = [rec.get("tol") for rec in recs.values()
                if rec.get("tol") is not None]
        notes = []
        for r in sorted(recs):
            n = recs[r].get("note")
            if n and n not in notes:
                notes.append(n if recs[r]["status"] != "FAIL"
                             else "rank %d: %s" % (r, n))
        if missing:
            status = "FAIL"
            notes.insert(0, "missing on ranks %s" % missing)
        elif "FAIL" in statuses:
            status = "FAIL"
        elif all(s == "SKIP" for s in statuses):
            status = "SKIP"
        else:
            status = "PASS"
        if status == "FAIL":
            nfailed += 1
        if status == "SKIP":
            nskipped += 1
        line = "%s %s" % (status, name)
        if errs:
            line += "  max_err=%.3g" % max(errs)
        if tols:
            line += " tol=%.3g" % max(tols)
        if notes:
            line += "  (%s)" % "; ".join(notes)[:400]
        print(line)

    bad_rc = []
    for r, p in enumerate(procs):
        rc = p.returncode
        if rc != 0:
            bad_rc.append((r, rc))
    if timed_out:
        print("FAIL timeout: children still running after %.0fs were killed"
              % (args.timeout + 30))
    for r, rc in bad_rc:
        print("rank %d exited with %s" % (r, rc))
    if not order:
        print("FAIL no results from any rank")
    failed_any = nfailed > 0 or bad_rc or timed_out or not order
    if failed_any:
        for r in range(nprocs):
            print("---- rank %d stderr (tail) ----" % r)
            sys.stdout.write(tail(os.path.join(workdir, "rank%d.err" % r)))
            print("---- rank %d stdout (tail) ----" % r)
            sys.stdout.write(tail(os.path.join(workdir, "rank%d.out" % r), 15))
    extra = 0
    if (bad_rc or timed_out or not order) and nfailed == 0:
        extra = 1
    print("torch_nccl: %d checks, %d failed  (%d skipped, nprocs=%d, "
          "backend=%s, device=%s, %.1fs, logs in %s)"
          % (nchecks, nfailed + extra, nskipped, nprocs, args.backend,
             args.device, wall, workdir))
    return 1 if failed_any else 0


# ----------------------------------------------------------------------------
# child (one rank)
# ----------------------------------------------------------------------------

class Skip(Exception):
    pass


class Rank:
    def __init__(self, args):
        import torch
        import torch.distributed as dist
        self.torch = torch
        self.dist = dist
        self.args = args
        self.rank = int(os.environ["RANK"])
        self.n = int(os.environ["WORLD_SIZE"])
        self.backend = args.backend
        self.cuda = args.device == "cuda"
        self.dev = torch.device("cuda:0") if self.cuda else torch.device("cpu")
        self.gloo = args.backend == "gloo"
        self.filter = re.compile(args.filter) if args.filter else None
        if args.large:
            self.large = args.large
        elif args.quick:
            self.large = LARGE_QUICK
        else:
            self.large = LARGE_CUDA if self.cuda else LARGE_CPU
        self.sizes = [1, 1001, self.large]
        self.dtypes = [torch.float32, torch.float16, torch.bfloat16,
                       torch.int32, torch.int64, torch.uint8]
        self.floats = (torch.float32, torch.float16, torch.bfloat16)
        self.eps = {torch.float32: 2.0 ** -21, torch.float16: 2.0 ** -10,
                    torch.bfloat16: 2.0 ** -7}
        self.resfile = open(os.path.join(args.results,
                                         "rank%d.jsonl" % self.rank), "w")
        self.failed = 0

    # ---- bookkeeping -------------------------------------------------------
    def record(self, name, status, err=None, tol=None, note=None):
        rec = {"name": name, "status": status}
        if err is not None:
            rec["err"] = float(err)
        if tol is not None:
            rec["tol"] = float(tol)
        if note:
            rec["note"] = note
        self.resfile.write(json.dumps(rec) + "\n")
        self.resfile.flush()
        if status == "FAIL":
            self.failed += 1

    def check(self, name, fn):
        """fn() returns (err, tol) or raises Skip/Exception."""
        if self.filter and not self.filter.search(name):
            return
        try:
            res = fn()
        except Skip as e:
            self.record(name, "SKIP", note=str(e))
            return
        except Exception as e:
            msg = "%s: %s" % (type(e).__name__, str(e).strip().split("\n")[0])
            if self.gloo and self.gloo_unsupported(e):
                self.record(name, "SKIP", note="gloo lacks it: " + msg[:160])
                return
            sys.stderr.write("rank %d check %s raised:\n%s"
                             % (self.rank, name, traceback.format_exc()))
            self.record(name, "FAIL", note=msg[:300])
            return
        err, tol = res
        ok = err == err and err <= tol   # NaN fails
        self.record(name, "PASS" if ok else "FAIL", err=err, tol=tol)

    @staticmethod
    def gloo_unsupported(e):
        s = str(e)
        return isinstance(e, (RuntimeError, ValueError, NotImplementedError)) and (
            "does not support" in s or "Invalid scalar type" in s
            or "Cannot use" in s or "not supported" in s or "no support" in s
            or "Unsupported" in s or "unsupported" in s)

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()

    # ---- data --------------------------------------------------------------
    def gen(self, name, rank, numel, dtype, kind="sum"):
        """Deterministic non-zero CPU tensor for (name, rank)."""
        torch = self.torch
        g = torch.Generator()
        g.manual_seed(zlib.crc32(("%s#%d" % (name, rank)).encode()) + 1)
        sign = torch.randint(0, 2, (numel,), generator=g) * 2 - 1
        if dtype in self.floats:
            u = torch.rand(numel, generator=g, dtype=torch.float64)
            if kind == "prod":
                v = (0.8 + 0.45 * u) * sign
            else:
                v = (0.25 + u) * sign
            return v.to(dtype)
        if dtype == torch.uint8:
            hi = 3 if kind == "prod" else 256
            return torch.randint(1, hi, (numel,), generator=g).to(dtype)
        hi = 3 if kind == "prod" else 100
        return (torch.randint(1, hi, (numel,), generator=g) * sign).to(dtype)

    def wide(self, t):
        """CPU float64 / int64 copy."""
        t = t.detach().cpu()
        if t.dtype in self.floats or t.dtype == self.torch.float64:
            return t.to(self.torch.float64)
        return t.to(self.torch.int64)

    def wrap(self, ref, dtype):
        """Integer reference wrapped to dtype's range (as the device does)."""
        torch = self.torch
        if dtype == torch.uint8:
            return ref % 256
        if dtype == torch.int32:
            return (ref + 2 ** 31) % 2 ** 32 - 2 ** 31
        return ref

    def diff(self, out, ref):
        a = self.wide(out)
        b = ref
        if a.shape != b.shape:
            raise AssertionError("shape %s != expected %s"
                                 % (tuple(a.shape), tuple(b.shape)))
        if a.numel() == 0:
            return 0.0
        d = (a.to(self.torch.float64) - b.to(self.torch.float64)).abs()
        m = d.max().item()
        if m != m:
            return float("inf")
        return m

    def reduce_ref(self, stack, op, dtype, factor=None):
        """stack: [N, numel] float64/int64. Returns (ref, tol)."""
        nr = stack.shape[0]
        isf = dtype in self.floats
        if op == "SUM":
            ref = stack.sum(0)
            mag = stack.abs().sum(0)
        elif op == "PRODUCT":
            ref = stack.prod(0)
            mag = stack.abs().prod(0)
        elif op == "MIN":
            ref = stack.min(0).values
            mag = None
        elif op == "MAX":
            ref = stack.max(0).values
            mag = None
        elif op == "AVG":
            ref = stack.sum(0) / nr
            mag = stack.abs().sum(0)
        elif op == "PREMUL_SUM":
            ref = stack.sum(0) * factor
            mag = stack.abs().sum(0) * abs(factor)
        else:
            raise ValueError(op)
        if not isf:
            return self.wrap(ref, dtype), 0.0
        if mag is None or ref.numel() == 0:
            return ref, 0.0
        tol = self.eps[dtype] * (nr + 2) * max(1.0, mag.max().item())
        return ref, tol

    def torch_op(self, op, factor=None):
        R = self.dist.ReduceOp
        if op == "PREMUL_SUM":
            return self.dist._make_nccl_premul_sum(factor)
        return getattr(R, op)

    def dev_t(self, t):
        return t.to(self.dev)

    def zeros(self, numel, dtype):
        return self.torch.zeros(numel, dtype=dtype, device=self.dev)

    # ---- checks ------------------------------------------------------------
    def run_all(self):
        torch = self.torch
        n = self.n
        floats = self.floats
        allops = ["SUM", "PRODUCT", "MIN", "MAX"]

        # all_reduce
        for numel in self.sizes:
            for dt in self.dtypes:
                tn = str(dt).replace("torch.", "")
                ops = list(allops)
                if dt in floats:
                    ops += ["AVG", "PREMUL_SUM(scalar)", "PREMUL_SUM(tensor)"]
                for op in ops:
                    name = "all_reduce %s %s n=%d" % (op, tn, numel)
                    self.check(name, lambda name=name, op=op, dt=dt, numel=numel:
                               self.t_all_reduce(name, op, dt, numel))

        # misaligned views (offset by one element inside a bigger buffer)
        for dt in (torch.float32, torch.float16, torch.int32, torch.uint8):
            for numel in (1001, self.large):
                tn = str(dt).replace("torch.", "")
                name = "all_reduce SUM %s n=%d view@+1" % (tn, numel)
                self.check(name, lambda name=name, dt=dt, numel=numel:
                           self.t_all_reduce_view(name, dt, numel))

        for numel in self.sizes:
            for dt in self.dtypes:
                tn = str(dt).replace("torch.", "")
                sfx = "%s n=%d" % (tn, numel)
                per = max(1, numel // n) if numel == self.large else numel
                psfx = "%s n=%d/rank" % (tn, per)
                self.check("broadcast each-root " + sfx,
                           lambda dt=dt, numel=numel, s=sfx:
                           self.t_broadcast("broadcast " + s, dt, numel))
                for op in ("SUM", "MAX"):
                    self.check("reduce %s each-root %s" % (op, sfx),
                               lambda dt=dt, numel=numel, op=op, s=sfx:
                               self.t_reduce("reduce %s %s" % (op, s), op, dt,
                                             numel))
                self.check("all_gather(list) " + psfx,
                           lambda dt=dt, per=per, s=psfx:
                           self.t_all_gather("all_gather " + s, dt, per, False))
                self.check("all_gather_into_tensor " + psfx,
                           lambda dt=dt, per=per, s=psfx:
                           self.t_all_gather("all_gather_t " + s, dt, per, True))
                rsops = ["SUM", "MAX"] + (["AVG"] if dt in floats else [])
                for op in rsops:
                    self.check("reduce_scatter(list) %s %s" % (op, psfx),
                               lambda dt=dt, per=per, op=op, s=psfx:
                               self.t_reduce_scatter("rs %s %s" % (op, s), op,
                                                     dt, per, False))
                    self.check("reduce_scatter_tensor %s %s" % (op, psfx),
                               lambda dt=dt, per=per, op=op, s=psfx:
                               self.t_reduce_scatter("rst %s %s" % (op, s), op,
                                                     dt, per, True))
                self.check("all_to_all_single(equal) " + psfx,
                           lambda dt=dt, per=per, s=psfx:
                           self.t_a2a_single("a2a_eq " + s, dt, per, False))
                self.check("all_to_all_single(uneven) %s base=%d" % (tn, per),
                           lambda dt=dt, per=per, s=psfx:
                           self.t_a2a_single("a2a_uneven " + s, dt, per, True))
                self.check("all_to_all(list,uneven) %s base=%d" % (tn, per),
                           lambda dt=dt, per=per, s=psfx:
                           self.t_a2a_list("a2a_list " + s, dt, per))
                self.check("gather each-root " + psfx,
                           lambda dt=dt, per=per, s=psfx:
                           self.t_gather("gather " + s, dt, per))
                self.check("scatter each-root " + psfx,
                           lambda dt=dt, per=per, s=psfx:
                           self.t_scatter("scatter " + s, dt, per))
                for mode in ("send/recv", "isend/irecv", "batch_isend_irecv"):
                    self.check("%s ring %s" % (mode, sfx),
                               lambda dt=dt, numel=numel, mode=mode, s=sfx:
                               self.t_p2p("p2p %s %s" % (mode, s), mode, dt,
                                          numel))

        self.check("barrier (store keys visible after)", self.t_barrier)
        self.check("monitored_barrier", self.t_monitored_barrier)
        self.check("new_group subsets + collectives", self.t_new_group)
        self.check("async_op all_reduce x4 + all_gather(_into_tensor), wait()",
                   self.t_async)
        self.check("non-default cuda stream all_reduce + broadcast",
                   self.t_stream)
        self.check("DDP %d steps vs single-process reference"
                   % self.args.ddp_steps, self.t_ddp)

    # all_reduce ---------------------------------------------------------------
    def t_all_reduce(self, name, op, dt, numel):
        torch = self.torch
        base = op.split("(")[0]
        if base in ("AVG", "PREMUL_SUM") and self.gloo:
            raise Skip("gloo lacks ReduceOp.%s (nccl only)" % base)
        if base == "PREMUL_SUM" and dt == torch.bfloat16:
            # PyTorch 2.11 passes the bfloat16 factor as a C float with
            # ncclBfloat16 (and reads a tensor factor as float), while the
            # NCCL API reads a scalar of the datatype (2 bytes): the factor is
            # garbage under NVIDIA's NCCL as under collie (seen on an H200,
            # 2026-11-27: max error 0.5-0.6 with the scalar, a torch
            # RuntimeError with the tensor).
            raise Skip("torch passes a float factor for bfloat16 PREMUL_SUM")
        kind = "prod" if base == "PRODUCT" else "sum"
        factor = 0.5 if base == "PREMUL_SUM" else None
        x = self.dev_t(self.gen(name, self.rank, numel, dt, kind))
        if op == "PREMUL_SUM(tensor)":
            # a device scalar of the data's dtype; newer torch takes a Tensor,
            # older torch a list of tensors
            ft = torch.tensor([factor], dtype=dt, device=self.dev)
            try:
                top = self.dist._make_nccl_premul_sum(ft)
            except TypeError:
                top = self.dist._make_nccl_premul_sum([ft])
        else:
            top = self.torch_op(base, factor)
        self.dist.all_reduce(x, op=top)
        stack = torch.stack([self.wide(self.gen(name, r, numel, dt, kind))
                             for r in range(self.n)])
        ref, tol = self.reduce_ref(stack, base, dt, factor)
        return self.diff(x, ref), tol

    def t_all_reduce_view(self, name, dt, numel):
        torch = self.torch
        full = self.gen(name, self.rank, numel + 3, dt)
        buf = self.dev_t(full)
        view = buf[1:numel + 1]
        self.dist.all_reduce(view, op=self.dist.ReduceOp.SUM)
        stack = torch.stack([self.wide(self.gen(name, r, numel + 3, dt))[1:numel + 1]
                             for r in range(self.n)])
        ref, tol = self.reduce_ref(stack, "SUM", dt)
        err = self.diff(view, ref)
        w = self.wide(buf)
        fw = self.wide(full)
        guard = max((w[0] - fw[0]).abs().item(),
                    (w[numel + 1:] - fw[numel + 1:]).abs().max().item())
        if guard != 0:
            raise AssertionError("bytes around the view were modified "
                                 "(max change %g)" % guard)
        return err, tol

    # broadcast / reduce -----------------------------------------------------------
    def t_broadcast(self, name, dt, numel):
        err = 0.0
        for root in range(self.n):
            nm = "%s root=%d" % (name, root)
            x = self.dev_t(self.gen(nm, self.rank, numel, dt))
            self.dist.broadcast(x, src=root)
            err = max(err, self.diff(x, self.wide(self.gen(nm, root, numel, dt))))
        return err, 0.0

    def t_reduce(self, name, op, dt, numel):
        torch = self.torch
        err = 0.0
        tol = 0.0
        for root in range(self.n):
            nm = "%s root=%d" % (name, root)
            mine = self.gen(nm, self.rank, numel, dt)
            x = self.dev_t(mine)
            self.dist.reduce(x, dst=root, op=self.torch_op(op))
            if self.rank == root:
                stack = torch.stack([self.wide(self.gen(nm, r, numel, dt))
                                     for r in range(self.n)])
                ref, t = self.reduce_ref(stack, op, dt)
                tol = max(tol, t)
                err = max(err, self.diff(x, ref))
            elif not self.gloo:
                # NCCL only uses recvbuff on the root; PyTorch passes the same
                # tensor as send and receive buffer, so it must be untouched.
                e = self.diff(x, self.wide(mine))
                if e != 0:
                    raise AssertionError("non-root buffer modified by reduce "
                                         "(root %d, max change %g)" % (root, e))
        return err, tol

    # all_gather -------------------------------------------------------------------
    def t_all_gather(self, name, dt, per, into_tensor):
        torch = self.torch
        x = self.dev_t(self.gen(name, self.rank, per, dt))
        ref = torch.cat([self.wide(self.gen(name, r, per, dt))
                         for r in range(self.n)])
        if into_tensor:
            out = self.zeros(per * self.n, dt)
            self.dist.all_gather_into_tensor(out, x)
            return self.diff(out, ref), 0.0
        outs = [self.zeros(per, dt) for _ in range(self.n)]
        self.dist.all_gather(outs, x)
        return self.diff(torch.cat([o.cpu() for o in outs]), ref), 0.0

    # reduce_scatter ---------------------------------------------------------------
    def t_reduce_scatter(self, name, op, dt, per, into_tensor):
        torch = self.torch
        if op == "AVG" and self.gloo:
            raise Skip("gloo lacks ReduceOp.AVG (nccl only)")
        n = self.n
        full = self.gen(name, self.rank, per * n, dt)
        out = self.zeros(per, dt)
        if into_tensor:
            self.dist.reduce_scatter_tensor(out, self.dev_t(full),
                                            op=self.torch_op(op))
        else:
            inputs = [self.dev_t(c.clone()) for c in full.split(per)]
            self.dist.reduce_scatter(out, inputs, op=self.torch_op(op))
        lo = self.rank * per
        stack = torch.stack([self.wide(self.gen(name, r, per * n, dt))[lo:lo + per]
                             for r in range(n)])
        ref, tol = self.reduce_ref(stack, op, dt)
        return self.diff(out, ref), tol

    # all_to_all ---------------------------------------------------------------------
    def split_size(self, src, dst, base):
        """Elements rank src sends to rank dst in the uneven tests (0 once)."""
        if self.n >= 2 and src == 0 and dst == 1:
            return 0
        return base * ((src + 2 * dst) % 3) + 1 + (src + dst) % 2

    def t_a2a_single(self, name, dt, per, uneven):
        torch = self.torch
        n = self.n
        if not uneven:
            ins = [per] * n
            outs = [per] * n
        else:
            b = max(1, per // 3)
            ins = [self.split_size(self.rank, j, b) for j in range(n)]
            outs = [self.split_size(j, self.rank, b) for j in range(n)]
        x = self.dev_t(self.gen(name, self.rank, sum(ins), dt))
        y = self.zeros(sum(outs), dt)
        if uneven:
            self.dist.all_to_all_single(y, x, output_split_sizes=outs,
                                        input_split_sizes=ins)
        else:
            self.dist.all_to_all_single(y, x)
        parts = []
        for j in range(n):
            if uneven:
                jins = [self.split_size(j, k, b) for k in range(n)]
            else:
                jins = [per] * n
            src = self.wide(self.gen(name, j, sum(jins), dt))
            off = sum(jins[:self.rank])
            parts.append(src[off:off + jins[self.rank]])
        return self.diff(y, torch.cat(parts)), 0.0

    def t_a2a_list(self, name, dt, per):
        n = self.n
        b = max(1, per // 3)
        ins = [self.split_size(self.rank, j, b) for j in range(n)]
        outs = [self.split_size(j, self.rank, b) for j in range(n)]
        x = self.gen(name, self.rank, sum(ins), dt)
        inputs = [self.dev_t(c.clone()) for c in x.split(ins)]
        outputs = [self.zeros(c, dt) for c in outs]
        self.dist.all_to_all(outputs, inputs)
        err = 0.0
        for j in range(n):
            jins = [self.split_size(j, k, b) for k in range(n)]
            src = self.wide(self.gen(name, j, sum(jins), dt))
            off = sum(jins[:self.rank])
            err = max(err, self.diff(outputs[j], src[off:off + jins[self.rank]]))
        return err, 0.0

    # gather / scatter -------------------------------------------------------------
    def t_gather(self, name, dt, per):
        torch = self.torch
        err = 0.0
        for root in range(self.n):
            nm = "%s root=%d" % (name, root)
            x = self.dev_t(self.gen(nm, self.rank, per, dt))
            if self.rank == root:
                lst = [self.zeros(per, dt) for _ in range(self.n)]
                self.dist.gather(x, gather_list=lst, dst=root)
                ref = torch.cat([self.wide(self.gen(nm, r, per, dt))
                                 for r in range(self.n)])
                err = max(err, self.diff(torch.cat([t.cpu() for t in lst]), ref))
            else:
                self.dist.gather(x, dst=root)
        return err, 0.0

    def t_scatter(self, name, dt, per):
        err = 0.0
        for root in range(self.n):
            nm = "%s root=%d" % (name, root)
            out = self.zeros(per, dt)
            if self.rank == root:
                full = self.gen(nm, root, per * self.n, dt)
                lst = [self.dev_t(c.clone()) for c in full.split(per)]
                self.dist.scatter(out, scatter_list=lst, src=root)
            else:
                self.dist.scatter(out, src=root)
            lo = self.rank * per
            ref = self.wide(self.gen(nm, root, per * self.n, dt))[lo:lo + per]
            err = max(err, self.diff(out, ref))
        return err, 0.0

    # point to point ---------------------------------------------------------------
    def t_p2p(self, name, mode, dt, numel):
        dist = self.dist
        n = self.n
        if n < 2:
            raise Skip("needs >= 2 ranks")
        nxt = (self.rank + 1) % n
        prv = (self.rank - 1) % n
        x = self.dev_t(self.gen(name, self.rank, numel, dt))
        y = self.zeros(numel, dt)
        even = self.rank % 2 == 0
        if mode == "send/recv":
            # even ranks send first, odd ranks receive first: no cycle of
            # blocked senders even for large messages
            if even:
                dist.send(x, dst=nxt)
                dist.recv(y, src=prv)
            else:
                dist.recv(y, src=prv)
                dist.send(x, dst=nxt)
        elif mode == "isend/irecv":
            if even:
                reqs = [dist.isend(x, dst=nxt), dist.irecv(y, src=prv)]
            else:
                reqs = [dist.irecv(y, src=prv), dist.isend(x, dst=nxt)]
            for q in reqs:
                q.wait()
        else:
            ops = [dist.P2POp(dist.isend, x, nxt), dist.P2POp(dist.irecv, y, prv)]
            for q in dist.batch_isend_irecv(ops):
                q.wait()
        self.sync()
        return self.diff(y, self.wide(self.gen(name, prv, numel, dt))), 0.0

    # barrier -------------------------------------------------------------------------
    def t_barrier(self):
        dist = self.dist
        store = None
        try:
            store = dist.distributed_c10d._get_default_store()
        except Exception:
            store = None
        for it in range(3):
            if store is not None:
                store.add("torch_nccl_barrier_%d_%d" % (it, self.rank), 1)
            dist.barrier()
            if store is not None:
                for r in range(self.n):
                    # add(key, 0) reads the counter without blocking
                    key = "torch_nccl_barrier_%d_%d" % (it, r)
                    if store.add(key, 0) != 1:
                        raise AssertionError("rank %d passed barrier %d before "
                                             "rank %d reached it" % (self.rank, it, r))
        return 0.0, 0.0

    def t_monitored_barrier(self):
        if not self.gloo:
            raise Skip("monitored_barrier is gloo only")
        self.dist.monitored_barrier(timeout=datetime.timedelta(seconds=60))
        self.dist.monitored_barrier(timeout=datetime.timedelta(seconds=60),
                                    wait_all_ranks=True)
        return 0.0, 0.0

    # new_group -----------------------------------------------------------------------
    def t_new_group(self):
        torch = self.torch
        dist = self.dist
        n = self.n
        subsets = [[0], list(range(n))]
        if n >= 3:
            subsets.append(list(range(1, n)))
        groups = [(s, dist.new_group(ranks=s)) for s in subsets]
        err = 0.0
        tol = 0.0
        for s, g in groups:
            nm = "new_group %s" % s
            if self.rank in s:
                if dist.get_world_size(group=g) != len(s):
                    raise AssertionError("group %s size %d" %
                                         (s, dist.get_world_size(group=g)))
                x = self.dev_t(self.gen(nm, self.rank, 1001, torch.float32))
                dist.all_reduce(x, group=g)
                stack = torch.stack([self.wide(self.gen(nm, r, 1001, torch.float32))
                                     for r in s])
                ref, t = self.reduce_ref(stack, "SUM", torch.float32)
                tol = max(tol, t)
                err = max(err, self.diff(x, ref))
                # broadcast from the group's last member (a global rank)
                root = s[-1]
                y = self.dev_t(self.gen(nm + " bc", self.rank, 777, torch.int32))
                dist.broadcast(y, src=root, group=g)
                err = max(err, self.diff(y, self.wide(
                    self.gen(nm + " bc", root, 777, torch.int32))))
            dist.barrier()
        # the default group still works after the sub-groups were used
        x = self.dev_t(self.gen("after groups", self.rank, 1001, torch.float32))
        dist.all_reduce(x)
        stack = torch.stack([self.wide(self.gen("after groups", r, 1001,
                                                torch.float32))
                             for r in range(n)])
        ref, t = self.reduce_ref(stack, "SUM", torch.float32)
        err = max(err, self.diff(x, ref))
        return err, max(tol, t)

    # async ------------------------------------------------------------------------------
    def t_async(self):
        torch = self.torch
        dist = self.dist
        n = self.n
        numel = min(self.large, 262145)
        xs = []
        handles = []
        for i in range(4):
            x = self.dev_t(self.gen("async %d" % i, self.rank, numel, torch.float32))
            xs.append(x)
            handles.append(dist.all_reduce(x, async_op=True))
        per = 1001
        g_in = self.dev_t(self.gen("async ag", self.rank, per, torch.int64))
        g_out = self.zeros(per * n, torch.int64)
        if self.gloo:   # gloo lacks all_gather_into_tensor: the list form
            g_list = list(g_out.split(per))
            handles.append(dist.all_gather(g_list, g_in, async_op=True))
        else:
            handles.append(dist.all_gather_into_tensor(g_out, g_in,
                                                       async_op=True))
        for h in handles:
            h.wait()
        self.sync()
        for h in handles:
            if hasattr(h, "is_completed") and not h.is_completed():
                raise AssertionError("work not completed after wait()+sync")
        err = 0.0
        tol = 0.0
        for i, x in enumerate(xs):
            stack = torch.stack([self.wide(self.gen("async %d" % i, r, numel,
                                                    torch.float32))
                                 for r in range(n)])
            ref, t = self.reduce_ref(stack, "SUM", torch.float32)
            tol = max(tol, t)
            err = max(err, self.diff(x, ref))
        ref = torch.cat([self.wide(self.gen("async ag", r, per, torch.int64))
                         for r in range(n)])
        err = max(err, self.diff(g_out, ref))
        return err, tol

    # non-default stream ----------------------------------------------------------------
    def t_stream(self):
        torch = self.torch
        if not self.cuda:
            raise Skip("cuda only")
        numel = min(self.large, 1 << 20)
        s = torch.cuda.Stream()
        src_x = self.gen("stream ar", self.rank, numel, torch.float32)
        src_b = self.gen("stream bc", self.rank, 4099, torch.float16)
        torch.cuda.synchronize()
        with torch.cuda.stream(s):
            x = src_x.to(self.dev, non_blocking=False)
            b = src_b.to(self.dev, non_blocking=False)
            self.dist.all_reduce(x)
            self.dist.broadcast(b, src=self.n - 1)
            x.mul_(2.0)   # ordered after the collective on stream s
        torch.cuda.synchronize()
        stack = torch.stack([self.wide(self.gen("stream ar", r, numel,
                                                torch.float32))
                             for r in range(self.n)])
        ref, tol = self.reduce_ref(stack, "SUM", torch.float32)
        err = self.diff(x, ref * 2)
        err = max(err, self.diff(b, self.wide(self.gen("stream bc", self.n - 1,
                                                       4099, torch.float16))))
        return err, 2 * tol

    # DDP ----------------------------------------------------------------------------------
    def make_model(self, dtype):
        torch = self.torch
        torch.manual_seed(1234)
        m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                torch.nn.Linear(16, 4))
        return m.to(dtype)

    def shard(self, step, rank, bs):
        torch = self.torch
        g = torch.Generator()
        g.manual_seed(zlib.crc32(("ddp %d %d" % (step, rank)).encode()))
        xb = torch.randn(bs, 8, generator=g, dtype=torch.float64)
        yb = torch.randn(bs, 4, generator=g, dtype=torch.float64)
        return xb, yb

    def t_ddp(self):
        torch = self.torch
        from torch.nn.parallel import DistributedDataParallel as DDP
        steps = self.args.ddp_steps
        bs = 8
        model = self.make_model(torch.float32).to(self.dev)
        if self.cuda:
            ddp = DDP(model, device_ids=[0], output_device=0)
        else:
            ddp = DDP(model)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        for step in range(steps):
            xb, yb = self.shard(step, self.rank, bs)
            opt.zero_grad()
            out = ddp(xb.to(torch.float32).to(self.dev))
            # equal shard sizes: DDP's gradient average equals the gradient of
            # the mean loss over the global batch
            loss = torch.nn.functional.mse_loss(out, yb.to(torch.float32)
                                                .to(self.dev))
            loss.backward()
            opt.step()
        self.sync()
        # single-process float64 reference on the concatenated shards
        ref = self.make_model(torch.float64)
        ropt = torch.optim.SGD(ref.parameters(), lr=0.1)
        for step in range(steps):
            parts = [self.shard(step, r, bs) for r in range(self.n)]
            xb = torch.cat([p[0] for p in parts])
            yb = torch.cat([p[1] for p in parts])
            ropt.zero_grad()
            loss = torch.nn.functional.mse_loss(ref(xb), yb)
            loss.backward()
            ropt.step()
        err = 0.0
        for p, q in zip(model.parameters(), ref.parameters()):
            err = max(err, (p.detach().cpu().to(torch.float64) - q.detach())
                      .abs().max().item())
        if self.rank == 0:
            print("DDP: %d steps, nprocs %d, max |w_ddp - w_ref| = %.3g"
                  % (steps, self.n, err))
        return err, 1e-4


def global_nccl_symbol():
    """Which loaded library the process-wide lookup of ncclGetVersion finds
    (the LD_PRELOADed one comes first), and the version it reports."""
    import ctypes

    class DlInfo(ctypes.Structure):
        _fields_ = [("dli_fname", ctypes.c_char_p),
                    ("dli_fbase", ctypes.c_void_p),
                    ("dli_sname", ctypes.c_char_p),
                    ("dli_saddr", ctypes.c_void_p)]
    try:
        glob = ctypes.CDLL(None)
        fn = glob.ncclGetVersion
    except (OSError, AttributeError):
        return "ncclGetVersion: not in the global symbol scope"
    where = "?"
    try:
        info = DlInfo()
        dladdr = glob.dladdr
        dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(DlInfo)]
        if dladdr(ctypes.cast(fn, ctypes.c_void_p), ctypes.byref(info)):
            where = os.path.realpath(info.dli_fname.decode())
    except (OSError, AttributeError):
        pass
    v = ctypes.c_int(0)
    rc = fn(ctypes.byref(v))
    return ("ncclGetVersion (global lookup) from %s: rc=%d version=%d"
            % (where, rc, v.value))


def child(args):
    deadline = args.timeout
    import faulthandler
    faulthandler.enable()
    faulthandler.dump_traceback_later(deadline, exit=True)
    signal.alarm(deadline + 15)   # backstop: default action terminates

    import torch
    import torch.distributed as dist
    import inspect

    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(0)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    kw = dict(backend=args.backend, rank=rank, world_size=world,
              timeout=datetime.timedelta(seconds=max(60, deadline - 30)))
    if cuda and "device_id" in inspect.signature(dist.init_process_group).parameters:
        kw["device_id"] = torch.device("cuda:0")
    t0 = time.time()
    dist.init_process_group(**kw)
    if rank == 0:
        print("torch %s, backend %s, device %s, world %d, init %.2fs%s"
              % (torch.__version__, args.backend, args.device, world,
                 time.time() - t0,
                 "" if "device_id" in kw else " (no device_id)"))
        if cuda:
            try:
                print("torch.cuda.nccl.version() = %s" % (torch.cuda.nccl.version(),))
            except Exception as e:
                print("torch.cuda.nccl.version() raised %s: %s"
                      % (type(e).__name__, e))
            print("GPU: %s" % torch.cuda.get_device_name(0))
        print("LD_PRELOAD=%s" % os.environ.get("LD_PRELOAD", ""))
        print(global_nccl_symbol())
        seen = []
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split()
                if len(parts) < 6:
                    continue
                path = parts[5]
                base = os.path.basename(path).lower()
                if ("nccl" in base or "collie" in base) and path not in seen:
                    seen.append(path)
        if seen:
            for p in seen:
                print("mapped: %s -> %s" % (p, os.path.realpath(p)))
        else:
            print("mapped: no library named *nccl*/*collie* in /proc/self/maps")
        sys.stdout.flush()

    rk = Rank(args)
    rk.run_all()
    rk.resfile.close()
    try:
        dist.destroy_process_group()
    except Exception as e:
        sys.stderr.write("destroy_process_group raised %s\n" % e)
        return 1
    faulthandler.cancel_dump_traceback_later()
    signal.alarm(0)
    return 1 if rk.failed else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nprocs", type=int, default=2)
    ap.add_argument("--backend", choices=["nccl", "gloo"], default="nccl")
    ap.add_argument("--device", choices=["cuda", "cpu"], default=None,
                    help="default: cuda for nccl, cpu for gloo")
    ap.add_argument("--ddp-steps", type=int, default=20)
    ap.add_argument("--quick", action="store_true",
                    help="large size %d instead of ~4M (cuda) / ~1M (cpu)"
                    % LARGE_QUICK)
    ap.add_argument("--large", type=int, default=0,
                    help="element count of the large size")
    ap.add_argument("--filter", default="",
                    help="only checks whose name matches this regex "
                    "(all ranks must use the same)")
    ap.add_argument("--timeout", type=int, default=300,
                    help="per-rank hard deadline in seconds")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--results", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.device is None:
        args.device = "cuda" if args.backend == "nccl" else "cpu"
    if args.backend == "nccl" and args.device != "cuda":
        ap.error("--backend nccl needs --device cuda")
    if args.nprocs < 1:
        ap.error("--nprocs must be >= 1")
    if args.child:
        return child(args)
    args.passthrough = ["--backend", args.backend, "--device", args.device,
                        "--ddp-steps", str(args.ddp_steps),
                        "--timeout", str(args.timeout)]
    if args.quick:
        args.passthrough.append("--quick")
    if args.large:
        args.passthrough += ["--large", str(args.large)]
    if args.filter:
        args.passthrough += ["--filter", args.filter]
    return parent(args)


if __name__ == "__main__":
    sys.exit(main())
