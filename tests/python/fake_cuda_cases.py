"""fake_cuda_cases.py - device memory in Python without a GPU: cases that run
in a process of their own whose libcuda.so.1 is the test double of the CUDA
driver (build/tests/fake_cuda, through LD_LIBRARY_PATH, which a running
process cannot change). test_device_arrays.py runs each:
python3 fake_cuda_cases.py CASE; exit status 0 when it passed.

The fake's device memory is PROT_NONE to the CPU; its streams run in order,
only when waited for; fake_cuda_hold(ptr, 1) holds copies into an
allocation (support/fake_cuda/fake_cuda.c). Both engines live here, on
127.0.0.1 over tcp (device memory staged).
"""

import ctypes
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

import ferry  # noqa: E402

SIZE = 300 * 1024
NOT_READY = 600

cu = ctypes.CDLL("libcuda.so.1")
cu.cuMemAlloc_v2.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
cu.cuMemHostAlloc.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
cu.cuStreamCreate.argtypes = [ctypes.c_void_p, ctypes.c_uint]
cu.cuEventCreate.argtypes = [ctypes.c_void_p, ctypes.c_uint]
cu.cuMemcpyHtoD_v2.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t]
cu.cuMemcpyDtoH_v2.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t]
cu.cuMemcpyHtoDAsync_v2.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t,
                                    ctypes.c_void_p]
cu.cuMemcpyDtoHAsync_v2.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t,
                                    ctypes.c_void_p]
cu.cuEventRecord.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
cu.cuEventQuery.argtypes = [ctypes.c_void_p]
cu.cuEventSynchronize.argtypes = [ctypes.c_void_p]
cu.fake_cuda_hold.argtypes = [ctypes.c_uint64, ctypes.c_int]
cu.fake_cuda_hold.restype = None
cu.fake_cuda_held_wait.restype = None


def check(rc, what):
    assert rc == 0, "%s: CUDA error %d" % (what, rc)


def setup_driver():
    """The test's context, current on this thread for its own calls (ferry
    pushes and pops its own around each of its calls)."""
    check(cu.cuInit(0), "cuInit")
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    check(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    check(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "retain")
    check(cu.cuCtxPushCurrent_v2(ctx), "push")


def device_alloc(n):
    p = ctypes.c_uint64()
    check(cu.cuMemAlloc_v2(ctypes.byref(p), n), "cuMemAlloc")
    return p.value


def pinned(n):
    p = ctypes.c_void_p()
    check(cu.cuMemHostAlloc(ctypes.byref(p), n, 0), "cuMemHostAlloc")
    return p.value


def put(dev, data):
    check(cu.cuMemcpyHtoD_v2(dev, data, len(data)), "HtoD")


def get(dev, n):
    out = ctypes.create_string_buffer(n)
    check(cu.cuMemcpyDtoH_v2(out, dev, n), "DtoH")
    return out.raw


def pattern(n, seed):
    return bytes((i * 131 + seed * 7) % 251 for i in range(n))


def engines():
    a = ferry.Engine("127.0.0.1", transports="tcp")
    b = ferry.Engine("127.0.0.1", transports="tcp")
    return a, b


class CudaArray:
    """An object with only __cuda_array_interface__ (as CuPy or Numba hold
    device memory)."""

    def __init__(self, ptr, shape, typestr="|u1", strides=None, readonly=False):
        self.__cuda_array_interface__ = {"data": (ptr, readonly), "shape": shape,
                                         "typestr": typestr, "strides": strides, "version": 3}


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


class DLPackArray:
    """An object with only __dlpack__: a "dltensor" capsule (no deleter;
    the object keeps the structures alive) of float32 items."""

    def __init__(self, ptr, shape, device=(2, 0), strides=None, byte_offset=0):
        self.shape = (ctypes.c_int64 * len(shape))(*shape)
        self.strides = (ctypes.c_int64 * len(shape))(*strides) if strides else None
        t = DLTensor(ptr, DLDevice(*device), len(shape), DLDataType(2, 32, 1), self.shape,
                     self.strides, byte_offset)
        self.managed = DLManagedTensor(t, None, None)

    def __dlpack__(self, stream=None):
        return _capsule_new(ctypes.addressof(self.managed), b"dltensor", None)


# ---- cases ------------------------------------------------------------------------
def case_cuda_array_interface():
    """register, write and read with __cuda_array_interface__ objects."""
    a, b = engines()
    src, dst = device_alloc(SIZE), device_alloc(SIZE)
    put(src, pattern(SIZE, 1))
    put(dst, bytes(SIZE))
    assert a.register(CudaArray(src, (SIZE // 4,), "<f4")) == src
    assert b.register(CudaArray(dst, (SIZE,))) == dst
    a.write(b.name, CudaArray(src, (SIZE // 4,), "<f4"), dst)
    assert get(dst, SIZE) == pattern(SIZE, 1)
    back = CudaArray(src + 4096, (SIZE - 4096,))  # READ into part of src
    a.read(b.name, back, dst)
    assert get(src + 4096, SIZE - 4096) == pattern(SIZE, 1)[:SIZE - 4096]
    try:
        a.read(b.name, CudaArray(src, (16,), readonly=True), dst)
        raise AssertionError("a READ into a read-only array was accepted")
    except ferry.Error as e:
        assert "read-only" in str(e), e
    a.close()
    b.close()


def case_dlpack_device():
    """__dlpack__ capsules of CUDA memory: data + byte_offset, the device id
    checked against the driver's answer."""
    a, b = engines()
    src, dst = device_alloc(SIZE), device_alloc(SIZE)
    put(src, pattern(SIZE, 2))
    n = (SIZE - 64) // 4
    arr = DLPackArray(src, (n,), byte_offset=64)
    assert a.register(arr) == src + 64
    b.register(dst, SIZE, "cuda:0")
    a.write(b.name, arr, dst)
    assert get(dst, n * 4) == pattern(SIZE, 2)[64:64 + n * 4]
    try:
        a.register(DLPackArray(dst, (16,), device=(2, 1)))
        raise AssertionError("memory of cuda:0 registered as cuda:1")
    except ferry.Error as e:
        assert "cuda:1" in str(e) and "cuda:0" in str(e), e
    a.close()
    b.close()


def case_non_contiguous():
    """Arrays with holes are refused, naming why."""
    a, _ = engines()
    dev = device_alloc(SIZE)
    for arr in (CudaArray(dev, (8, 4), "<f4", strides=(32, 8)),
                DLPackArray(dev, (8, 4), strides=(8, 2))):
        try:
            a.register(arr)
            raise AssertionError("a non-contiguous array was registered")
        except ferry.Error as e:
            assert "not contiguous" in str(e) and e.code == ferry.EINVAL, e
    # a dimension of 1 may have any stride; a transposed 1-wide view is contiguous
    assert a.register(CudaArray(dev, (8, 1), "<f4", strides=(4, 999))) == dev
    try:
        a.register(DLPackArray(dev, (4,), device=(7, 0)))
        raise AssertionError("a ROCm array was taken")
    except ferry.Error as e:
        assert "device type 7" in str(e), e
    a.close()


def _stream():
    s = ctypes.c_void_p()
    check(cu.cuStreamCreate(ctypes.byref(s), 1), "cuStreamCreate")
    return s.value


def _after(stream, dev, out, n):
    """Queues a copy of dev into out (pinned) and an event after it."""
    ev = ctypes.c_void_p()
    check(cu.cuEventCreate(ctypes.byref(ev), 2), "cuEventCreate")
    check(cu.cuMemcpyDtoHAsync_v2(out, dev, n, stream), "DtoHAsync")
    check(cu.cuEventRecord(ev, stream), "cuEventRecord")
    return ev


def _mooncake_pair():
    from mooncake.engine import TransferEngine
    a, b = TransferEngine(), TransferEngine()
    for te in (a, b):
        assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0, te.last_error()
    return a, b, "127.0.0.1:%d" % b.get_rpc_port()


def case_mooncake_on_cuda():
    """Mooncake's *_on_cuda: the work queued before is seen, the work after
    waits for the landed bytes (held landing: the later copy has not run)."""
    import mooncake.engine as me
    assert me.SUPPORT_CUDA
    a, b, target = _mooncake_pair()
    src, dst = device_alloc(SIZE), device_alloc(SIZE)
    assert a.register_memory(src, SIZE, "cuda:0") == 0, a.last_error()
    assert b.batch_register_memory([dst], [SIZE], ["cuda:0"]) == 0, b.last_error()
    stream, staged = _stream(), pinned(SIZE)
    for i, write in enumerate((True, False)):
        put(src, bytes(SIZE))
        put(dst, pattern(SIZE, 10 + i))
        ctypes.memmove(staged, pattern(SIZE, 20 + i), SIZE)
        if write:  # the work before fills the source
            check(cu.cuMemcpyHtoDAsync_v2(src, staged, SIZE, stream), "HtoDAsync")
            put(dst, bytes(SIZE))
        held = dst if write else src
        cu.fake_cuda_hold(held, 1)
        half = SIZE // 2
        if write:
            a.batch_transfer_write_on_cuda(target, [src, src + half], [dst, dst + half],
                                           [half, SIZE - half], stream)
        else:
            a.transfer_read_on_cuda(target, src, dst, SIZE, stream_ptr=stream)
        ev = _after(stream, held, staged, SIZE)
        cu.fake_cuda_held_wait()
        early = cu.cuEventQuery(ev) != NOT_READY
        cu.fake_cuda_hold(held, 0)  # first: a failing case must not leave ferry held
        assert not early, "the work after ran before the bytes landed"
        check(cu.cuEventSynchronize(ev), "cuEventSynchronize")
        want = pattern(SIZE, 20) if write else pattern(SIZE, 11)
        assert ctypes.string_at(staged, SIZE) == want, "wrong bytes after the %s" % (
            "write" if write else "read")
    a.close()
    b.close()


def case_mooncake_on_cuda_errors():
    """Refused before anything is queued: RuntimeError naming the call and
    the cause; the stream is not left waiting."""
    a, b, target = _mooncake_pair()
    src = device_alloc(SIZE)
    stream = _stream()
    try:
        a.transfer_write_on_cuda(target, src, 0, 64, stream)
        raise AssertionError("an unregistered buffer was accepted")
    except RuntimeError as e:
        assert "transfer_write_on_cuda" in str(e) and "not registered" in str(e), e
    assert a.register_memory(src, SIZE, "cuda:0") == 0
    try:
        a.batch_transfer_read_on_cuda(target, [src], [0, 1], [64], stream)
        raise AssertionError("mismatched lists were accepted")
    except RuntimeError as e:
        assert "batch_transfer_read_on_cuda" in str(e), e
    ev = ctypes.c_void_p()
    check(cu.cuEventCreate(ctypes.byref(ev), 2), "cuEventCreate")
    check(cu.cuEventRecord(ev, stream), "cuEventRecord")
    assert cu.cuEventQuery(ev) == 0, "a refused call left the stream waiting"
    try:
        a.register_memory(device_alloc(4096), 4096, "cuda:3")
    except Exception as e:  # noqa: BLE001
        raise AssertionError("register_memory raised: %r" % e)
    assert "cuda:3" in (a.last_error() or ""), a.last_error()
    a.close()
    b.close()


def case_ferry_submit_on_stream_failure():
    """ferry.Engine.submit_on_stream: a transfer failing after it was queued
    (the target unregistered) releases the stream; its Batch says why, and
    without a Batch (watch=False) the log does."""
    a, b = engines()
    src, dst = device_alloc(SIZE), device_alloc(SIZE)
    a.register(src, SIZE, "cuda:0")
    b.register(dst, SIZE, "cuda:0")
    stream, staged = _stream(), pinned(SIZE)
    cu.fake_cuda_hold(src, 1)  # the work before, held
    check(cu.cuMemcpyHtoDAsync_v2(src, staged, SIZE, stream), "HtoDAsync")
    batch = a.submit_on_stream(b.name, ferry.OP_WRITE, [src], [dst], [SIZE], stream=stream)
    ev = _after(stream, dst, staged, SIZE)
    cu.fake_cuda_held_wait()
    b.unregister(dst)
    cu.fake_cuda_hold(src, 0)
    try:
        batch.wait()
        raise AssertionError("a WRITE into unregistered memory succeeded")
    except ferry.Error as e:
        assert "not registered" in str(e), e
    check(cu.cuEventSynchronize(ev), "the stream waits forever")
    # Unwatched (the drop-in's way): the failure is logged, naming the stream.
    import logging
    lines = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    logging.getLogger("ferry").addHandler(handler)
    cu.fake_cuda_hold(src, 1)
    check(cu.cuMemcpyHtoDAsync_v2(src, staged, SIZE, stream), "HtoDAsync")
    b.register(dst, SIZE, "cuda:0")
    assert a.submit_on_stream(b.name, ferry.OP_WRITE, [src], [dst], [SIZE], stream=stream,
                              watch=False) is None
    ev = _after(stream, dst, staged, SIZE)
    cu.fake_cuda_held_wait()
    b.unregister(dst)
    cu.fake_cuda_hold(src, 0)
    check(cu.cuEventSynchronize(ev), "the stream waits forever")
    ferry.flush_log()
    assert any("stream-ordered transfer on cuda:0 stream" in x and "not registered" in x
               for x in lines), lines
    a.close()
    b.close()


def case_gpu_pool():
    """A receive pool over device memory (an array object): an embedding
    sent from device memory lands in it; the message gives its device
    address and refuses the CPU a view of it."""
    a, b = engines()
    pool_memory, emb = device_alloc(1 << 20), device_alloc(SIZE)
    pool = b.create_pool("prefill", CudaArray(pool_memory, (1 << 20,)))
    put(emb, pattern(SIZE, 5))
    a.register(CudaArray(emb, (SIZE,)))
    a.send(b.name, "prefill", b"req-7", CudaArray(emb, (SIZE,)))
    with b.recv(pool, b"req-7", timeout=30) as m:
        assert pool_memory <= m.addr and m.addr + len(m) <= pool_memory + (1 << 20)
        assert len(m) == SIZE and get(m.addr, SIZE) == pattern(SIZE, 5)
        try:
            memoryview(m)
            raise AssertionError("a CPU view of device memory was made")
        except BufferError as e:
            assert "CUDA memory" in str(e), e
    pool.close()
    a.close()
    b.close()


if __name__ == "__main__":
    setup_driver()
    globals()["case_" + sys.argv[1]]()
    print("ok")
