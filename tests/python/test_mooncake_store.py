"""test_mooncake_store.py - mooncake.store.MooncakeDistributedStore on ferry's
store (docs/store.md): a `ferry store-master` process and two clients, driven
the way SGLang's HiCache L3 backend drives Mooncake's store (setup with seven
positional arguments, register_buffer on a host KV pool, warm-up
put/is_exist/get, then batch_is_exist, batch_put_from and batch_get_into with
keys "{prefix}_{hash}_{rank}_k|v"), every byte checked; and a client that
rejoins its master after the master was killed and started again."""

import ctypes
import os
import re
import subprocess
import sys

import pytest

from conftest import ferry_tool

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

from mooncake.store import MooncakeDistributedStore, ReplicateConfig  # noqa: E402

MiB = 1 << 20
PAGE = 64 * 1024  # one K or V page of the host pool


def tool_or_skip():
    tool = ferry_tool()
    if not tool:
        pytest.skip("ferry tool not found (set FERRY_TOOL or build build/ferry)")
    return tool


def start_master(*flags, port=0):
    """A `ferry store-master` process on port (0: any free one) and its address."""
    proc = subprocess.Popen([tool_or_skip(), "store-master", "--port=%d" % port] + list(flags),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    m = re.match(r"ready master=(\S+)", line)
    if not m:
        proc.kill()
        proc.wait(timeout=10)
        raise RuntimeError("store-master did not start: %r" % line)
    return proc, m.group(1)


def stop_master(proc):
    proc.terminate()
    proc.wait(timeout=30)


@pytest.fixture
def master():
    proc, addr = start_master("--default_kv_lease_ttl=500")
    yield addr
    stop_master(proc)


def client(master_addr, positional=True):
    store = MooncakeDistributedStore()
    if positional:
        rc = store.setup("127.0.0.1", "P2PHANDSHAKE", 32 * MiB, 16 * MiB, "tcp", "", master_addr)
    else:
        rc = store.setup({"local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE",
                          "global_segment_size": "32MB", "local_buffer_size": "16MB",
                          "protocol": "tcp", "master_server_addr": master_addr})
    assert rc == 0
    return store


def page_bytes(seed):
    return bytes((seed * 131 + i * 7 + (i >> 9) * 13 + 1) & 0xFF for i in range(PAGE))


def test_hicache_call_pattern(master):
    writer, reader = client(master), client(master, positional=False)
    try:
        # The host KV pool, registered once by each rank.
        pages = 24
        pool_w = ctypes.create_string_buffer(pages * PAGE)
        pool_r = ctypes.create_string_buffer(pages * PAGE)
        base_w, base_r = ctypes.addressof(pool_w), ctypes.addressof(pool_r)
        assert writer.register_buffer(base_w, pages * PAGE) == 0
        assert reader.register_buffer(base_r, pages * PAGE) == 0

        # Warm-up, as HiCache's backend does at start.
        assert writer.put("warmup_key", b"warmup_value") == 0
        assert reader.is_exist("warmup_key") == 1
        assert reader.get("warmup_key") == b"warmup_value"

        keys = ["sglang_%016x_0_%s" % (h * 0x9E3779B97F4A7C15 & (2**64 - 1), kv)
                for h in range(pages // 2) for kv in ("k", "v")]
        ptrs_w = [base_w + i * PAGE for i in range(pages)]
        ptrs_r = [base_r + i * PAGE for i in range(pages)]
        sizes = [PAGE] * pages
        for i in range(pages):
            ctypes.memmove(ptrs_w[i], page_bytes(i), PAGE)

        assert reader.batch_is_exist(keys) == [0] * pages  # dedup: none stored yet
        assert writer.batch_put_from(keys, ptrs_w, sizes) == [0] * pages
        assert reader.batch_is_exist(keys) == [1] * pages
        assert reader.get_size(keys[3]) == PAGE

        assert reader.batch_get_into(keys, ptrs_r, sizes) == [PAGE] * pages
        for i in range(pages):
            assert ctypes.string_at(ptrs_r[i], PAGE) == page_bytes(i), keys[i]

        # The writer reads its own back too; an absent key answers -704.
        ctypes.memset(base_w, 0, pages * PAGE)
        assert writer.batch_get_into(keys[:4] + ["absent_0_k"], ptrs_w[:5], sizes[:5]) == \
            [PAGE] * 4 + [-704]
        assert ctypes.string_at(ptrs_w[2], PAGE) == page_bytes(2)
        assert reader.get("absent_0_k") == b""
        assert reader.is_exist("absent_0_k") == 0

        # One replica in each client's segment, the first in the reader's.
        config = ReplicateConfig(replica_num=2, preferred_segment=reader.get_hostname())
        assert writer.put_from("both", ptrs_w[2], PAGE, config) == 0
        assert reader.get_into("both", ptrs_r[0], PAGE) == PAGE
        assert ctypes.string_at(ptrs_r[0], PAGE) == page_bytes(2)

        # A buffer too small for the value, and a full pool, fail by number.
        assert reader.get_into(keys[0], ptrs_r[0], PAGE - 1) == -600
        big = ctypes.create_string_buffer(48 * MiB)
        assert writer.put("too_big", bytes(big)) == -200
        assert writer.remove("absent_0_k") == -704
        assert writer.put("pinned", b"x", ReplicateConfig(with_soft_pin=True)) == 0
        assert reader.get("pinned") == b"x"
        assert writer.unregister_buffer(base_w) == 0
        assert reader.unregister_buffer(base_r) == 0
    finally:
        assert writer.close() == 0
        assert reader.close() == 0


def test_upsert_replaces_a_value(master):
    """put keeps a stored value; upsert and its forms replace it (another
    size too) or store a new key."""
    store = client(master)
    region = ctypes.create_string_buffer(2 * PAGE)
    base = ctypes.addressof(region)
    try:
        assert store.put("k", b"first") == 0
        assert store.put("k", b"second") == 0
        assert store.get("k") == b"first"
        assert store.upsert("k", b"replaced, and longer") == 0
        assert store.get("k") == b"replaced, and longer"
        assert store.upsert("new", b"v", ReplicateConfig(with_soft_pin=True)) == 0
        assert store.get("new") == b"v"
        assert store.upsert_parts("parts", b"Hello, ", bytearray(b"World!")) == 0
        assert store.get("parts") == b"Hello, World!"
        assert store.upsert_batch(["k", "b1"], [page_bytes(1), page_bytes(2)]) == 0
        assert (store.get("k"), store.get("b1")) == (page_bytes(1), page_bytes(2))
        assert store.upsert_batch(["k"], []) == -600
        assert store.register_buffer(base, 2 * PAGE) == 0
        ctypes.memmove(base, page_bytes(3), PAGE)
        ctypes.memmove(base + PAGE, page_bytes(4), PAGE)
        assert store.upsert_from("k", base, PAGE) == 0
        assert store.get("k") == page_bytes(3)
        assert store.batch_upsert_from(["k", "b1"], [base + PAGE, base], [PAGE, 100]) == [0, 0]
        assert (store.get("k"), store.get("b1")) == (page_bytes(4), page_bytes(3)[:100])
        assert store.unregister_buffer(base) == 0
    finally:
        assert store.close() == 0


def test_a_buffer_copied_into_the_own_segment_must_be_registered(master):
    """A replica in the caller's own segment is copied in memory; the copy
    refuses an unregistered buffer (-600) as a transfer does."""
    store = client(master)
    loose = ctypes.create_string_buffer(PAGE)
    try:
        own = ReplicateConfig(preferred_segment=store.get_hostname())
        assert store.put_from("mine", ctypes.addressof(loose), PAGE, own) == -600
        assert store.is_exist("mine") == 0
        assert store.put("mine", page_bytes(9), own) == 0
        assert store.get_into("mine", ctypes.addressof(loose), PAGE) == -600
        assert ctypes.string_at(ctypes.addressof(loose), PAGE) == bytes(PAGE)
    finally:
        assert store.close() == 0


def test_several_buffers_per_key(master):
    """batch_put_from_multi_buffers / batch_get_into_multi_buffers: one value
    per key from one buffer per layer (layer-major, as a KV pool lays them
    out), every byte checked; buffers too small for a key fail that key
    (-600); an unregistered buffer is refused (-600), nothing stored."""
    writer, reader = client(master), client(master)
    layers = [4096, 60000, 100, 32773]
    keys = ["block_%d" % k for k in range(3)]
    total = sum(layers)
    src = ctypes.create_string_buffer(len(keys) * total)
    dst = ctypes.create_string_buffer(len(keys) * total)
    loose = ctypes.create_string_buffer(100)
    try:
        assert writer.register_buffer(ctypes.addressof(src), len(keys) * total) == 0
        assert reader.register_buffer(ctypes.addressof(dst), len(keys) * total) == 0

        def addrs(region):
            base, at, out = ctypes.addressof(region), 0, [[] for _ in keys]
            for size in layers:
                for k in range(len(keys)):
                    out[k].append(base + at)
                    at += size
            return out

        src_ptrs, dst_ptrs = addrs(src), addrs(dst)
        sizes = [list(layers) for _ in keys]
        parts = [[page_bytes(k * 4 + l)[:size] for l, size in enumerate(layers)]
                 for k in range(len(keys))]
        for k in range(len(keys)):
            for l, part in enumerate(parts[k]):
                ctypes.memmove(src_ptrs[k][l], part, len(part))
        assert writer.batch_put_from_multi_buffers(keys, src_ptrs, sizes) == [0] * 3
        assert reader.batch_get_into_multi_buffers(keys, dst_ptrs, sizes) == [total] * 3
        for k in range(len(keys)):
            for l, part in enumerate(parts[k]):
                assert ctypes.string_at(dst_ptrs[k][l], len(part)) == part, (k, l)
        assert reader.get(keys[1]) == b"".join(parts[1])

        short = [dst_ptrs[0], dst_ptrs[1][:-1], dst_ptrs[2]]
        assert reader.batch_get_into_multi_buffers(keys, short, [layers, layers[:-1], layers],
                                                   True) == [total, -600, total]
        assert writer.batch_put_from_multi_buffers(
            ["other"], [src_ptrs[0][:2] + [ctypes.addressof(loose)]],
            [layers[:2] + [100]]) == [-600]
        assert reader.is_exist("other") == 0
    finally:
        assert writer.close() == 0
        assert reader.close() == 0


def test_setup_failures_are_numbers(master):
    store = MooncakeDistributedStore()
    assert store.setup("127.0.0.1", "P2PHANDSHAKE", "lots", 16 * MiB, "tcp", "", master) == -600
    assert store.setup("127.0.0.1", "P2PHANDSHAKE", 1 * MiB, 1 * MiB, "tcp", "",
                       "127.0.0.1:1") < 0  # nothing listens there
    assert store.put("k", b"v") == -600  # not set up
    assert store.close() == 0


def test_a_killed_master_restarted_on_its_port_is_rejoined(caplog):
    """The master killed (SIGKILL) and started again on the same port: a call
    while it is down fails (-900) naming it; the next call after it is back
    reconnects, registers the segment again and works; what the old master
    stored is gone."""
    proc, addr = start_master("--default_kv_lease_ttl=500")
    store = None
    try:
        store = client(addr)
        assert store.put("before", b"stored before") == 0
        assert store.get("before") == b"stored before"
        proc.kill()
        proc.wait(timeout=30)
        assert store.is_exist("before") == -900  # RPC_FAIL
        assert "store master %s" % addr in caplog.text
        proc, again = start_master("--default_kv_lease_ttl=500", port=int(addr.rsplit(":", 1)[1]))
        assert again == addr
        assert store.put("after", page_bytes(5)) == 0  # its segment is the only one
        assert store.get("after") == page_bytes(5)
        assert store.is_exist("before") == 0
    finally:
        if store is not None:
            assert store.close() == 0
        proc.kill()
        proc.wait(timeout=30)


def test_pins_reach_the_master_and_a_full_pool_evicts(caplog):
    """A 1 MiB pool of sixteen 64 KiB values (the watermark at 1: eviction only
    for a put that does not fit): unpinned values make room, least recently
    used first; a soft-pinned one goes only when nothing unpinned is left;
    hard-pinned ones never go, so with only them left a put fails (-200),
    saying why."""
    proc, addr = start_master("--eviction_high_watermark_ratio=1")
    store = MooncakeDistributedStore()
    try:
        assert store.setup("127.0.0.1", "P2PHANDSHAKE", 1 * MiB, 1 * MiB, "tcp", "", addr) == 0
        hard, soft = ReplicateConfig(with_hard_pin=True), ReplicateConfig(with_soft_pin=True)
        assert store.put("soft", page_bytes(100), soft) == 0
        for i in range(7):
            assert store.put("hard_%d" % i, page_bytes(i), hard) == 0
        for i in range(8):
            assert store.put("plain_%d" % i, page_bytes(50 + i)) == 0
        assert store.put("more", page_bytes(60)) == 0  # full: the oldest unpinned one goes
        assert store.is_exist("plain_0") == 0
        assert store.is_exist("soft") == 1
        for i in range(7, 14):  # each takes an unpinned one's place
            assert store.put("hard_%d" % i, page_bytes(i), hard) == 0
        assert store.batch_is_exist(["plain_%d" % i for i in range(1, 8)]) == [0] * 7
        assert store.put("hard_14", page_bytes(14), hard) == 0  # "more" goes: the last unpinned
        assert store.is_exist("more") == 0
        assert store.is_exist("soft") == 1
        assert store.put("hard_15", page_bytes(15), hard) == 0  # then the soft-pinned one
        assert store.is_exist("soft") == 0
        with caplog.at_level("WARNING", logger="mooncake.store"):
            assert store.put("last", page_bytes(16)) == -200
        assert "16 hard-pinned" in caplog.text
        for i in range(16):
            assert store.get("hard_%d" % i) == page_bytes(i)
    finally:
        assert store.close() == 0
        stop_master(proc)


@pytest.mark.parametrize("flag", ["--eviction_ratio=0", "--eviction_high_watermark_ratio=1.5",
                                  "--eviction_ratio=lots", "--default_kv_soft_pin_ttl=0"])
def test_eviction_flags_are_checked(flag):
    done = subprocess.run([tool_or_skip(), "store-master", "--port=0", flag],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    assert flag.split("=")[0] in done.stderr
