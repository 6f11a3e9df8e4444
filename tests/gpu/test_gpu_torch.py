"""test_gpu_torch.py - ferry moving torch CUDA tensors between two processes
on one GPU over tcp (staged), every byte verified (issue 30):

  * a tensor at an offset inside a caching-allocator block (the region is
    the tensor, not the cuMemAlloc block around it): WRITE from and READ into
    such a tensor, and the bytes next to it untouched on both sides;
  * host <-> device with torch: a pinned and a pageable CPU tensor to a CUDA
    tensor and back;
  * SGLang's encoder flow through the Mooncake drop-in:
    register_memory(embedding.data_ptr(), nbytes, "cuda:0"),
    transfer_sync_write, unregister_memory, into a prefill's CUDA buffer;
  * Mooncake's own test_transfer_on_cuda.py flow (the four *_on_cuda calls
    on a torch stream beside a matmul), here over tcp;
  * torch CUDA tensors as ferry.Engine's memory (__cuda_array_interface__,
    __dlpack__), submit_on_stream on a torch stream, and a non-contiguous
    tensor refused.

The target is this script again (--target), driven by lines on its stdin.
Without a CUDA device it prints "SKIP: no CUDA device (...)" and exits 77
(likewise "SKIP: no torch" without torch). Run with the Python that has torch and the built ferry package on
its path: PYTHONPATH=python python3 tests/gpu/test_gpu_torch.py
"""

import json
import os
import subprocess
import sys
import time

SKIP = 77
MIB = 1 << 20


def skip_reason():
    """Why the GPU cases cannot run here, or None. A ferry that does not
    import is a failure, not a skip."""
    import ferry
    ok, why = ferry.cuda_available()
    if not ok:
        return "no CUDA device (%s)" % why
    try:
        import torch
    except ImportError as e:
        return "no torch (%s)" % e
    if not torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is False)"
    return None


def pattern(n, seed):
    import torch
    i = torch.arange(n, device="cuda:0", dtype=torch.int64)
    return ((i * 131 + seed * 7919) ^ (i >> 11) ^ seed).remainder(256).to(torch.uint8)


def first_bad(tensor, seed):
    """-1 when tensor (uint8, any device) holds pattern(seed), else the first wrong index."""
    diff = (tensor.to("cuda:0") != pattern(tensor.numel(), seed)).nonzero()
    return -1 if diff.numel() == 0 else int(diff[0])


# ---- the target ---------------------------------------------------------------
def target_main():
    import torch
    from mooncake.engine import TransferEngine

    te = TransferEngine()
    if te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") != 0:
        raise SystemExit("initialize failed: %s" % te.last_error())
    # The caching allocator carves tensors under 10 MiB out of 20 MiB
    # segments: before, the tensor, after, one after the other in one
    # segment, so the tensor starts 3 MiB into its cuMemAlloc block. The
    # tensor alone is registered.
    before = torch.full((3 * MIB + 5,), 0xAB, dtype=torch.uint8, device="cuda:0")
    inner = torch.zeros(MIB + 5, dtype=torch.uint8, device="cuda:0")
    after = torch.full((MIB + 5,), 0xCD, dtype=torch.uint8, device="cuda:0")
    # A prefill's buffer for an encoder's embedding.
    dst = torch.zeros(8 * MIB, dtype=torch.uint8, device="cuda:0")
    for t in (inner, dst):
        if te.register_memory(t.data_ptr(), t.numel(), "cuda:0") != 0:
            raise SystemExit("register_memory failed: %s" % te.last_error())
    torch.cuda.synchronize()
    tensors = {"inner": inner, "dst": dst}
    print(json.dumps({"name": "127.0.0.1:%d" % te.get_rpc_port(),
                      "inner_after_before": inner.data_ptr() - before.data_ptr(),
                      "inner": inner.data_ptr(), "inner_len": inner.numel(),
                      "dst": dst.data_ptr(), "dst_len": dst.numel()}), flush=True)
    for line in sys.stdin:
        cmd, name, seed, *length = line.split()
        t, seed = tensors[name], int(seed)
        t = t[:int(length[0])] if length else t
        if cmd == "fill":
            t.copy_(pattern(t.numel(), seed))
            torch.cuda.synchronize()
            answer = "ok"
        else:
            bad = first_bad(t, seed)
            edges = bool((before == 0xAB).all() and (after == 0xCD).all())
            answer = "ok" if bad < 0 and edges else "bad byte %d, neighbours intact: %s" % (
                bad, edges)
        print(answer, flush=True)
    te.close()


class Target:
    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--target"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit("FAIL: the target did not start (its stderr says why)")
        self.info = json.loads(line)

    def ask(self, *words):
        self.proc.stdin.write(" ".join(str(w) for w in words) + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def stop(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


# ---- the cases ------------------------------------------------------------------
def case_offset_in_block(target, report):
    """WRITE from, and READ into, tensors that sit inside larger allocator blocks."""
    import ferry
    import torch
    eng = ferry.Engine(host="127.0.0.1", transports="tcp")
    n = target.info["inner_len"]
    block = torch.full((n + 2 * 4099,), 0x5A, dtype=torch.uint8, device="cuda:0")
    src = block[4099:4099 + n]  # a view at an odd offset inside its block
    src.copy_(pattern(n, 11))
    torch.cuda.synchronize()
    eng.register(src.data_ptr(), n, location="cuda:0")
    t0 = time.monotonic()
    eng.write(target.info["name"], src.data_ptr(), target.info["inner"], n)
    report(target.ask("check", "inner", 11) == "ok",
           "WRITE from a view at offset 4099 of a cuda:0 block into a tensor inside a caching "
           "allocator block (%d B after the tensor before it), %d B (%.2f s)" % (
               target.info["inner_after_before"], n, time.monotonic() - t0))
    target.ask("fill", "inner", 12)
    eng.read(target.info["name"], src.data_ptr(), target.info["inner"], n)
    torch.cuda.synchronize()
    edges = bool((block[:4099] == 0x5A).all() and (block[4099 + n:] == 0x5A).all())
    bad = first_bad(src, 12)
    report(bad < 0 and edges, "READ into a view at offset 4099 of a cuda:0 block, %d B "
           "(first bad byte %d, bytes around it intact: %s)" % (n, bad, edges))
    eng.unregister(src.data_ptr())
    eng.close()


def case_host_device(target, report):
    """Pinned and pageable CPU tensors to a cuda:0 tensor and back."""
    import ferry
    import torch
    eng = ferry.Engine(host="127.0.0.1", transports="tcp")
    n = target.info["inner_len"]
    for pinned in (True, False):
        host = torch.zeros(n, dtype=torch.uint8, pin_memory=pinned)
        host.copy_(pattern(n, 21).cpu())
        eng.register(host.data_ptr(), n, location="*" if pinned else "cpu:0")
        eng.write(target.info["name"], host.data_ptr(), target.info["inner"], n)
        kind = "pinned" if pinned else "pageable"
        report(target.ask("check", "inner", 21) == "ok",
               "WRITE %s CPU tensor -> cuda:0 tensor, %d B" % (kind, n))
        target.ask("fill", "inner", 22)
        eng.read(target.info["name"], host.data_ptr(), target.info["inner"], n)
        bad = first_bad(host, 22)
        report(bad < 0, "READ cuda:0 tensor -> %s CPU tensor, %d B (first bad byte %d)" % (
            kind, n, bad))
        eng.unregister(host.data_ptr())
    eng.close()


def case_sglang_encoder(target, report):
    """The encoder side of SGLang's EPD flow, as it calls the drop-in."""
    import torch
    from mooncake.engine import TransferEngine
    te = TransferEngine()
    assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0, te.last_error()
    # An embedding the size of a few image tokens: bf16 [tokens, hidden].
    emb = torch.empty((1000, 4096), dtype=torch.bfloat16, device="cuda:0")
    nbytes = emb.numel() * emb.element_size()
    emb.view(torch.uint8).view(-1).copy_(pattern(nbytes, 31))
    torch.cuda.synchronize()
    rc = [te.register_memory(emb.data_ptr(), nbytes, "cuda:0")]
    rc.append(te.transfer_sync_write(target.info["name"], emb.data_ptr(), target.info["dst"],
                                     nbytes))
    rc.append(te.unregister_memory(emb.data_ptr()))
    answer = target.ask("check", "dst", 31, nbytes) if rc == [0, 0, 0] else "not checked"
    report(rc == [0, 0, 0] and answer == "ok",
           "SGLang encoder flow: register_memory(data_ptr, %d, 'cuda:0'), transfer_sync_write, "
           "unregister_memory -> %s; target: %s (%s)" % (nbytes, rc, answer, te.last_error()))
    te.close()


def case_mooncake_on_cuda(target, report):
    """Mooncake's own mooncake-wheel/tests/test_transfer_on_cuda.py flow (it
    asks for an RDMA device, mlx5_bond_0; here over tcp, staged, between two
    engines of this process): per call, 10 rounds of fill on the default
    stream, the copy stream waits for it, *_on_cuda on the copy stream, a
    matmul meanwhile, the default stream waits for the copy stream; every
    byte then checked. 64 MiB, the batch forms in 4 chunks."""
    import torch
    from mooncake.engine import TransferEngine
    a, b = TransferEngine(), TransferEngine()
    for te in (a, b):
        assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0, te.last_error()
    name = "127.0.0.1:%d" % b.get_rpc_port()
    n, dev = 64 * MIB, torch.device("cuda:0")
    src = torch.ones(n, dtype=torch.uint8, device=dev)
    dst = torch.zeros(n, dtype=torch.uint8, device=dev)
    assert a.register_memory(src.data_ptr(), n) == 0, a.last_error()
    assert b.register_memory(dst.data_ptr(), n) == 0, b.last_error()
    copy_stream = torch.cuda.Stream(dev)
    x, y = torch.randn(4096, 4096, device=dev), torch.randn(4096, 4096, device=dev)
    q = n // 4
    srcs = [src.data_ptr() + j * q for j in range(4)]
    dsts = [dst.data_ptr() + j * q for j in range(4)]
    calls = {
        "transfer_write_on_cuda": lambda s: a.transfer_write_on_cuda(
            name, src.data_ptr(), dst.data_ptr(), n, s),
        "transfer_read_on_cuda": lambda s: a.transfer_read_on_cuda(
            name, src.data_ptr(), dst.data_ptr(), n, s),
        "batch_transfer_write_on_cuda": lambda s: a.batch_transfer_write_on_cuda(
            name, srcs, dsts, [q] * 4, s),
        "batch_transfer_read_on_cuda": lambda s: a.batch_transfer_read_on_cuda(
            name, srcs, dsts, [q] * 4, s),
    }
    for k, (call, run) in enumerate(calls.items()):
        write = "write" in call
        bad, t0 = [], time.monotonic()
        for i in range(10):
            val = 50 * k + i
            (src if write else dst).fill_(val)
            (dst if write else src).zero_()
            copy_stream.wait_event(torch.cuda.default_stream().record_event())
            run(copy_stream.cuda_stream)
            event = copy_stream.record_event()
            _ = torch.matmul(x, y)  # concurrent computation
            torch.cuda.default_stream().wait_event(event)
            if not bool(torch.all((dst if write else src) == val)):
                bad.append(i)
        report(not bad, "Mooncake test_transfer_on_cuda flow: %s, 10 x %d B (%.2f s)%s" % (
            call, n, time.monotonic() - t0, "; wrong bytes in rounds %s" % bad if bad else ""))
    a.close()
    b.close()


def case_tensor_objects(target, report):
    """ferry.Engine with torch CUDA tensors themselves (their
    __cuda_array_interface__), a DLPack-only view of one, and
    submit_on_stream on a torch stream."""
    import ferry
    import torch
    eng = ferry.Engine(host="127.0.0.1", transports="tcp")
    n = target.info["inner_len"]
    src = pattern(n, 41)
    eng.register(src)  # location "cuda" from the array, checked against the driver

    class DLPackOnly:
        def __init__(self, t):
            self.t = t

        def __dlpack__(self, stream=None):
            return self.t.__dlpack__()

    eng.write(target.info["name"], DLPackOnly(src), target.info["inner"])
    report(target.ask("check", "inner", 41) == "ok",
           "WRITE from a torch CUDA tensor registered as itself (__cuda_array_interface__), "
           "sent through __dlpack__, %d B" % n)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        src.copy_(pattern(n, 42))  # the work before, on that stream
    batch = eng.submit_on_stream(target.info["name"], ferry.OP_WRITE, [src.data_ptr()],
                                 [target.info["inner"]], [n], stream=stream)
    batch.wait()
    report(target.ask("check", "inner", 42) == "ok",
           "submit_on_stream on a torch stream carries the bytes its earlier work wrote")
    try:
        eng.register(torch.zeros(64, 64, device="cuda:0")[:, ::2])
        report(False, "a non-contiguous CUDA tensor was registered")
    except ferry.Error as e:
        report("not contiguous" in str(e), "non-contiguous CUDA tensor refused: %s" % e)
    eng.unregister(src.data_ptr())
    eng.close()


def case_gpu_pool(target, report):
    """A handoff into a GPU pool (issue 30 §2): an encoder's embedding,
    sent from a CUDA tensor, lands in a prefill's receive pool that lives
    in a CUDA tensor; the message gives its device address."""
    import ferry
    import torch
    enc = ferry.Engine(host="127.0.0.1", transports="tcp")
    pre = ferry.Engine(host="127.0.0.1", transports="tcp")
    pool_memory = torch.zeros(16 * MIB, dtype=torch.uint8, device="cuda:0")
    pool = pre.create_pool("prefill", pool_memory)
    n = 3 * MIB + 7
    emb = pattern(n, 51)
    enc.register(emb)
    enc.send(pre.name, "prefill", b"req-1", emb)
    with pre.recv(pool, b"req-1", timeout=60) as m:
        at = m.addr - pool_memory.data_ptr()
        inside = 0 <= at and at + len(m) <= pool_memory.numel()
        landed = inside and len(m) == n and torch.equal(pool_memory[at:at + n], emb)
    report(landed, "an embedding sent from cuda:0 landed in a receive pool in cuda:0 memory, "
           "%d B at pool offset %d" % (n, at))
    pool.close()
    enc.unregister(emb.data_ptr())
    enc.close()
    pre.close()


def main():
    if "--target" in sys.argv:
        return target_main()
    why = skip_reason()
    if why:
        print("SKIP: %s" % why)
        return SKIP
    failures = []

    def report(ok, text):
        print("%s %s" % ("PASS" if ok else "FAIL", text), flush=True)
        if not ok:
            failures.append(text)

    target = Target()
    try:
        for case in (case_offset_in_block, case_host_device, case_sglang_encoder,
                     case_mooncake_on_cuda, case_tensor_objects, case_gpu_pool):
            try:
                case(target, report)
            except Exception as e:  # one case's error is its failure, the others still run
                report(False, "%s raised %s: %s" % (case.__name__, type(e).__name__, e))
    finally:
        target.stop()
    print("test_gpu_torch: %d failure(s)" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
