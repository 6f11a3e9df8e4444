"""test_mooncake_store_tensor.py - the tensor helpers of
mooncake.store.MooncakeDistributedStore (docs/store.md, "Tensors") against a
`ferry store-master` and two clients: dtypes, 0-d and empty tensors,
non-contiguous input, the header laid out byte for byte as Mooncake's client
writes it (checked against offsets written out here, not against
mooncake/_tensor.py), a value in that format stored by another writer read
back, get_tensor_into's buffer (too small; viewed without a copy), corrupted
and foreign values refused with their cause, and tensor-parallel shards split
and merged; every byte compared."""

import ctypes
import logging
import struct

import pytest

torch = pytest.importorskip("torch")

from test_mooncake_store import client, master  # noqa: E402,F401  (the fixture)

from mooncake.store import (ReplicateConfig, _deserialize_tensor, _serialize_tensor,  # noqa: E402
                            _tensor_metadata_size)

HEADER = 304
# Mooncake's TensorDtype numbers.
CODES = {torch.float32: 0, torch.float64: 1, torch.int8: 2, torch.uint8: 3, torch.int16: 4,
         torch.int32: 6, torch.int64: 8, torch.bool: 10, torch.float16: 11, torch.bfloat16: 12}


def as_bytes(t):
    """A tensor's bytes in memory order (bfloat16 too, which numpy lacks)."""
    return bytes(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())


def sample(dtype, shape, seed):
    """A tensor of shape whose bytes vary (bools 0/1)."""
    g = torch.Generator().manual_seed(seed)
    n = 1
    for d in shape:
        n *= d
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=g, dtype=torch.uint8).bool().reshape(shape)
    size = torch.empty(0, dtype=dtype).element_size()
    raw = torch.randint(0, 256, (n * size,), generator=g, dtype=torch.uint8)
    return raw.view(dtype).reshape(shape)


def same(got, want):
    assert got is not None
    assert got.dtype == want.dtype and tuple(got.shape) == tuple(want.shape)
    assert as_bytes(got) == as_bytes(want)


def header(dtype, global_shape, local_shape=None, axes=()):
    """Mooncake's TensorMetadata, field by field at its C offsets:
    TensorObjectHeader {u32 magic @0, u16 version @4, u16 header_size @6,
    i32 dtype @8, i32 ndim @12, u32 layout_kind @16, u32 reserved_flags @20,
    u64 data_offset @24, u64 data_bytes @32}, then TensorLayoutMetadata
    {i64 global[8] @40, i64 local[8] @104, u32 axis_count @168, u32 @172,
    LayoutAxis[4] @176 of {i32 kind, axis_index, shard_rank, shard_count,
    split_dim, reserved0; i64 reserved1 (the shard's extent on split_dim)}}."""
    local_shape = tuple(global_shape if local_shape is None else local_shape)
    n = 1
    for d in local_shape:
        n *= d
    out = bytearray(HEADER)
    struct.pack_into("<IHH", out, 0, 0x4D4F4F4E, 1, HEADER)
    struct.pack_into("<iiII", out, 8, CODES[dtype], len(global_shape), 1 if axes else 0, 0)
    struct.pack_into("<QQ", out, 24, HEADER, n * torch.empty(0, dtype=dtype).element_size())
    for at, shape in ((40, global_shape), (104, local_shape)):
        dims = list(shape) + [-1] * (8 - len(shape))
        struct.pack_into("<8q", out, at, *dims)
    struct.pack_into("<I", out, 168, len(axes))
    for i, axis in enumerate(axes):  # (rank, count, split_dim): a TP axis; or
        # (kind, rank, count, split_dim, reserved0: EP expert / PP stage id)
        kind, rank, count, split, r0 = axis if len(axis) == 5 else (1,) + tuple(axis) + (0,)
        struct.pack_into("<6iq", out, 176 + 32 * i, kind, i, rank, count, split, r0,
                         local_shape[split] if split >= 0 else 0)
    return bytes(out)


def test_dtypes_and_shapes_round_trip(master):
    """Every dtype, 0-d, empty and 3-d, put by one client and read by the
    other (remote READ) and by the writer (its own segment), singly and in
    batches; the header each value carries is Mooncake's, byte for byte."""
    writer, reader = client(master), client(master)
    try:
        tensors, keys = [], []
        for i, dtype in enumerate(CODES):
            for j, shape in enumerate([(), (0, 3), (3, 5, 7)]):
                tensors.append(sample(dtype, shape, i * 3 + j))
                keys.append("t_%s_%d" % (str(dtype)[6:], j))
        for key, t in zip(keys[::2], tensors[::2]):
            assert writer.put_tensor(key, t) == 0, key
        assert writer.batch_put_tensor(keys[1::2], tensors[1::2]) == [0] * len(keys[1::2])
        for key, t in zip(keys, tensors):
            same(reader.get_tensor(key), t)
            assert reader.get(key) == header(t.dtype, tuple(t.shape)) + as_bytes(t), key
        for got, t in zip(writer.batch_get_tensor(keys), tensors):
            same(got, t)
        assert reader.get_tensor("absent") is None
        assert reader.batch_get_tensor(["absent", keys[0]])[0] is None
    finally:
        writer.close()
        reader.close()


def test_non_contiguous_input_is_stored_contiguous(master):
    """A transposed or sliced tensor is stored as its contiguous copy would
    be, as Mooncake's put does."""
    store = client(master)
    try:
        base = sample(torch.int32, (6, 8), 1)
        for key, t in (("transposed", base.t()), ("strided", base[::2, 1::3])):
            assert not t.is_contiguous()
            assert store.put_tensor(key, t) == 0
            same(store.get_tensor(key), t.contiguous())
            assert store.get(key)[HEADER:] == as_bytes(t)
    finally:
        store.close()


def test_a_registered_tensor_is_put_without_a_copy(master, monkeypatch):
    """A tensor in registered memory goes straight from its memory (the
    copying path is not taken); one outside it through the copy."""
    store = client(master)
    pool = torch.zeros(4, 1024, dtype=torch.float16)
    try:
        assert store.register_buffer(pool.data_ptr(), pool.numel() * 2) == 0
        pool.copy_(sample(torch.float16, (4, 1024), 7))
        taken = []
        real = store._put_copied
        monkeypatch.setattr(store, "_put_copied",
                            lambda *a: taken.append(1) or real(*a))
        assert store.batch_put_tensor(["row0", "row1"], [pool[0], pool[1]]) == [0, 0]
        assert taken == []
        same(store.get_tensor("row1"), pool[1])
        assert store.put_tensor("loose", sample(torch.float16, (9,), 8)) == 0
        assert taken == [1]
        same(store.get_tensor("loose"), sample(torch.float16, (9,), 8))
        assert store.unregister_buffer(pool.data_ptr()) == 0
    finally:
        store.close()


def test_a_value_in_mooncakes_format_from_another_writer_is_read(master):
    """Bytes laid out as Mooncake's client stores a tensor (built here from
    the offsets), put as plain bytes, come back as that tensor; and the
    module-level serializers agree with them."""
    store = client(master)
    try:
        t = sample(torch.bfloat16, (2, 3, 4), 5)
        value = header(torch.bfloat16, (2, 3, 4)) + as_bytes(t)
        assert store.put("foreign", value) == 0
        same(store.get_tensor("foreign"), t)
        head, ptr, size, owner = _serialize_tensor(t)
        assert (head, size, _tensor_metadata_size()) == (value[:HEADER], 24 * 2, HEADER)
        assert ctypes.string_at(ptr, size) == as_bytes(t)
        same(_deserialize_tensor(value), t)
        # The data further on (a writer's padding): at offset 306, unaligned for float32.
        f = sample(torch.float32, (3,), 6)
        for offset in (312, 306):
            padded = bytearray(header(torch.float32, (3,)) + bytes(offset - HEADER))
            struct.pack_into("<Q", padded, 24, offset)
            assert store.upsert("padded", bytes(padded) + as_bytes(f)) == 0
            same(store.get_tensor("padded"), f)
        with pytest.raises(ValueError, match="magic"):
            _deserialize_tensor(b"\0" * 400)
    finally:
        store.close()


def test_corrupted_and_foreign_values_are_refused_with_their_cause(master, caplog):
    """A value that is not a tensor (short, wrong magic, sizes that disagree,
    a bad axis) reads as None with the cause logged; put_tensor_from refuses
    such a buffer and stores nothing; put_tensor refuses what the format
    cannot carry."""
    store = client(master)
    good = header(torch.int64, (4,)) + as_bytes(torch.arange(4))
    bad_axis = bytearray(header(torch.int64, (4,), (2,), axes=[(0, 2, 0)]) + bytes(16))
    struct.pack_into("<i", bad_axis, 176 + 8, 5)  # shard_rank 5 of 2
    bad_shape = bytearray(header(torch.int64, (5,)))
    struct.pack_into("<Q", bad_shape, 32, 32)  # data_bytes 32 for 5 int64
    cases = {
        "short": (b"\1" * 100, "fewer than a tensor header"),
        "magic": (b"x" * 400, "not a Mooncake tensor: magic 0x78787878"),
        "sizes": (good[:-8], "data at offset 304, 32 bytes, in a value of 328"),
        "shape": (bytes(bad_shape) + bytes(32), "holds 40 bytes, the header says 32"),
        "axis": (bytes(bad_axis), "bad layout axis 0: kind 1, rank 5 of 2"),
    }
    region = ctypes.create_string_buffer(4096)
    base = ctypes.addressof(region)
    try:
        assert store.register_buffer(base, 4096) == 0
        for key, (value, cause) in cases.items():
            assert store.put(key, value) == 0
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger="mooncake.store"):
                assert store.get_tensor(key) is None
                assert store.get_tensor_into(key, base, 4096) is None
            assert caplog.text.count(cause) == 2, (key, caplog.text)
            ctypes.memmove(base, value, len(value))
            assert store.put_tensor_from("from_" + key, base, len(value)) == -600
            assert store.is_exist("from_" + key) == 0
        ctypes.memmove(base, good, len(good))
        assert store.batch_put_tensor_from(["ok", "bad"], [base, base], [len(good), 100]) == \
            [-600, -600]
        assert store.put_tensor_from("ok", base, len(good)) == 0
        same(store.get_tensor("ok"), torch.arange(4))
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="mooncake.store"):
            assert store.put_tensor("c", torch.zeros(2, dtype=torch.complex64)) == -600
            assert store.put_tensor("n", [1.0, 2.0]) == -600
            assert store.put_tensor("d", torch.zeros([1] * 9)) == -600
        assert "complex64, which Mooncake's tensor format does not carry" in caplog.text
        assert "is a list, not a torch.Tensor" in caplog.text
        assert "9 dimensions; the format carries at most 8" in caplog.text
        assert store.batch_is_exist(["c", "n", "d"]) == [0, 0, 0]
    finally:
        store.close()


def test_get_tensor_into_views_the_buffer_and_refuses_a_small_one(master, caplog):
    """get_tensor_into answers a tensor over the caller's registered buffer
    (written there, no copy); a buffer too small answers None, logged, and
    is left as it was."""
    writer, reader = client(master), client(master)
    t = sample(torch.float32, (16, 64), 3)  # 4096 bytes of data
    region = ctypes.create_string_buffer(2 * 8192)
    base = ctypes.addressof(region)
    try:
        assert reader.register_buffer(base, 2 * 8192) == 0
        assert writer.batch_put_tensor(["a", "b"], [t, t[:2]]) == [0, 0]
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="mooncake.store"):
            assert reader.get_tensor_into("a", base, 4096) is None
        assert "get_tensor_into failed (-600)" in caplog.text
        assert "4400" in caplog.text and "4096" in caplog.text, caplog.text
        assert ctypes.string_at(base, 8192) == bytes(8192)
        got = reader.get_tensor_into("a", base, 8192)
        same(got, t)
        assert got.data_ptr() == base + HEADER
        ctypes.memset(base + HEADER, 0, 4)  # the tensor is the buffer
        assert got[0, 0].item() == 0.0
        both = reader.batch_get_tensor_into(["b", "a", "absent"], [base, base + 8192, base],
                                            [8192, 8192, 8192])
        same(both[0], t[:2])
        same(both[1], t)
        assert both[2] is None
        assert reader.batch_get_tensor_into(["a"], [base, base], [1, 2]) == [-600]
    finally:
        writer.close()
        reader.close()


def test_tensor_parallel_shards_split_and_merge(master, caplog):
    """put_tensor_with_tp stores tp_size equal shards under key_tp_<rank>,
    each with Mooncake's shard header; each rank reads its own; the shards
    concatenated are the tensor. A dimension that does not split evenly is
    refused, nothing stored; tp_size 1 is a plain put."""
    writer, reader = client(master), client(master)
    t = sample(torch.bfloat16, (4, 6, 3), 11)
    region = ctypes.create_string_buffer(4096)
    base = ctypes.addressof(region)
    try:
        assert reader.register_buffer(base, 4096) == 0
        for split, tp in ((0, 4), (1, 3), (2, 3)):
            key = "w%d" % split
            assert writer.put_tensor_with_tp(key, t, tp_size=tp, split_dim=split) == 0
            pieces = [reader.get_tensor_with_tp(key, tp_rank=r, tp_size=tp) for r in range(tp)]
            for r, piece in enumerate(pieces):
                want = t.narrow(split, r * t.shape[split] // tp, t.shape[split] // tp)
                same(piece, want)
                assert reader.get("%s_tp_%d" % (key, r)) == header(
                    torch.bfloat16, (4, 6, 3), tuple(want.shape),
                    axes=[(r, tp, split)]) + as_bytes(want)
            same(torch.cat(pieces, dim=split), t)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="mooncake.store"):
            assert writer.put_tensor_with_tp("odd", t, tp_size=4, split_dim=1) == -600
            assert writer.put_tensor_with_tp("odd", t, tp_size=2, split_dim=3) == -600
        assert "dimension 1 (6) does not split into 4 equal shards" in caplog.text
        assert "split_dim 3 is not a dimension of shape (4, 6, 3)" in caplog.text
        assert reader.batch_is_exist(["odd", "odd_tp_0", "odd_tp_1"]) == [0, 0, 0]

        tensors = [t, sample(torch.int8, (2, 8), 12)]
        two = ReplicateConfig(replica_num=2)
        assert writer.batch_pub_tensor_with_tp(["b0", "b1"], tensors, two, tp_size=2,
                                               split_dim=0) == [0, 0]
        rank1 = reader.batch_get_tensor_with_tp(["b0", "b1"], tp_rank=1, tp_size=2)
        same(rank1[0], t[2:])
        same(rank1[1], tensors[1][1:])
        into = reader.get_tensor_with_tp_into("b1", base, 4096, tp_rank=0, tp_size=2)
        same(into, tensors[1][:1])
        into = reader.batch_get_tensor_with_tp_into(["b0"], [base], [4096], tp_rank=0, tp_size=2)
        same(into[0], t[:2])
        # A whole tensor in the format in a registered buffer, split by the store.
        full = header(torch.bfloat16, (4, 6, 3)) + as_bytes(t)
        src = ctypes.create_string_buffer(full, len(full))
        assert writer.register_buffer(ctypes.addressof(src), len(full)) == 0
        assert writer.batch_put_tensor_with_tp_from(
            ["f", "g"], [ctypes.addressof(src)] * 2, [len(full), 100], tp_size=2,
            split_dim=1) == [0, -600]
        assert writer.put_tensor_with_tp_from("h", ctypes.addressof(src), len(full),
                                              tp_size=2, split_dim=0) == 0
        same(reader.get_tensor_with_tp("f", tp_rank=1, tp_size=2), t[:, 3:])
        same(reader.get_tensor_with_tp("h", tp_rank=0, tp_size=2), t[:2])
        assert reader.batch_is_exist(["g_tp_0", "g_tp_1"]) == [0, 0]
        assert writer.put_tensor_with_tp("whole", t, tp_size=1) == 0
        same(reader.get_tensor_with_tp("whole"), t)
        assert reader.is_exist("whole_tp_0") == 0
    finally:
        writer.close()
        reader.close()


def test_upsert_and_pub_forms(master):
    """upsert_tensor replaces a tensor (another dtype and shape too);
    put_tensor keeps the first; pub_tensor takes a ReplicateConfig."""
    writer, reader = client(master), client(master)
    try:
        a, b = sample(torch.float64, (5,), 20), sample(torch.int16, (3, 3), 21)
        assert writer.put_tensor("k", a) == 0
        assert writer.put_tensor("k", b) == 0  # an existing key keeps its value
        same(reader.get_tensor("k"), a)
        assert writer.upsert_tensor("k", b) == 0
        same(reader.get_tensor("k"), b)
        assert writer.batch_upsert_tensor(["k", "new"], [a, b]) == [0, 0]
        same(reader.get_tensor("k"), a)
        same(reader.get_tensor("new"), b)
        two = ReplicateConfig(replica_num=2)
        assert writer.pub_tensor("p", a, two) == 0
        assert writer.batch_pub_tensor(["p1", "p2"], [a, b], two) == [0, 0]
        assert writer.upsert_pub_tensor("p", b, two) == 0
        assert writer.batch_upsert_pub_tensor(["p1"], [b], two) == [0]
        for key, want in (("p", b), ("p1", b), ("p2", b)):
            same(reader.get_tensor(key), want)
        assert writer.batch_put_tensor(["x"], [a, b]) == [-600]
    finally:
        writer.close()
        reader.close()


def test_the_parallelism_calls_without_a_layout_are_the_whole_tensor_calls(master):
    """Mooncake's *_with_parallelism calls without a layout are the whole-
    tensor calls; a parallelism or target that is not one is refused (-600),
    nothing stored (the layouts: test_mooncake_store_parallel.py)."""
    writer, reader = client(master), client(master)
    t = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    assert writer.put_tensor_with_parallelism("par", t) == 0
    assert torch.equal(reader.get_tensor_with_parallelism("par"), t)
    assert writer.batch_put_tensor_with_parallelism(["par_a", "par_b"], [t, t + 1]) == [0, 0]
    assert torch.equal(reader.batch_get_tensor_with_parallelism(["par_a", "par_b"])[1], t + 1)
    assert writer.upsert_tensor_with_parallelism("par", t * 2) == 0
    assert torch.equal(reader.get_tensor("par"), t * 2)
    assert writer.put_tensor_with_parallelism("par_tp", t, parallelism=object()) == -600
    assert reader.is_exist("par_tp") == 0
    assert reader.get_tensor_with_parallelism("par", target=object()) is None
    writer.close()
    reader.close()


def test_get_tensor_into_an_unregistered_buffer_reads_through_a_copy(master, caplog):
    """Mooncake's tensor calls take any buffer (its structured object store
    reads into ctypes buffers it never registers): a buffer that is not
    registered gets the value through a registered block, copied; INFO says
    so once."""
    writer, reader = client(master), client(master)
    t = sample(torch.int64, (3, 4), 11)
    region = ctypes.create_string_buffer(2 * 4096)  # never registered
    base = ctypes.addressof(region)
    try:
        assert writer.batch_put_tensor(["u", "v"], [t, t[:1]]) == [0, 0]
        with caplog.at_level(logging.INFO, logger="mooncake.store"):
            got = reader.get_tensor_into("u", base, 4096)
            same(got, t)
            assert got.data_ptr() == base + HEADER
            both = reader.batch_get_tensor_into(["v", "absent"], [base + 4096, base],
                                                [4096, 4096])
        same(both[0], t[:1])
        assert both[1] is None
        assert caplog.text.count("values are read through a copy") == 1, caplog.text
        assert reader.get_tensor_into("u", base, 64) is None  # too small: still refused
    finally:
        writer.close()
        reader.close()
