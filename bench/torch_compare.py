#!/usr/bin/python3
"""torch.distributed over "collie" against "gloo", and against collie-perf.

For each rank count (collie-run -n N; both backends live in the job: the world
group is "collie", a second group of the same ranks is "gloo"), sweeps
dist.all_reduce / all_gather_into_tensor / broadcast over float32 tensors of
8 B .. --max-bytes (factor 4, and --max-bytes itself). collie-perf
(tools/collie_perf.c) times the same operations at the same sizes under
collie-run, which gives the "Python layer overhead" ratio: torch-level collie
time / collie-perf time. As collie-perf runs in other jobs (minutes apart on a
shared machine), the torch job also times a third series, "lib": the same
collective on the same tensors through collie.nccl's raw-pointer calls (the
ctypes layer, no torch), interleaved with the torch calls: collie / lib is
the cost of the torch and process-group layers measured under the same load.

Both sides time the same thing, the way collie-perf does: per size, W warm-up
calls, a barrier, then K back-to-back calls; the figure is the slowest rank's
mean time per call (collie-perf -a 3). K and W come from one table (BANDS)
used for both. The torch backends' warm-up calls come right before their own
timed calls, so neither starts with the other's data in the caches (a single
cold call after gloo's 8 MiB round measured 1.3-2x a warm one). One round is
one torch job followed by one collie-perf sweep. In the job, per operation,
collie and lib run size by size in alternating blocks (4 blocks of K/4 calls
each, which goes first alternating), then gloo runs over the same sizes in a
pass of its own: calls timed right after gloo's measured up to 1.5x slower at
4 ranks on 2 cores, and an earlier rotation of all three series made collie
follow gloo every time.
--reps rounds alternate so the noise of a shared machine falls on both sides
alike, and each cell is the median over the rounds.
Then the step time (forward, backward, SGD step) of a model on synthetic data:
torchvision's ResNet-18 (python3-torchvision) on 3x64x64 images, else a
comparable small CNN, under DDP over collie, DDP over gloo, and
collie.torch.DistributedOptimizer when that API is present (last round only).

Usage:
  bench/torch_compare.py [--build build] [--ranks 2,4] [--max-bytes 256M] [--reps 5]
                         [--ops all_reduce,all_gather,broadcast] [--steps 10] [--batch 16]
                         [--model resnet18|cnn|none] [--doc] [--json FILE]
--doc writes the tables (and a plot when gnuplot is installed) into
docs/BENCHMARKS.md between <!-- torch_compare:begin --> and <!-- torch_compare:end -->.
Needs /usr/bin/python3 with Debian's python3-torch; the library and collie-run
come from --build. Sizes: all_gather's is the gathered (output) size, as in
collie-perf and nccl-tests.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
OPS = ("all_reduce", "all_gather", "broadcast")


def parse_size(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    s = s.strip().upper().rstrip("B") or "0"
    return int(float(s[:-1]) * mult[s[-1]]) if s[-1] in mult else int(s)


def human(n):
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return "%d %s" % (n // div, unit)
    return "%d B" % n


def sizes_upto(max_bytes):
    """8 B, 32 B, ... by 4, and max_bytes itself when it is not on that grid."""
    out, s = [], 8
    while s <= max_bytes:
        out.append(s)
        s *= 4
    if max_bytes >= 8 and out[-1] != max_bytes:
        out.append(max_bytes)
    return out


# (largest size of the band, timed calls K, warm-up calls W): used by the torch
# rounds and by collie-perf alike.
BANDS = ((32 << 10, 100, 5), (2 << 20, 20, 2), (32 << 20, 10, 2), (1 << 62, 3, 1))


def band(size):
    """(K, W) for a size."""
    for top, iters, warm in BANDS:
        if size <= top:
            return iters, warm
    return BANDS[-1][1:]


# ---------------------------------------------------------------- worker (one rank)

def worker(args):
    import torch
    import torch.distributed as dist
    import collie.torch.distributed  # registers "collie"

    dist.init_process_group("collie")
    rank, n = dist.get_rank(), dist.get_world_size()
    groups = {"collie": None, "gloo": dist.new_group(backend="gloo")}
    comm = collie.torch.distributed.communicator()
    sizes = sizes_upto(args.max_bytes)
    result = {"ranks": n, "coll": {}, "model": {}}

    def slowest(seconds):
        t = torch.tensor([seconds], dtype=torch.float64)
        dist.all_reduce(t, dist.ReduceOp.MAX)
        return t.item()

    def make(op, size):
        elems = max(size // 4, 1)
        if op == "all_gather":
            per = max(elems // n, 1)
            return torch.ones(per), torch.empty(per * n)
        return torch.ones(elems), None

    def call(op, backend, a, b):
        if backend == "lib":  # the library through ctypes: float32 (7), sum (0)
            if op == "all_reduce":
                comm.allreduce_ptr(a.data_ptr(), a.data_ptr(), a.numel(), 7, 0)
            elif op == "broadcast":
                comm.broadcast_ptr(a.data_ptr(), a.data_ptr(), a.numel(), 7, 0)
            else:
                comm.allgather_ptr(a.data_ptr(), b.data_ptr(), a.numel(), 7)
            return
        g = groups[backend]
        if op == "all_reduce":
            dist.all_reduce(a, group=g)
        elif op == "broadcast":
            dist.broadcast(a, 0, group=g)
        elif hasattr(dist, "all_gather_into_tensor") and backend == "collie":
            dist.all_gather_into_tensor(b, a, group=g)
        else:
            # gloo in torch 1.13 has no all_gather_into_tensor: the list form
            # into views of one output tensor (no extra copy on gloo's side).
            dist.all_gather(list(b.chunk(n)), a, group=g)

    # Which series runs right after gloo matters: at 4 ranks on 2 cores the
    # collie calls timed right after gloo's measured up to 1.5x slower than the
    # same calls timed a moment later (a rotation of all three made collie
    # follow gloo in every round). So per operation the collie and lib series
    # run first, size by size, then gloo's in a pass of its own over the same
    # sizes. collie and lib are timed in alternating blocks (BLOCKS of them,
    # K/BLOCKS calls each, which goes first alternating by block and by
    # round): this machine's speed moves in phases of seconds, and blocks
    # that close together share the phase.
    BLOCKS = 4

    def timed(op, backends, a, b, size):
        # As collie-perf: warm-up calls of each backend, a barrier, then the
        # timed calls; the slowest rank's mean per call, summed over blocks.
        iters, warm = band(size)
        blocks = min(BLOCKS, iters) if len(backends) > 1 else 1
        per = [iters // blocks + (1 if j < iters % blocks else 0) for j in range(blocks)]
        total = dict.fromkeys(backends, 0.0)
        for backend in backends:
            for _ in range(warm):
                call(op, backend, a, b)
        pairs = []
        for j in range(blocks):
            order = backends if (j + args.round) % 2 == 0 else backends[::-1]
            block = {}
            for backend in order:
                dist.barrier()
                t0 = time.perf_counter()
                for _ in range(per[j]):
                    call(op, backend, a, b)
                block[backend] = slowest(time.perf_counter() - t0)
                total[backend] += block[backend]
            if len(backends) > 1 and block[backends[1]] > 0:
                pairs.append(block[backends[0]] / block[backends[1]])
        out = {bk: t / iters * 1e6 for bk, t in total.items()}
        if pairs:
            out["pairs"] = pairs  # collie / lib per block
        return out

    for op in args.ops:
        cells = result["coll"].setdefault(op, {})
        for series in (("collie", "lib"), ("gloo",)):
            for size in sizes:
                if op == "all_gather" and size < 4 * n:
                    continue  # less than one float per rank
                a, b = make(op, size)
                cell = cells.setdefault(size, {})
                cell.update(timed(op, series, a, b, size))
                if rank == 0 and "gloo" in cell:
                    print("torch_compare: %d ranks %-10s %10s collie %10.1f us  lib %10.1f us  gloo %10.1f us" % (
                        n, op, human(size), cell["collie"], cell["lib"], cell["gloo"]), flush=True)
                del a, b

    if args.model != "none":
        result["model"] = model_steps(args, groups, rank, n, slowest)
    if rank == 0:
        with open(args.worker_out, "w") as f:
            json.dump(result, f)
    dist.destroy_process_group()


def build_model(name):
    import torch
    if name == "resnet18":
        try:
            import torchvision
            return torchvision.models.resnet18(num_classes=10), "ResNet-18 (torchvision %s)" % torchvision.__version__
        except ImportError:
            pass
    m = torch.nn.Sequential(
        torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.BatchNorm2d(32), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.BatchNorm2d(64), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(64, 128, 3, padding=1), torch.nn.BatchNorm2d(128), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(128, 10))
    why = "; torchvision not installed" if name == "resnet18" else ""
    return m, "small CNN (3 conv + BN, 0.1 M parameters%s)" % why


def model_steps(args, groups, rank, n, slowest):
    import torch
    import torch.distributed as dist
    torch.manual_seed(0)
    x = torch.randn(args.batch, 3, 64, 64)
    y = torch.randint(0, 10, (args.batch,))
    out = {}
    ways = [("DDP over collie", "collie"), ("DDP over gloo", "gloo")]
    hvd = None
    try:
        import collie.torch as hvd
        if not hasattr(hvd, "DistributedOptimizer"):
            hvd = None
    except ImportError:
        hvd = None
    if hvd is not None:
        ways.append(("collie.torch.DistributedOptimizer", "hvd"))
    for label, way in ways:
        torch.manual_seed(0)
        model, desc = build_model(args.model)
        out["model"] = desc
        if way == "hvd":
            hvd.init()
            opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                           named_parameters=model.named_parameters())
            hvd.broadcast_parameters(model.state_dict(), root_rank=0)
            net = model
        else:
            net = torch.nn.parallel.DistributedDataParallel(model, process_group=groups[way])
            opt = torch.optim.SGD(net.parameters(), lr=0.01)
        times = []
        for step in range(args.steps + 2):
            dist.barrier()
            t0 = time.perf_counter()
            opt.zero_grad()
            torch.nn.functional.cross_entropy(net(x), y).backward()
            opt.step()
            if step >= 2:  # two warm-up steps
                times.append(slowest(time.perf_counter() - t0))
        out[label] = statistics.median(times) * 1e3
        if rank == 0:
            print("torch_compare: %d ranks %s: %.1f ms/step" % (n, label, out[label]), flush=True)
        if way == "hvd":
            hvd.shutdown()
        del net, opt, model
    return out


# ---------------------------------------------------------------- driver

def collie_perf(build, n, op, max_bytes, env):
    """{size: us} from collie-perf at the worker's sizes, K and W (BANDS), the
    slowest rank's time (-a 3, as the torch side takes); in-place for
    all_reduce/broadcast (torch calls them in place), out-of-place for
    all_gather. One collie-perf job per run of factor-4 sizes in one band."""
    res = {}
    runs = []
    for size in sizes_upto(max_bytes):
        if runs and band(runs[-1][-1]) == band(size) and runs[-1][-1] * 4 == size:
            runs[-1].append(size)
        else:
            runs.append([size])
    for sizes in runs:
        iters, warm = band(sizes[0])
        cmd = [os.path.join(build, "collie-run"), "-n", str(n), os.path.join(build, "collie-perf"), op,
               "-b", str(sizes[0]), "-e", str(sizes[-1]), "-f", "4", "-n", str(iters), "-w", str(warm),
               "-c", "0", "-a", "3"]
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, timeout=1800)
        text = p.stdout.decode("utf-8", "replace")
        if p.returncode != 0:
            print("torch_compare: collie-perf failed (%s):\n%s" % (" ".join(cmd), text[-2000:]), file=sys.stderr)
            continue
        for line in text.splitlines():
            f = line.split()
            if len(f) >= 13 and f[0].isdigit():
                res[int(f[0])] = float(f[9] if op != "all_gather" else f[5])
    return res


def run_job(args, n, env, rnd, model):
    """Round `rnd`: the torch job at n ranks (the round picks which series goes
    first in every cell); the model step times only when `model`."""
    with tempfile.TemporaryDirectory(prefix="torch_compare.") as tmp:
        out = os.path.join(tmp, "result.json")
        cmd = [os.path.join(args.build, "collie-run"), "-n", str(n), "--timeout", str(args.timeout),
               sys.executable, os.path.abspath(__file__), "--worker", "--worker-out", out,
               "--max-bytes", str(args.max_bytes), "--round", str(rnd), "--ops", ",".join(args.ops),
               "--steps", str(args.steps), "--batch", str(args.batch), "--model", args.model if model else "none"]
        rc = subprocess.call(cmd, env=env)
        if rc != 0 or not os.path.exists(out):
            print("torch_compare: the %d-rank job failed (exit %d)" % (n, rc), file=sys.stderr)
            return None
        with open(out) as f:
            data = json.load(f)
    data["coll"] = {op: {int(s): v for s, v in cells.items()} for op, cells in data["coll"].items()}
    return data


def median_cells(rounds):
    """The worker results of several rounds -> one, each cell the median."""
    coll = {}
    for data in rounds:
        for op, cells in data["coll"].items():
            for size, cell in cells.items():
                for backend, us in cell.items():
                    coll.setdefault(op, {}).setdefault(size, {}).setdefault(backend, []).append(us)
    out = {"ranks": rounds[0]["ranks"], "model": {}, "rounds": len(rounds), "samples": coll,
           "coll": {op: {size: {bk: statistics.median(v) for bk, v in cell.items() if bk != "pairs"}
                         for size, cell in cells.items()} for op, cells in coll.items()}}
    # collie and lib ran in alternating blocks in the same processes, so their
    # ratio is taken per block (paired) and the median over every block of
    # every round reported: this machine's speed moves in phases, and single
    # calls now and then take milliseconds (the VM's CPUs are shared), which a
    # ratio of two means or medians mixes in.
    for op, cells in coll.items():
        for size, cell in cells.items():
            pairs = [r for block in cell.get("pairs", []) for r in block]
            if pairs:
                out["coll"][op][size]["collie/lib"] = statistics.median(pairs)
            cell.pop("pairs", None)
    for data in rounds:
        out["model"] = data.get("model") or out["model"]
    return out


def tables(results, perf, args):
    lines = []
    for n, data in results.items():
        for op in args.ops:
            cells = data["coll"].get(op, {})
            lines += ["", "#### %s, %d ranks" % (op, n), "",
                      "| size | collie (us) | gloo (us) | gloo / collie | collie-perf (us) | collie / collie-perf "
                      "| lib (us) | collie / lib |",
                      "|---:|---:|---:|---:|---:|---:|---:|---:|"]
            for size in sorted(cells):
                c, g, lib = cells[size]["collie"], cells[size]["gloo"], cells[size].get("lib")
                cl = cells[size].get("collie/lib")
                p = perf.get((n, op), {}).get(size)
                lines.append("| %s | %.1f | %.1f | %.1f | %s | %s | %s | %s |" % (
                    human(size), c, g, g / c if c else 0, "%.1f" % p if p else "-",
                    "%.2f" % (c / p) if p else "-", "%.1f" % lib if lib else "-",
                    "%.2f" % cl if cl else "-"))
        m = data.get("model") or {}
        if m:
            lines += ["", "#### Step time, %s, batch %d per rank of 3x64x64, %d ranks" % (m.get("model"), args.batch, n),
                      "", "| way | ms / step (median of %d) |" % args.steps, "|---|---:|"]
            for k, v in m.items():
                if k != "model":
                    lines.append("| %s | %.1f |" % (k, v))
    return lines


def summary(results, perf, args):
    """The two targets: collie / collie-perf <= 1.3 at >= 1 MiB, gloo / collie > 1
    everywhere; and collie / lib at >= 1 MiB."""
    worst_perf, worst_gloo, worst_lib, over, slower = None, None, None, [], []
    for n, data in results.items():
        for op in args.ops:
            for size, cell in sorted(data["coll"].get(op, {}).items()):
                c, g = cell["collie"], cell["gloo"]
                p = perf.get((n, op), {}).get(size)
                where = "%s %d ranks %s" % (op, n, human(size))
                cl = cell.get("collie/lib")
                if cl and size >= (1 << 20) and (worst_lib is None or cl > worst_lib[0]):
                    worst_lib = (cl, where)
                if p and size >= (1 << 20):
                    if worst_perf is None or c / p > worst_perf[0]:
                        worst_perf = (c / p, where)
                    if c / p > 1.3:
                        over.append("%s (%.2f)" % (where, c / p))
                if c and (worst_gloo is None or g / c < worst_gloo[0]):
                    worst_gloo = (g / c, where)
                if c and g / c <= 1.0:
                    slower.append("%s (%.2f)" % (where, g / c))
    lines = []
    if worst_perf:
        lines.append("collie / collie-perf at >= 1 MiB: at most %.2f (%s); above 1.3: %s." % (
            worst_perf[0], worst_perf[1], ", ".join(over) if over else "none"))
        per_op = []
        for op in args.ops:
            worst = max((cell["collie"] / perf[(n, op)][size], n, size) for n, data in results.items()
                        for size, cell in data["coll"].get(op, {}).items()
                        if size >= (1 << 20) and perf.get((n, op), {}).get(size))
            per_op.append("%s %.2f (%d ranks %s)" % (op, worst[0], worst[1], human(worst[2])))
        lines.append("Per operation, the largest collie / collie-perf at >= 1 MiB: %s." % ", ".join(per_op))
    if worst_lib:
        lines.append("collie / lib at >= 1 MiB: at most %.2f (%s)." % worst_lib)
    if worst_gloo:
        lines.append("gloo / collie: at least %.1f (%s); collie not faster: %s." % (
            worst_gloo[0], worst_gloo[1], ", ".join(slower) if slower else "none"))
    return [" ".join(lines)] if lines else []


def plot(results, perf, args, png):
    """gnuplot: time vs size per op and rank count (collie, gloo, collie-perf)."""
    import shutil
    if not shutil.which("gnuplot"):
        return False
    with tempfile.TemporaryDirectory(prefix="torch_compare_plot.") as tmp:
        plots = []
        for n, data in results.items():
            for op in args.ops:
                dat = os.path.join(tmp, "%s_%d.dat" % (op, n))
                with open(dat, "w") as f:
                    for size, cell in sorted(data["coll"].get(op, {}).items()):
                        f.write("%d %g %g %g\n" % (size, cell["collie"], cell["gloo"],
                                                   perf.get((n, op), {}).get(size, float("nan"))))
                plots.append((n, op, dat))
        gp = ["set terminal pngcairo size 1200,%d font ',9' noenhanced" % (300 * len(results)),
              "set output '%s'" % png, "set multiplot layout %d,%d" % (len(results), len(args.ops)),
              "set logscale xy; set format x '%.0b%B'; set grid; set key top left; set ylabel 'us per call'"]
        for n, op, dat in plots:
            gp.append("set title '%s, %d ranks'" % (op, n))
            gp.append("plot '%s' u 1:2 w lp pt 7 ps 0.5 t 'torch collie', '' u 1:3 w lp pt 7 ps 0.5 t 'torch gloo', "
                      "'' u 1:4 w lp pt 7 ps 0.5 dt 2 t 'collie-perf'" % dat)
        gp.append("unset multiplot")
        script = os.path.join(tmp, "plot.gp")
        with open(script, "w") as f:
            f.write("\n".join(gp) + "\n")
        return subprocess.call(["gnuplot", script]) == 0


def write_doc(section):
    doc = os.path.join(ROOT, "docs", "BENCHMARKS.md")
    b, e = "<!-- torch_compare:begin -->", "<!-- torch_compare:end -->"
    text = open(doc).read() if os.path.exists(doc) else "# Benchmarks\n"
    if b in text and e in text:
        text = text[:text.index(b)] + section + text[text.index(e) + len(e):]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    with open(doc, "w") as f:
        f.write(text)
    return doc


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--max-bytes", default="256M")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--model", default="resnet18", choices=["resnet18", "cnn", "none"])
    ap.add_argument("--timeout", type=int, default=3600, help="seconds per job")
    ap.add_argument("--doc", action="store_true", help="write the section into docs/BENCHMARKS.md")
    ap.add_argument("--json", help="also write every figure to this file")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    ap.add_argument("--round", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.max_bytes = parse_size(str(args.max_bytes))
    args.ops = [o for o in args.ops.split(",") if o]
    for o in args.ops:
        if o not in OPS:
            ap.error("--ops: %s is not one of %s" % (o, ", ".join(OPS)))
    if args.worker:
        return worker(args)

    args.build = os.path.abspath(args.build)
    lib = os.path.join(args.build, "libcollie.so")
    for f in (lib, os.path.join(args.build, "collie-run"), os.path.join(args.build, "collie-perf")):
        if not os.path.exists(f):
            ap.error("%s is missing: build first (scripts/build.sh %s)" % (f, args.build))
    env = dict(os.environ, COLLIE_LIBRARY=lib,
               PYTHONPATH=os.path.join(ROOT, "python") + os.pathsep + os.environ.get("PYTHONPATH", ""),
               PYTHONDONTWRITEBYTECODE="1")
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load_start = os.getloadavg()[0]
    t0 = time.time()
    results, perf = {}, {}
    ranks = [int(x) for x in args.ranks.split(",")]
    rounds = {n: [] for n in ranks}
    perf_rounds = {(n, op): [] for n in ranks for op in args.ops}
    # Round r: every rank count's torch job, then its collie-perf sweep; the
    # model runs in the last round only.
    for r in range(args.reps):
        for n in ranks:
            data = run_job(args, n, env, r, r == args.reps - 1)
            if data is None:
                return 1
            rounds[n].append(data)
            for op in args.ops:
                perf_rounds[(n, op)].append(collie_perf(args.build, n, op, args.max_bytes, env))
    for n in ranks:
        results[n] = median_cells(rounds[n])
        for op in args.ops:
            merged = {}
            for res in perf_rounds[(n, op)]:
                for size, us in res.items():
                    merged.setdefault(size, []).append(us)
            perf[(n, op)] = {size: statistics.median(v) for size, v in merged.items()}
    import torch
    argv = []
    for a in sys.argv[1:]:  # the command, less --doc and --json FILE (where this run put its files)
        if a == "--doc" or a.startswith("--json="):
            continue
        if argv and argv[-1] == "--json":
            argv.pop()
            continue
        argv.append(a)
    cmd = "bench/torch_compare.py " + " ".join(argv)
    load_end = os.getloadavg()[0]
    head = ["<!-- torch_compare:begin -->", "## torch.distributed: collie vs gloo (bench/torch_compare.py)", "",
            "Run of %s on %d cores (%s), torch %s, %.0f s, load average %.1f at the start and %.1f at the end "
            "(other jobs on the machine). Command: `%s`." % (
                started, os.cpu_count(), os.uname().release, torch.__version__, time.time() - t0, load_start,
                load_end, cmd.strip()),
            "", "float32. Both sides timed alike, as collie-perf does: per size W warm-up calls, a barrier, K "
            "back-to-back calls (K/W: 100/5 up to 32 KiB, 20/2 up to 2 MiB, 10/2 up to 32 MiB, 3/1 above), "
            "the slowest rank's mean per call (collie-perf -a 3); each backend's warm-up right before its own "
            "timed calls. A round is one torch job followed by one collie-perf sweep; in the job, per operation, "
            "collie and lib run size by size in 4 alternating blocks of K/4 calls each (which goes first "
            "alternates), then gloo in a pass of its own over the same sizes (calls timed right after gloo's "
            "ran up to 1.5x slower at 4 ranks); each "
            "cell is the median over %d rounds. "
            "all_gather's size is the gathered output (collie: all_gather_into_tensor, gloo: all_gather into "
            "chunks of one tensor). collie-perf: in place for all_reduce and broadcast (torch calls them in "
            "place), out of place for all_gather. lib: the same collective on the same tensors through "
            "collie.nccl's raw-pointer calls (ctypes, no torch), timed in the torch job next to the collie "
            "calls, so 'collie / lib' is the cost of the torch and process-group layers under the same load "
            "(the median over all blocks of all rounds of each block's ratio: this machine's speed moves in "
            "phases, and single calls now and then take milliseconds), while collie-perf runs minutes apart "
            "(on a loaded machine its ratio carries that noise). "
            "Above 1 in 'gloo / collie': collie faster." % args.reps]
    head += [""] + summary(results, perf, args)
    png = os.path.join(ROOT, "docs", "plots", "torch_compare.png")
    body = tables(results, perf, args)
    if args.doc:
        os.makedirs(os.path.dirname(png), exist_ok=True)
        if plot(results, perf, args, png):
            head += ["", "![time per call vs size](plots/torch_compare.png)"]
    section = "\n".join(head + body + ["", "<!-- torch_compare:end -->"])
    print(section)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"results": {str(n): d for n, d in results.items()},
                       "collie_perf": {"%d %s" % k: v for k, v in perf.items()},
                       "collie_perf_rounds": {"%d %s" % k: v for k, v in perf_rounds.items()}}, f, indent=1)
    if args.doc:
        print("torch_compare: wrote %s" % write_doc(section))
    return 0


if __name__ == "__main__":
    sys.exit(main())
