"""test_mooncake_store_parallel.py - Mooncake's unified parallel tensor calls
(*_with_parallelism with TensorParallelism, writer partitions and
ReadTarget; python/mooncake/_parallel.py) against a `ferry store-master` and
two clients: where each shard is stored (its key) and its header, laid out
byte for byte as written out here (not by mooncake/_tensor.py); which piece a
write stores (a lone TP axis: the tensor given; TP among several axes or a
writer partition: the rank's piece of the whole); reads as stored, of a
shard, and of the whole tensor rebuilt from its shards (also from shards a
foreign writer stored, and into a registered buffer); and shard sets that do
not make one tensor refused with their cause. Every byte compared."""

import ctypes
import logging
import struct

import pytest

torch = pytest.importorskip("torch")

from test_mooncake_store import client, master  # noqa: E402,F401  (the fixture)
from test_mooncake_store_tensor import header  # noqa: E402  (Mooncake's header, field by field)

from mooncake.store import ParallelAxis, ReadTarget, TensorParallelism  # noqa: E402

HEADER = 304
DP, TP, EP, PP = 0, 1, 2, 3  # Mooncake's LayoutAxisKind numbers


def raw(t):
    return bytes(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())


def sample(shape, dtype=torch.int32, seed=1):
    n = 1
    for d in shape:
        n *= d
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-2**15, 2**15, (n,), generator=g).to(dtype).reshape(shape)


def same(got, want):
    assert got is not None
    assert got.dtype == want.dtype and tuple(got.shape) == tuple(want.shape)
    assert raw(got) == raw(want)


def axis(kind, rank, size, split_dim=None, **kw):
    a = ParallelAxis()  # Mooncake's form: made empty, then its fields set
    a.kind, a.rank, a.size, a.split_dim = kind, rank, size, split_dim
    for k, v in kw.items():
        setattr(a, k, v)
    return a


def par(*axes):
    p = TensorParallelism()
    p.axes = list(axes)
    return p


def target(mode, parallelism=None):
    t = ReadTarget()
    t.mode, t.parallelism = mode, parallelism
    return t


@pytest.fixture
def pair(master):
    writer, reader = client(master), client(master)
    yield writer, reader
    writer.close()
    reader.close()


def test_a_lone_tp_axis_stores_the_shard_given_under_the_tp_key(pair):
    writer, reader = pair
    t = sample((4, 6, 2))
    for rank in range(3):  # shard input: the caller cuts, along dimension 1
        piece = t[:, 2 * rank:2 * rank + 2]
        assert writer.put_tensor_with_parallelism(
            "lone", piece, parallelism=par(axis("tp", rank, 3, 1))) == 0
        assert reader.get("lone_tp_%d" % rank) == header(
            torch.int32, (4, 6, 2), (4, 2, 2), [(TP, rank, 3, 1, 0)]) + raw(piece)
    assert reader.is_exist("lone") == 0
    # the legacy TP read, a shard read and as_stored with its parallelism agree
    same(reader.get_tensor_with_tp("lone", tp_rank=2, tp_size=3), t[:, 4:])
    same(reader.get_tensor_with_parallelism(
        "lone", target("shard", par(axis("tp", 1, 3, 1)))), t[:, 2:4])
    same(reader.get_tensor_with_parallelism(
        "lone", target("as_stored", par(axis("tp", 0, 3, 1)))), t[:, :2])
    # full: rebuilt from the shards named by the target, or found from lone_tp_0's header
    same(reader.get_tensor_with_parallelism("lone", target("full", par(axis("tp", 0, 3, 1)))), t)
    same(reader.get_tensor_with_parallelism("lone", target("full")), t)


def test_tp_among_several_axes_cuts_the_whole_tensor_and_rebuilds_it(pair):
    writer, reader = pair
    t = sample((6, 5), torch.int64, seed=2)
    keys = []
    for rank in range(3):  # full input: the store cuts rank's rows; axes in any order
        p = par(axis("tp", rank, 3, 0), axis("dp", 1, 2))
        assert writer.put_tensor_with_parallelism("m", t, parallelism=p) == 0
        keys.append("m__dp_1of2__tp_%dof3_sd0" % rank)
        assert reader.get(keys[-1]) == header(torch.int64, (6, 5), (2, 5),
                                              [(DP, 1, 2, -1, 0), (TP, rank, 3, 0, 0)]) \
            + raw(t[2 * rank:2 * rank + 2])
    same(reader.get_tensor_with_parallelism(
        "m", target("shard", par(axis("dp", 1, 2), axis("tp", 2, 3, 0)))), t[4:])
    whole = target("full", par(axis("dp", 1, 2), axis("tp", 0, 3, 0)))
    same(reader.get_tensor_with_parallelism("m", whole), t)
    # the same into a registered buffer: a tensor viewing it behind a whole tensor's header
    buf = ctypes.create_string_buffer(4096)
    base = ctypes.addressof(buf)
    assert reader.register_buffer(base, 4096) == 0
    got = reader.get_tensor_with_parallelism_into("m", base, 4096, whole)
    same(got, t)
    assert got.data_ptr() == base + HEADER
    assert ctypes.string_at(base, HEADER + 6 * 5 * 8) == header(torch.int64, (6, 5), (6, 5)) \
        + raw(t)
    # too small a buffer: None, the buffer untouched
    ctypes.memset(base, 0xAB, 4096)
    assert reader.get_tensor_with_parallelism_into("m", base, HEADER + 100, whole) is None
    assert ctypes.string_at(base, 4096) == b"\xab" * 4096
    # batch forms, another DP rank absent: None for that key only
    other = target("full", par(axis("dp", 0, 2), axis("tp", 0, 3, 0)))
    got = reader.batch_get_tensor_with_parallelism(["m", "m"], [whole, other])
    same(got[0], t)
    assert got[1] is None
    assert reader.unregister_buffer(base) == 0


def test_scope_axes_store_the_tensor_given_and_carry_their_ids(pair):
    writer, reader = pair
    t = sample((3, 4), seed=3)
    p = par(axis("pp", 1, 2, stage_id=1), axis("ep", 2, 4, expert_id=7))
    assert writer.put_tensor_with_parallelism("e", t, parallelism=p) == 0
    key = "e__ep_2of4_eid7__pp_1of2_sid1"
    assert reader.get(key) == header(torch.int32, (3, 4), (3, 4),
                                     [(EP, 2, 4, -1, 7), (PP, 1, 2, -1, 1)]) + raw(t)
    same(reader.get_tensor_with_parallelism("e", target("as_stored", p)), t)
    assert reader.get_tensor_with_parallelism("e", target("full", p)) is None  # nothing cuts it
    # an EP axis with a split_dim stores an expert shard given; the whole rebuilds from them
    t2 = sample((4, 6), seed=4)
    for rank in range(2):
        assert writer.upsert_tensor_with_parallelism(
            "x", t2[:, 3 * rank:3 * rank + 3],
            parallelism=par(axis("ep", rank, 2, 1, expert_id=rank))) == 0
    assert reader.get("x__ep_1of2_sd1_eid1") == header(
        torch.int32, (4, 6), (4, 3), [(EP, 1, 2, 1, 1)]) + raw(t2[:, 3:])


def test_writer_partitions_store_each_writers_piece(pair):
    writer, reader = pair
    t = sample((2, 3, 8), torch.int16, seed=5)
    assert writer.batch_put_tensor_with_parallelism(
        ["w", "w", "w", "w"], [t] * 4,
        writer_partitions=[(r, 4, 2) for r in range(4)]) == [0, 0, 0, 0]
    for r in range(4):
        assert reader.get("w__writer_%dof4_sd2" % r) == header(
            torch.int16, (2, 3, 8), (2, 3, 2), [(TP, r, 4, 2, 0)]) + raw(t[:, :, 2 * r:2 * r + 2])
    # a lone TP target of the same cut reads a writer's piece, and rebuilds from them all
    same(reader.get_tensor_with_parallelism("w", target("shard", par(axis("tp", 3, 4, 2)))),
         t[:, :, 6:])
    same(reader.get_tensor_with_parallelism("w", target("full", par(axis("tp", 0, 4, 2)))), t)
    assert writer.put_tensor_with_parallelism("both", t, parallelism=par(axis("tp", 0, 2, 0)),
                                              writer_partition=(0, 2, 0)) == -600
    assert reader.batch_is_exist(["both_tp_0", "both__writer_0of2_sd0"]) == [0, 0]


def test_the_from_forms_take_a_registered_tensor_buffer(pair):
    writer, reader = pair
    t = sample((4, 4), seed=6)
    value = header(torch.int32, (4, 4), (4, 4)) + raw(t)
    buf = ctypes.create_string_buffer(value, len(value))
    base = ctypes.addressof(buf)
    assert writer.register_buffer(base, len(value)) == 0
    assert writer.batch_put_tensor_with_parallelism_from(
        ["f", "f"], [base, base], [len(value)] * 2,
        parallelisms=[par(axis("tp", r, 2, 1), axis("pp", 0, 1)) for r in range(2)]) == [0, 0]
    assert reader.get("f__tp_1of2_sd1__pp_0of1") == header(
        torch.int32, (4, 4), (4, 2), [(TP, 1, 2, 1, 0), (PP, 0, 1, -1, 0)]) + raw(t[:, 2:])
    same(reader.get_tensor_with_parallelism(
        "f", target("full", par(axis("pp", 0, 1), axis("tp", 1, 2, 1)))), t)
    assert writer.put_tensor_with_parallelism_from("g", base, len(value),
                                                   writer_partition=(1, 2, 0)) == 0
    same(reader.get_tensor("g__writer_1of2_sd0"), t[2:])
    assert writer.unregister_buffer(base) == 0


def test_a_foreign_writers_tp_shards_rebuild(pair):
    """Shards stored byte for byte as Mooncake's client stores them (put here
    as plain values) read back whole with no parallelism named."""
    writer, reader = pair
    t = sample((3, 8), torch.float32, seed=7).float()
    for r in range(4):
        piece = t[:, 2 * r:2 * r + 2]
        assert writer.put("foreign_tp_%d" % r, header(torch.float32, (3, 8), (3, 2),
                                                       [(TP, r, 4, 1, 0)]) + raw(piece)) == 0
    same(reader.get_tensor_with_parallelism("foreign", target("full")), t)


def test_shard_sets_that_are_not_one_tensor_are_refused(pair, caplog):
    writer, reader = pair
    t = sample((4, 4), seed=8)
    for r in range(2):  # rank 1 claims another whole shape
        g = (4, 4) if r == 0 else (4, 6)
        assert writer.put("bad_tp_%d" % r, header(torch.int32, g, (4, 2), [(TP, r, 2, 1, 0)])
                          + raw(t[:, 2 * r:2 * r + 2])) == 0
    with caplog.at_level(logging.WARNING, logger="mooncake.store"):
        assert reader.get_tensor_with_parallelism("bad", target("full")) is None
    assert "shard 'bad_tp_1' is not rank 1 of 2 along dimension 1" in caplog.text
    assert writer.put_tensor_with_parallelism("half", t, parallelism=par(
        axis("tp", 0, 2, 0), axis("dp", 0, 1))) == 0  # rank 1 never written
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="mooncake.store"):
        assert reader.get_tensor_with_parallelism("half", target("full", par(
            axis("tp", 0, 2, 0), axis("dp", 0, 1)))) is None
    assert "-704" in caplog.text
    for bad in (par(axis("tp", 2, 2, 0)),                        # rank past size
                par(axis("tp", 0, 3, 0), axis("dp", 0, 1)),      # 4 rows do not cut in 3
                par(axis("tp", 0, 2, 0), axis("dp", 0, 2, 1)),   # two axes cut
                par(axis("tp", 0, 2, 0), axis("tp", 1, 2, 0)),   # a kind twice
                par(axis("sp", 0, 2, 0)),                        # no such kind
                par()):                                          # no axes
        assert writer.put_tensor_with_parallelism("r", t, parallelism=bad) == -600
    assert writer.put_tensor_with_parallelism("r", t, parallelism=par(
        axis("tp", 0, 2, 5), axis("dp", 0, 1))) == -600  # split_dim past the shape
    assert reader.batch_is_exist(["r_tp_2", "r__dp_0of1__tp_0of3_sd0", "r_tp_0"]) == [0, 0, 0]
    assert reader.get_tensor_with_parallelism("r", target("shard")) is None  # shard needs axes
    # an unregistered buffer: read through a copy, as get_tensor_into
    mine = ctypes.create_string_buffer(b"\xcd" * 1024, 1024)
    stored = target("as_stored", par(axis("tp", 0, 2, 0), axis("dp", 0, 1)))
    got = reader.get_tensor_with_parallelism_into("half", ctypes.addressof(mine), 1024, stored)
    assert torch.equal(got, reader.get_tensor_with_parallelism("half", stored))
    assert got.data_ptr() == ctypes.addressof(mine) + HEADER


def manifest(dtype_code, shape, split_dim, count):
    """Mooncake's WriterShardManifest (its store_py_internal.h), field by field:
    magic "NAMW", version 1, its size 96, dtype, ndim, split_dim, shard count,
    a reserved 0, 4 bytes of padding, 8 dimensions (-1 past ndim)."""
    dims = list(shape) + [-1] * (8 - len(shape))
    return (struct.pack("<IHH", 0x574D414E, 1, 96)
            + struct.pack("<iiiii", dtype_code, len(shape), split_dim, count, 0)
            + b"\0" * 4 + struct.pack("<8q", *dims))


INT16, INT32 = 4, 6  # Mooncake's TensorDtype numbers


def test_writes_leave_mooncakes_manifests(pair):
    """A writer partition leaves key__writer_manifest, a layout with a TP axis
    key__parallelism_manifest (the whole tensor's shape: a lone TP axis's
    shard times its count), scope axes none; byte for byte Mooncake's."""
    writer, reader = pair
    t = sample((2, 3, 8), torch.int16, seed=7)
    for r in range(4):
        assert writer.put_tensor_with_parallelism("w", t, writer_partition=(r, 4, 2)) == 0
    assert reader.get("w__writer_manifest") == manifest(INT16, (2, 3, 8), 2, 4)
    assert writer.put_tensor_with_parallelism(
        "lone", t[:, :, :2], parallelism=par(axis("tp", 0, 4, 2))) == 0
    assert reader.get("lone__parallelism_manifest") == manifest(INT16, (2, 3, 8), 2, 4)
    assert writer.put_tensor_with_parallelism(
        "m", t, parallelism=par(axis("tp", 1, 3, 1), axis("dp", 0, 2))) == 0
    assert reader.get("m__parallelism_manifest") == manifest(INT16, (2, 3, 8), 1, 3)
    assert writer.put_tensor_with_parallelism(
        "e", t, parallelism=par(axis("ep", 0, 2, expert_id=1))) == 0
    assert reader.batch_is_exist(["e__parallelism_manifest", "w__parallelism_manifest",
                                  "lone__writer_manifest"]) == [0, 0, 0]


def test_full_reads_follow_the_manifests(pair, caplog):
    """"full" without a parallelism rebuilds a writer-partitioned tensor from
    the writers its manifest names; with a TP axis, the shard count and
    split_dim come from key__parallelism_manifest (a TP target of another
    size rebuilds the same whole), as Mooncake's reads. A manifest put by
    hand (Mooncake's bytes) is read the same, and one naming another shape
    than the shards make is refused with both named."""
    writer, reader = pair
    t = sample((4, 8), seed=8)
    assert writer.batch_put_tensor_with_parallelism(
        ["w"] * 4, [t] * 4, writer_partitions=[(r, 4, 1) for r in range(4)]) == [0] * 4
    same(reader.get_tensor_with_parallelism("w", target("full")), t)
    for r in range(4):  # a TP layout of 4 shards, read whole through a TP target of 2
        assert writer.put_tensor_with_parallelism(
            "tp", t[:, 2 * r:2 * r + 2], parallelism=par(axis("tp", r, 4, 1))) == 0
    same(reader.get_tensor_with_parallelism("tp", target("full", par(axis("tp", 0, 2, 1)))), t)
    # Mooncake's manifest put by hand over foreign writer shards
    for r in range(2):
        assert writer.put_tensor_with_parallelism("f", t, writer_partition=(r, 2, 0)) == 0
    assert writer.remove("f__writer_manifest") == 0
    assert writer.put("f__writer_manifest", manifest(INT32, (4, 8), 0, 2)) == 0
    same(reader.get_tensor_with_parallelism("f", target("full")), t)
    assert writer.upsert("f__writer_manifest", manifest(INT32, (4, 9), 0, 2)) == 0
    with caplog.at_level(logging.WARNING, logger="mooncake.store"):
        assert reader.get_tensor_with_parallelism("f", target("full")) is None
    assert "its manifest names int32 of (4, 9)" in caplog.text


def test_a_shard_of_another_tp_count_is_read_from_the_stored_ones(pair, caplog):
    """A "shard" read asking a TP count other than the one stored (the
    parallelism manifest says which) gets its rows from the stored shards
    that hold them, behind the target shard's header (also into a buffer);
    a count that does not cut the dimension into equal pieces is None."""
    writer, reader = pair
    t = sample((4, 8), seed=9)
    for r in range(4):  # lone TP shards (the caller's pieces), and TP among DP (whole input)
        assert writer.put_tensor_with_parallelism(
            "s", t[:, 2 * r:2 * r + 2], parallelism=par(axis("tp", r, 4, 1))) == 0
        assert writer.put_tensor_with_parallelism(
            "d", t, parallelism=par(axis("dp", 1, 2), axis("tp", r, 4, 1))) == 0
    same(reader.get_tensor_with_parallelism("s", target("shard", par(axis("tp", 1, 2, 1)))),
         t[:, 4:])
    same(reader.get_tensor_with_parallelism("s", target("shard", par(axis("tp", 5, 8, 1)))),
         t[:, 5:6])
    same(reader.get_tensor_with_parallelism(
        "d", target("shard", par(axis("dp", 1, 2), axis("tp", 0, 2, 1)))), t[:, :4])
    same(reader.get_tensor_with_parallelism("s", target("shard", par(axis("tp", 2, 4, 1)))),
         t[:, 4:6])  # the count stored: the shard itself
    buf = ctypes.create_string_buffer(1024)
    base = ctypes.addressof(buf)
    assert reader.register_buffer(base, 1024) == 0
    same(reader.get_tensor_with_parallelism_into("s", base, 1024,
                                                 target("shard", par(axis("tp", 0, 2, 1)))),
         t[:, :4])
    assert ctypes.string_at(base, HEADER + 4 * 4 * 4) == header(
        torch.int32, (4, 8), (4, 4), [(TP, 0, 2, 1, 0)]) + raw(t[:, :4])
    assert reader.unregister_buffer(base) == 0
    with caplog.at_level(logging.WARNING, logger="mooncake.store"):
        assert reader.get_tensor_with_parallelism(
            "s", target("shard", par(axis("tp", 0, 3, 1)))) is None
    assert "3 equal shards along dimension 1 are not a cut of it" in caplog.text
