"""Loopback ports for tests that must name one before anything listens on it
(MASTER_PORT, NCCL_COMM_ID). Picked at random below the kernel's ephemeral
range: a port the kernel handed out (bind to 0) and the test then closed can
go to any other test's outgoing connection before the listener binds it
("Address already in use", seen once in a stress run); a port below the range
is taken only by another test that picked the same one. Used by
test_torch_hvd.py and torch_dist_launch.py."""

import random
import socket


def _ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        lo = 32768
    return lo if lo > 11024 else 32768


def free_ports(count=1):
    """The first of `count` consecutive loopback ports that are all free now."""
    lo = _ephemeral_low()
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(10000, lo - count)
        socks = []
        try:
            for k in range(count):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port + k))
            return port
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no %d consecutive free ports below %d" % (count, lo))
