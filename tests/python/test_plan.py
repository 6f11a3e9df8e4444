"""test_plan.py - prepared transfer plans from Python (Engine.plan, ferry.Plan).

Two engines in this process, the initiator on tcp or on shm: descriptor
lists as pairs and as N x 2 numpy arrays, index arrays of every integer
kind (numpy int64 read in place, other widths widened, lists, array.array),
bytes verified in the target's memory, merging seen in the links' ops,
bad indices refused with nothing sent, a plan released by unregister, and
a plan outliving its engine's close().
"""

import array

import numpy as np
import pytest

import ferry

BLOCK = 4096
BLOCKS = 64


class Rig:
    """A target with one registered buffer of BLOCKS blocks and an
    initiator with out and in, and a plan: local = out's blocks then in's,
    remote = the target's blocks."""

    def __init__(self, transports):
        self.target = ferry.Engine("127.0.0.1")
        self.initiator = ferry.Engine("127.0.0.1", transports=transports)
        self.memory = np.zeros(BLOCKS * BLOCK, dtype=np.uint8)
        self.out = np.zeros(BLOCKS * BLOCK, dtype=np.uint8)
        self.inn = np.zeros(BLOCKS * BLOCK, dtype=np.uint8)
        self.remote_base = self.target.register(self.memory)
        self.out_base = self.initiator.register(self.out)
        self.in_base = self.initiator.register(self.inn)
        self.name = self.target.name
        local = [(self.out_base + i * BLOCK, BLOCK) for i in range(BLOCKS)]
        local += [(self.in_base + i * BLOCK, BLOCK) for i in range(BLOCKS)]
        remote = np.array([(self.remote_base + i * BLOCK, BLOCK) for i in range(BLOCKS)],
                          dtype=np.uint64)
        self.plan = self.initiator.plan(self.name, local, remote)
        if transports == "shm" and self.initiator.peer_transport(self.name) != ferry.TRANSPORT_SHM:
            self.close()
            pytest.skip("no shm service between two engines here")

    def ops(self, op="write"):
        return sum(l["ops"][op] for l in self.initiator.stats()["links"] if l["peer"] == self.name)

    def block(self, buf, i):
        return buf[i * BLOCK:(i + 1) * BLOCK]

    def close(self):
        self.plan.free()
        self.initiator.close()
        self.target.close()


@pytest.fixture(params=["tcp", "shm"])
def rig(request):
    r = Rig(request.param)
    yield r
    r.close()


def scattered(n):
    return (np.arange(n, dtype=np.int64) * 37) % n


def test_scattered_round_trip(rig):
    rig.out[:] = np.random.default_rng(1).integers(0, 256, rig.out.size, dtype=np.uint8)
    li = np.arange(BLOCKS, dtype=np.int64)
    ri = scattered(BLOCKS)
    assert rig.plan.local_count == 2 * BLOCKS and rig.plan.remote_count == BLOCKS
    assert rig.plan.target == rig.name
    rig.plan.transfer(ferry.OP_WRITE, li, ri, notify=("plan-done", b"req-1"))
    for i in range(BLOCKS):
        assert np.array_equal(rig.block(rig.memory, ri[i]), rig.block(rig.out, i))
    assert rig.target.drain_notifications() == [("plan-done", b"req-1")]
    with rig.plan.submit(ferry.OP_READ, li + BLOCKS, ri) as batch:
        assert batch.wait() is True
    assert np.array_equal(rig.inn, rig.out)


@pytest.mark.parametrize("kind", ["int64", "int32", "uint32", "uint64", "list", "array_q",
                                  "array_i", "strided"])
def test_index_kinds(rig, kind):
    li = list(range(8))
    ri = [7 - i for i in range(8)]
    conv = {
        "int64": lambda v: np.array(v, dtype=np.int64),
        "int32": lambda v: np.array(v, dtype=np.int32),
        "uint32": lambda v: np.array(v, dtype=np.uint32),
        "uint64": lambda v: np.array(v, dtype=np.uint64),
        "list": list,
        "array_q": lambda v: array.array("q", v),
        "array_i": lambda v: array.array("i", v),
        "strided": lambda v: np.repeat(np.array(v, dtype=np.int64), 2)[::2],
    }[kind]
    rig.out[:8 * BLOCK] = np.arange(8 * BLOCK, dtype=np.uint32).astype(np.uint8)
    rig.plan.transfer(ferry.OP_WRITE, conv(li), conv(ri))
    for i in range(8):
        assert np.array_equal(rig.block(rig.memory, ri[i]), rig.block(rig.out, i))


def test_adjacent_pairs_merge(rig):
    idx = np.arange(BLOCKS, dtype=np.int64)
    before = rig.ops()
    rig.plan.transfer(ferry.OP_WRITE, idx, idx)
    merged = rig.ops()
    rig.plan.transfer(ferry.OP_WRITE, idx, idx, merge=False)
    assert (merged - before, rig.ops() - merged) == (1, BLOCKS)
    assert np.array_equal(rig.memory, rig.out)


def test_bad_indices_send_nothing(rig):
    rig.memory[:] = 0x5A
    ops = rig.ops()
    good = np.arange(8, dtype=np.int64)
    for li, ri, words in [
            (np.append(good, 2 * BLOCKS), np.append(good, 0), "local descriptor 128"),
            (np.append(good, 0), np.append(good, BLOCKS), "remote descriptor 64"),
            (np.append(good, -1), np.append(good, 0), "local descriptor -1"),
            (np.append(good, 0), np.append(good, 2**63).astype(np.uint64),
             "remote descriptor -9223372036854775808")]:
        with pytest.raises(ferry.Error) as e:
            rig.plan.transfer(ferry.OP_WRITE, li, ri)
        assert e.value.code == ferry.EINVAL and words in e.value.detail
        assert "pair 8" in e.value.detail
    assert rig.ops() == ops
    assert (rig.memory == 0x5A).all()
    with pytest.raises(ValueError, match="differ in length"):
        rig.plan.transfer(ferry.OP_WRITE, good, good[:4])
    with pytest.raises(TypeError, match="1-D array of integers"):
        rig.plan.transfer(ferry.OP_WRITE, good.astype(np.float64), good)
    with pytest.raises(TypeError, match="1-D array of integers"):
        rig.plan.transfer(ferry.OP_WRITE, good.reshape(2, 4), good.reshape(2, 4))
    with pytest.raises(ferry.Error) as e:
        rig.plan.transfer(ferry.OP_WRITE, good[:0], good[:0])
    assert e.value.code == ferry.EINVAL


def test_bad_descriptors_refused(rig):
    stray = np.zeros(64, dtype=np.uint8)
    with pytest.raises(ferry.Error) as e:
        rig.initiator.plan(rig.name, [(stray.ctypes.data, 64)], [(rig.remote_base, 64)])
    assert e.value.code == ferry.ENOTREG and "local descriptor 0" in e.value.detail
    with pytest.raises(ferry.Error) as e:
        rig.initiator.plan(rig.name, [(rig.out_base, 64)],
                           [(rig.remote_base + BLOCKS * BLOCK - 8, 64)])
    assert e.value.code == ferry.ENOTREG and "remote descriptor 0" in e.value.detail
    with pytest.raises(TypeError, match="N x 2 array"):
        rig.initiator.plan(rig.name, np.zeros((4, 3), dtype=np.uint64), [(rig.remote_base, 64)])
    with pytest.raises(TypeError, match=r"local\[0\] must be an \(addr, length\) pair"):
        rig.initiator.plan(rig.name, [(rig.out_base, 64, 0)], [(rig.remote_base, 64)])


def test_unregister_releases_plan(rig):
    idx = np.arange(4, dtype=np.int64)
    rig.plan.transfer(ferry.OP_WRITE, idx, idx)
    rig.initiator.unregister(rig.out_base)
    with pytest.raises(ferry.Error) as e:
        rig.plan.transfer(ferry.OP_WRITE, idx, idx)
    assert e.value.code == ferry.ENOTREG
    assert "was unregistered after the plan was made" in e.value.detail


def test_plan_outlives_close():
    r = Rig("tcp")
    idx = np.arange(4, dtype=np.int64)
    r.initiator.close()
    with pytest.raises(ferry.Error) as e:
        r.plan.transfer(ferry.OP_WRITE, idx, idx)
    assert e.value.code == ferry.ECLOSED
    r.plan.free()
    assert r.plan.freed and r.plan.local_count == 0
    with pytest.raises(ferry.Error) as e:
        r.plan.transfer(ferry.OP_WRITE, idx, idx)
    assert e.value.code == ferry.EINVAL and "freed" in e.value.detail
    r.close()
