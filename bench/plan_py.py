#!/usr/bin/python3
"""plan_py.py - prepared transfer plans from Python (ferry.Plan) against the
entry paths of the same binding, two engines in this process on 127.0.0.1.
Prints one JSON line.

  plan_py.py rate N [REPS]
      Submit rate of N pairs of 64 B descriptors to scattered remote slots:
      Plan.submit with numpy int64 index arrays, against Engine.submit_arrays
      with Python lists (the list path) and with numpy arrays of addresses;
      only the submit call is timed, the fastest of REPS (interleaved).
  plan_py.py vllm tcp|shm [REPS]
      vLLM-shaped READ (32 layers x 2 regions x 256 blocks x 16 KiB) by
      prepared indices from Python (Plan.transfer), against the same entries
      as one C batch (Engine.transfer_arrays of numpy arrays); median GB/s.

Needs the extension built in place (setup.py build_ext --inplace) and numpy.
"""

import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import numpy as np  # noqa: E402

import ferry  # noqa: E402


def engines(transports):
    target = ferry.Engine("127.0.0.1")
    return target, ferry.Engine("127.0.0.1", transports=transports)


def timed_submit(fn):
    t0 = time.perf_counter()
    batch = fn()
    took = time.perf_counter() - t0
    batch.wait()
    batch.free()
    return took


def rate(n, reps):
    desc = 64
    target, e = engines("tcp")
    local = np.zeros(n * desc, dtype=np.uint8)
    remote = np.zeros(n * desc, dtype=np.uint8)
    lbase, rbase = e.register(local), target.register(remote)
    offsets = np.arange(n, dtype=np.uint64) * desc
    lds = np.stack([lbase + offsets, np.full(n, desc, dtype=np.uint64)], axis=1)
    rds = np.stack([rbase + offsets, np.full(n, desc, dtype=np.uint64)], axis=1)
    plan = e.plan(target.name, lds, rds)
    li = np.arange(n, dtype=np.int64)
    ri = (li * 2654435761) % n
    laddr, raddr = lbase + offsets, rbase + ri.astype(np.uint64) * desc
    lens = np.full(n, desc, dtype=np.uint64)
    llist, rlist, lenlist = laddr.tolist(), raddr.tolist(), lens.tolist()
    times = {"plan": [], "lists": [], "arrays": []}
    for _ in range(reps):
        times["plan"].append(timed_submit(lambda: plan.submit(ferry.OP_WRITE, li, ri)))
        times["lists"].append(timed_submit(
            lambda: e.submit_arrays(target.name, ferry.OP_WRITE, llist, rlist, lenlist)))
        times["arrays"].append(timed_submit(
            lambda: e.submit_arrays(target.name, ferry.OP_WRITE, laddr, raddr, lens)))
    plan.free()
    e.close()
    target.close()
    out = {"pairs": n}
    for k, v in times.items():
        out["%s_submit_per_s" % k] = n / min(v)
    return out


def vllm(protocol, reps):
    layers, kv, blocks, block = 32, 2, 256, 16 << 10
    regions = layers * kv
    target, e = engines(protocol)
    mine = [np.zeros(blocks * block, dtype=np.uint8) for _ in range(regions)]
    theirs = [np.zeros(blocks * block, dtype=np.uint8) for _ in range(regions)]
    mbase = np.array([e.register(m) for m in mine], dtype=np.uint64)
    tbase = np.array([target.register(t) for t in theirs], dtype=np.uint64)
    offsets = np.arange(blocks, dtype=np.uint64) * block
    laddr = (mbase[:, None] + offsets[None, :]).ravel()
    raddr = (tbase[:, None] + offsets[None, :]).ravel()
    n = regions * blocks
    lens = np.full(n, block, dtype=np.uint64)
    plan = e.plan(target.name, np.stack([laddr, lens], axis=1), np.stack([raddr, lens], axis=1))
    if e.peer_transport(target.name) != (ferry.TRANSPORT_SHM if protocol == "shm"
                                         else ferry.TRANSPORT_TCP):
        raise SystemExit("plan_py: %s unavailable here" % protocol)
    li = np.arange(n, dtype=np.int64)
    ri = (li // blocks) * blocks + (li % blocks * 37) % blocks
    src = raddr[ri]
    plan_gbps, batch_gbps = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        plan.transfer(ferry.OP_READ, li, ri)
        plan_gbps.append(n * block / (time.perf_counter() - t0) / 1e9)
        t0 = time.perf_counter()
        e.transfer_arrays(target.name, ferry.OP_READ, laddr, src, lens)
        batch_gbps.append(n * block / (time.perf_counter() - t0) / 1e9)
    plan.free()
    e.close()
    target.close()
    return {"protocol": protocol, "bytes": n * block, "plan_gbps": statistics.median(plan_gbps),
            "batch_gbps": statistics.median(batch_gbps)}


def main():
    a = sys.argv[1:]
    reps = int(a[2]) if len(a) > 2 else 5
    if len(a) >= 2 and a[0] == "rate":
        print(json.dumps(rate(int(a[1]), reps)))
    elif len(a) >= 2 and a[0] == "vllm" and a[1] in ("tcp", "shm"):
        print(json.dumps(vllm(a[1], reps)))
    else:
        sys.exit("usage: plan_py.py rate N [REPS] | plan_py.py vllm tcp|shm [REPS]")


if __name__ == "__main__":
    main()
