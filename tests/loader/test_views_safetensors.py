#!/usr/bin/env python3
"""tests/loader/test_views_safetensors.py - the loader's tensor views equal
what the safetensors library reads from the source files.

A model written by tests/gen_model.py (F16 and F32, several shards) is
imported with the lmstore CLI; the library (liblmstore.so, through ctypes)
opens it and every view's name, dtype, shape, size and bytes are compared
with safetensors.safe_open on the original shards: a reader we did not write.
The views must also be read-only, aligned to the store alignment, and point
into the segment files (not a copy).
"""
import ctypes
import glob
import json
import os
import shutil
import subprocess
import sys

SRC = os.environ.get("LMS_SRC_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.environ.get("LMS_BUILD_DIR", "build")
BIN = os.environ.get("LMS_BIN", os.path.join(BUILD, "lmstore"))
TMP = os.environ.get("LMS_TMP", "/tmp/lmstore-test/test_views_safetensors")


def sanitizer_preload():
    """An ASan/UBSan build's library can be loaded by python only with the
    sanitizer runtimes preloaded: re-run ourselves with them."""
    cache = os.path.join(BUILD, "CMakeCache.txt")
    san = ""
    if os.path.exists(cache):
        for line in open(cache):
            if line.startswith("LMS_SANITIZE:"):
                san = line.split("=", 1)[1].strip()
    if not san or os.environ.get("LMS_PRELOADED"):
        return
    libs = []
    for name in ("libasan.so", "libubsan.so"):
        if name[3:-3] in san.replace("address", "asan").replace("undefined", "ubsan"):
            path = subprocess.run(["gcc", "-print-file-name=" + name], capture_output=True, text=True).stdout.strip()
            if os.path.isabs(path):
                libs.append(path)
    # python itself "leaks" at exit: leak checking off for this process only
    env = dict(os.environ, LMS_PRELOADED="1", LD_PRELOAD=" ".join(libs),
               LMS_ASAN_OPTIONS=os.environ.get("ASAN_OPTIONS", ""),
               ASAN_OPTIONS=os.environ.get("ASAN_OPTIONS", "") + ":detect_leaks=0")
    os.execve(sys.executable, [sys.executable] + sys.argv, env)


sanitizer_preload()

import numpy as np  # noqa: E402
from safetensors import safe_open  # noqa: E402


class Tensor(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("dtype", ctypes.c_int), ("ndim", ctypes.c_uint32),
                ("shape", ctypes.c_uint64 * 8), ("nbytes", ctypes.c_uint64), ("layer", ctypes.c_int32),
                ("host", ctypes.c_void_p), ("device", ctypes.c_void_p)]


def load_lib():
    lib = ctypes.CDLL(os.path.join(BUILD, "liblmstore.so"))
    lib.lms_store_open.argtypes = [ctypes.c_char_p, ctypes.c_uint, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
    lib.lms_model_open.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
    lib.lms_model_tensor_count.argtypes = [ctypes.c_void_p]
    lib.lms_model_tensor_count.restype = ctypes.c_size_t
    lib.lms_model_tensor_at.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    lib.lms_model_tensor_at.restype = ctypes.POINTER(Tensor)
    lib.lms_model_tensor.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.lms_model_tensor.restype = ctypes.POINTER(Tensor)
    lib.lms_model_close.argtypes = [ctypes.c_void_p]
    lib.lms_store_close.argtypes = [ctypes.c_void_p]
    lib.lms_store_alignment.argtypes = [ctypes.c_void_p]
    lib.lms_store_alignment.restype = ctypes.c_uint32
    lib.lms_dtype_name.argtypes = [ctypes.c_int]
    lib.lms_dtype_name.restype = ctypes.c_char_p
    lib.lms_last_error.restype = ctypes.c_char_p
    return lib


def check(cond, what):
    if not cond:
        print("FAIL:", what)
        sys.exit(1)


def segment_ranges(pid):
    """(lo, hi) of every mapping of a segment file in /proc/pid/maps."""
    out = []
    for line in open(f"/proc/{pid}/maps"):
        parts = line.split()
        if len(parts) >= 6 and parts[5].endswith(".seg") and "/segments/" in parts[5]:
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            out.append((lo, hi, parts[1]))
    return out


def child_env():
    """The environment for the programs we run: no preloaded runtimes."""
    env = dict(os.environ)
    if env.pop("LMS_PRELOADED", None):
        env.pop("LD_PRELOAD", None)
        env["ASAN_OPTIONS"] = env.pop("LMS_ASAN_OPTIONS", "")
    return env


def main():
    shutil.rmtree(TMP, ignore_errors=True)
    os.makedirs(TMP)
    src, store = os.path.join(TMP, "src"), os.path.join(TMP, "store")
    for dtype, name in (("F16", "m16"), ("F32", "m32")):
        d = src + "-" + name
        subprocess.run([sys.executable, os.path.join(SRC, "tests", "gen_model.py"), d, "--arch", "qwen2",
                        "--hidden", "128", "--layers", "3", "--vocab", "512", "--dtype", dtype,
                        "--shard-size", "300K"], check=True, stdout=subprocess.DEVNULL, env=child_env())
        subprocess.run([BIN, "import", d, "--store", store, "--name", name], check=True, stdout=subprocess.DEVNULL,
                       env=child_env())

    lib = load_lib()
    st = ctypes.c_void_p()
    check(lib.lms_store_open(store.encode(), 1, None, ctypes.byref(st)) == 0, "store open")
    align = lib.lms_store_alignment(st)
    for dtype, name in (("F16", "m16"), ("F32", "m32")):
        d = src + "-" + name
        ref = {}
        shards = sorted(glob.glob(os.path.join(d, "*.safetensors")))
        check(len(shards) > 1, "the model has several shards")
        for f in shards:
            with safe_open(f, framework="np") as sf:
                for k in sf.keys():
                    ref[k] = sf.get_tensor(k)
        m = ctypes.c_void_p()
        rc = lib.lms_model_open(st, name.encode(), None, ctypes.byref(m))
        check(rc == 0, f"model open: {lib.lms_last_error()}")
        n = lib.lms_model_tensor_count(m)
        check(n == len(ref), f"{n} views for {len(ref)} tensors")
        ranges = segment_ranges(os.getpid())
        check(ranges and all("w" not in r[2] for r in ranges), "segments mapped read-only")
        seen = set()
        for i in range(n):
            t = lib.lms_model_tensor_at(m, i).contents
            tname = t.name.decode()
            a = ref[tname]
            seen.add(tname)
            check(lib.lms_dtype_name(t.dtype).decode() == dtype, f"{tname}: dtype")
            check(list(t.shape[: t.ndim]) == list(a.shape), f"{tname}: shape {list(t.shape[: t.ndim])} vs {a.shape}")
            check(t.nbytes == a.nbytes, f"{tname}: size")
            check(t.host % align == 0, f"{tname}: view not aligned to {align}")
            check(any(lo <= t.host and t.host + t.nbytes <= hi for lo, hi, _ in ranges),
                  f"{tname}: view is not inside a segment mapping")
            got = ctypes.string_at(t.host, t.nbytes)
            check(got == np.ascontiguousarray(a).tobytes(), f"{tname}: bytes differ from safetensors")
            check(t.device is None, f"{tname}: host placement has no device pointer")
            by_name = lib.lms_model_tensor(m, t.name)
            check(ctypes.addressof(by_name.contents) == ctypes.addressof(t), f"{tname}: lookup by name")
        check(seen == set(ref), "every tensor seen once")
        check(not lib.lms_model_tensor(m, b"no.such.tensor"), "missing tensor -> NULL")
        err = lib.lms_last_error().decode()
        check(name in err and "no.such.tensor" in err, f"error names model and tensor: {err}")
        check(lib.lms_store_close(st) == -9, "store close with an open model: LMS_EBUSY")
        lib.lms_model_close(m)
        print(f"{name}: {n} views equal safetensors' bytes")
    check(lib.lms_store_close(st) == 0, "store close")
    shutil.rmtree(TMP, ignore_errors=True)


if __name__ == "__main__":
    main()
