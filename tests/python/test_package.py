"""The collie package itself, in one process: how it finds libcollie, the
dtype table, the communicator's life cycle, and what it says when the engine
is missing."""

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import collie
import collie.nccl as nccl

PKG_DIR = os.path.dirname(os.path.abspath(collie.__file__))


def run_python(code, env):
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120)


def test_loaded_the_library_named_by_collie_library():
    want = os.environ.get("COLLIE_LIBRARY")
    if want:
        assert os.path.samefile(collie.library_path, want)
    major, minor, patch = collie.version()
    assert (major, minor) >= (0, 1)


def test_missing_collie_library_is_a_clear_import_error(tmp_path):
    env = dict(os.environ, COLLIE_LIBRARY=str(tmp_path / "nowhere" / "libcollie.so"))
    r = run_python("import collie", env)
    assert r.returncode != 0
    assert "ImportError" in r.stderr and "COLLIE_LIBRARY=" in r.stderr and "nowhere" in r.stderr


def test_library_found_beside_the_package(tmp_path):
    lib = os.environ.get("COLLIE_LIBRARY") or collie.library_path
    if os.sep not in lib:
        pytest.skip("library came from the system loader")
    # <prefix>/lib/python3/site-packages/collie with <prefix>/lib/libcollie.so.0
    site = tmp_path / "lib" / "python3" / "site-packages"
    shutil.copytree(PKG_DIR, site / "collie", ignore=shutil.ignore_patterns("__pycache__"))
    os.symlink(os.path.realpath(lib), tmp_path / "lib" / "libcollie.so.0")
    env = {k: v for k, v in os.environ.items() if k not in ("COLLIE_LIBRARY", "LD_LIBRARY_PATH")}
    env["PYTHONPATH"] = str(site)
    r = run_python("import collie; print(collie.library_path)", env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(tmp_path / "lib" / "libcollie.so.0")


def test_dtype_table_matches_nccl_h():
    from collie import _lib
    want = {np.int8: 0, np.uint8: 1, np.int32: 2, np.uint32: 3, np.int64: 4, np.uint64: 5,
            np.float16: 6, np.float32: 7, np.float64: 8}
    for dt, code in want.items():
        assert _lib.nccl_dtype(dt) == code
    for bad in (bool, np.complex64, np.int16, np.float128 if hasattr(np, "float128") else object):
        with pytest.raises(TypeError):
            _lib.nccl_dtype(bad)


def test_communicator_life_cycle():
    c = nccl.Communicator(1, nccl.get_unique_id(), 0)
    assert (c.rank, c.size) == (0, 1) and "rank 0 of 1" in repr(c)
    assert c.async_error() == 0
    assert isinstance(c.handle, int) and c.handle != 0
    c.destroy()
    assert "destroyed" in repr(c)
    with pytest.raises(ValueError, match="destroyed"):
        c.allreduce(np.zeros(2), np.zeros(2))
    with pytest.raises(ValueError, match="destroyed"):
        c.destroy()
    with nccl.Communicator(1, bytearray(nccl.get_unique_id()), 0) as c2:
        assert c2.allreduce(np.arange(3.0)).tolist() == [0.0, 1.0, 2.0]
    assert "destroyed" in repr(c2)
    c3 = nccl.Communicator(1, nccl.get_unique_id(), 0)
    c3.abort()
    assert "destroyed" in repr(c3)


def test_group_end_without_start():
    with pytest.raises(RuntimeError, match="without group_start"):
        nccl.group_end()


def test_from_env_without_launcher_says_what_is_missing():
    env = {k: v for k, v in os.environ.items()
           if k not in ("COLLIE_RANK", "COLLIE_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                        "PMI_RANK", "PMI_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "RANK", "WORLD_SIZE")}
    r = run_python("import collie.nccl as n\n"
                   "try:\n    n.init_from_env()\nexcept n.NcclError as e:\n    print(e.code, e)\n", env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("5 ") and "no launcher environment" in r.stdout


def test_engine_is_in_the_library():
    # src/engine is always built into libcollie: a library without it is a
    # build error, not a reason to skip the engine tests.
    assert collie.engine_available()
