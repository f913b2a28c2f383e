"""Finds and loads libcollie with ctypes, and maps numpy dtypes to NCCL's.

Shared by collie.nccl (the NCCL API in include/nccl.h) and the engine
bindings in collie/__init__.py (the collie_* API in include/collie.h).
"""

import ctypes
import ctypes.util
import os

import numpy as np

_SONAMES = ("libcollie.so.0", "libcollie.so")


def _candidates():
    """Where the library is looked for, in order (see python/README.md)."""
    env = os.environ.get("COLLIE_LIBRARY")
    if env:
        # An explicit choice is never silently replaced by another library.
        return [env], True
    pkg = os.path.dirname(os.path.abspath(__file__))
    paths = []
    # Installed beside the package, or in a lib directory above it
    # (<prefix>/lib/python3.X/site-packages/collie -> <prefix>/lib).
    d = pkg
    for _ in range(4):
        paths += [os.path.join(d, n) for n in _SONAMES]
        d = os.path.dirname(d)
    paths.append(_SONAMES[0])  # the dynamic loader: LD_LIBRARY_PATH, ld.so.cache
    found = ctypes.util.find_library("collie")
    if found:
        paths.append(found)
    return paths, False


def _load():
    paths, explicit = _candidates()
    errors = []
    for p in paths:
        if os.sep in p and not os.path.exists(p):
            errors.append("%s: no such file" % p)
            continue
        try:
            return ctypes.CDLL(p, mode=ctypes.RTLD_GLOBAL), p
        except OSError as e:
            errors.append(str(e))
    if explicit:
        hint = "COLLIE_LIBRARY=%s cannot be loaded" % paths[0]
    else:
        hint = ("libcollie not found; set COLLIE_LIBRARY to the path of libcollie.so "
                "(e.g. build/libcollie.so), install it beside the package, or add its "
                "directory to LD_LIBRARY_PATH")
    raise ImportError("collie: %s (tried: %s)" % (hint, "; ".join(errors)))


lib, path = _load()

_c = ctypes
lib.ncclGetErrorString.restype = _c.c_char_p
lib.ncclGetErrorString.argtypes = [_c.c_int]
lib.ncclGetLastError.restype = _c.c_char_p
lib.ncclGetLastError.argtypes = [_c.c_void_p]
lib.collie_version.restype = _c.c_int
lib.collie_version.argtypes = []

# ncclDataType_t for each dtype numpy and NCCL both have. bfloat16 and the
# 8-bit floats have no numpy dtype, so they are not offered.
DTYPES = {
    np.dtype(np.int8): 0,
    np.dtype(np.uint8): 1,
    np.dtype(np.int32): 2,
    np.dtype(np.uint32): 3,
    np.dtype(np.int64): 4,
    np.dtype(np.uint64): 5,
    np.dtype(np.float16): 6,
    np.dtype(np.float32): 7,
    np.dtype(np.float64): 8,
}


def nccl_dtype(dt):
    """ncclDataType_t of a numpy dtype; TypeError for one NCCL lacks."""
    dt = np.dtype(dt)
    code = DTYPES.get(dt.newbyteorder("=")) if dt.isnative else None
    if code is None:
        names = ", ".join(str(d) for d in DTYPES)
        raise TypeError("collie: dtype %s is not supported (native-endian %s only)" % (dt, names))
    return code


def has_symbol(name):
    """True when the loaded library exports `name` (the engine may be absent)."""
    try:
        getattr(lib, name)
        return True
    except AttributeError:
        return False


def version():
    """collie library version as (major, minor, patch)."""
    v = lib.collie_version()
    return (v // 10000, v // 100 % 100, v % 100)
