"""test_mooncake_store.py - mooncake.store.MooncakeDistributedStore on ferry's
store (docs/store.md): a `ferry store-master` process and two clients, driven
the way SGLang's HiCache L3 backend drives Mooncake's store (setup with seven
positional arguments, register_buffer on a host KV pool, warm-up
put/is_exist/get, then batch_is_exist, batch_put_from and batch_get_into with
keys "{prefix}_{hash}_{rank}_k|v"), and as vLLM's MooncakeStoreConnector does
(multi-buffer blocks, replica descriptors), every byte checked; and a client that
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

from mooncake.store import MooncakeDistributedStore, ReplicateConfig, SoftPinAction  # noqa: E402

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


def test_vllm_store_connector_call_pattern(master):
    """vLLM's MooncakeStoreConnector: each rank registers its KV cache (host
    memory here: the GPU case is issue 30's) and stores a block as one key
    of one buffer per layer's K and V, keys as its worker names them
    ("model@tp_rank:R@pcp0@dcp0@pp_rank:0@HASH"); batch_is_exist to skip
    stored blocks, batch_put_from_multi_buffers with a ReplicateConfig,
    batch_get_replica_desc for the tier of each block, and
    batch_get_into_multi_buffers into the other rank's cache, every byte
    checked."""
    writer, reader = client(master), client(master, positional=False)
    layers, block = 3, 16 * 1024  # bytes of one block of one layer's K (or V)
    blocks = 6
    try:
        caches = []
        for store in (writer, reader):
            cache = ctypes.create_string_buffer(layers * 2 * blocks * block)
            assert store.register_buffer(ctypes.addressof(cache), len(cache.raw)) == 0
            caches.append(cache)

        def parts(cache, b):  # block b's K and V in each layer's tensor
            base = ctypes.addressof(cache)
            return [base + ((layer * 2 + kv) * blocks + b) * block
                    for layer in range(layers) for kv in range(2)]

        keys = ["Qwen2.5-7B@tp_rank:0@pcp0@dcp0@pp_rank:0@%032x" % (b * 0x9E3779B97F4A7C15)
                for b in range(blocks)]
        for b in range(blocks):
            for i, addr in enumerate(parts(caches[0], b)):
                ctypes.memmove(addr, page_bytes(b * 8 + i)[:block], block)
        sizes = [[block] * (2 * layers)] * blocks
        assert writer.batch_is_exist(keys) == [0] * blocks
        config = ReplicateConfig(replica_num=1, preferred_segment=writer.get_hostname())
        assert writer.batch_put_from_multi_buffers(
            keys[:4], [parts(caches[0], b) for b in range(4)], sizes[:4], config) == [0] * 4
        assert reader.batch_is_exist(keys) == [1] * 4 + [0] * 2  # the rest still to store
        assert writer.batch_put_from_multi_buffers(
            keys[4:], [parts(caches[0], b) for b in range(4, blocks)], sizes[4:], config) == \
            [0] * 2

        descs = reader.batch_get_replica_desc(keys + ["absent"])
        assert sorted(descs) == sorted(keys)
        for key in keys:
            assert [d.is_memory_replica() for d in descs[key]] == [True]
            memory = descs[key][0].get_memory_descriptor().buffer_descriptor
            assert memory.transport_endpoint == writer.get_hostname()
            assert memory.size == 2 * layers * block

        assert reader.batch_get_into_multi_buffers(
            keys, [parts(caches[1], b) for b in range(blocks)], sizes) == \
            [2 * layers * block] * blocks
        for b in range(blocks):
            for i, addr in enumerate(parts(caches[1], b)):
                assert ctypes.string_at(addr, block) == page_bytes(b * 8 + i)[:block], (b, i)
        assert reader.batch_get_into_multi_buffers(
            ["absent"], [parts(caches[1], 0)], sizes[:1]) == [-704]
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


def soft_config(action, ttl_ms=None, **kw):
    config = ReplicateConfig(**kw)
    config.soft_pin_action = action
    config.soft_pin_ttl_ms = ttl_ms
    return config


def test_soft_pin_actions_reach_the_master():
    """SoftPinAction and soft_pin_ttl_ms through put, put_batch and upsert, as
    Mooncake's: ENABLE pins (evicted only once nothing unpinned is left),
    an upsert with PRESERVE keeps the pin, DISABLE drops it; a TTL without
    ENABLE, or above max_kv_soft_pin_ttl, is refused with -600."""
    proc, addr = start_master("--eviction_high_watermark_ratio=1", "--max_kv_soft_pin_ttl=600000",
                              "--default_kv_soft_pin_ttl=600000")
    store = MooncakeDistributedStore()
    try:
        assert store.setup("127.0.0.1", "P2PHANDSHAKE", 1 * MiB, 1 * MiB, "tcp", "", addr) == 0
        enable = soft_config(SoftPinAction.ENABLE, 600000)
        assert store.put("soft", page_bytes(100), enable) == 0
        assert store.put_batch(["soft_b"], [page_bytes(101)], enable) == 0
        for i in range(14):
            assert store.put("plain_%d" % i, page_bytes(i)) == 0
        assert store.put("more", page_bytes(60)) == 0  # full: the oldest unpinned one goes
        assert store.is_exist("plain_0") == 0
        assert store.upsert("soft", page_bytes(102)) == 0  # PRESERVE: still pinned
        assert store.is_exist("plain_1") == 0
        # (the old value's space is free once the upsert commits)
        assert store.upsert("soft_b", page_bytes(103), soft_config(SoftPinAction.DISABLE)) == 0
        for i in range(20):  # the unpinned ones go, soft_b (unpinned now) among them
            assert store.put("new_%d" % i, page_bytes(i)) == 0
        assert store.is_exist("soft_b") == 0
        assert store.get("soft") == page_bytes(102)
        refused = [soft_config(SoftPinAction.PRESERVE, 10), soft_config(SoftPinAction.DISABLE, 10),
                   soft_config(SoftPinAction.ENABLE, 600001),
                   soft_config(SoftPinAction.DISABLE, with_soft_pin=True)]
        for config in refused:
            assert store.upsert("soft", page_bytes(1), config) == -600, config
            assert store.put("absent", page_bytes(1), config) == -600, config
        assert store.is_exist("absent") == 0
        assert store.get("soft") == page_bytes(102)
    finally:
        assert store.close() == 0
        stop_master(proc)


def test_replicate_config_soft_pin_fields():
    """Mooncake's bindings: SoftPinAction values compare, PRESERVE and None by
    default, soft_pin_ttl_ms takes None or a uint64 (TypeError otherwise)."""
    config = ReplicateConfig()
    assert config.soft_pin_action == SoftPinAction.PRESERVE and config.soft_pin_ttl_ms is None
    config.soft_pin_action = SoftPinAction.ENABLE
    assert config.soft_pin_action == SoftPinAction.ENABLE != SoftPinAction.DISABLE
    config.soft_pin_ttl_ms = (1 << 64) - 1
    for bad in (-1, 1 << 64, 1.5, "1"):
        with pytest.raises(TypeError):
            config.soft_pin_ttl_ms = bad
    with pytest.raises(TypeError):
        config.soft_pin_action = 1
    assert "SoftPinAction.ENABLE" in str(config)


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
                                  "--eviction_ratio=lots", "--default_kv_soft_pin_ttl=0",
                                  "--max_kv_soft_pin_ttl=0",
                                  "--max_kv_soft_pin_ttl=1000"])  # below the 30 min default
def test_eviction_flags_are_checked(flag):
    done = subprocess.run([tool_or_skip(), "store-master", "--port=0", flag],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    assert flag.split("=")[0] in done.stderr


@pytest.mark.parametrize("flag,says", [
    ("--allow_evict_soft_pinned_objects=maybe", '"maybe"'),
    ("--enable_gc=2", '"2"'),
    ("--memory_allocator=slab", '"slab"'),
    ("--memory_allocator=cachelib", "slab size classes are not implemented")])
def test_mooncake_master_flags_are_checked(flag, says):
    """Mooncake's master flags with a value ferry's does not take stop it at
    start, naming the flag and the value (cachelib: why it is not here)."""
    done = subprocess.run([tool_or_skip(), "store-master", "--port=0", flag],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    assert flag.split("=")[0] in done.stderr and says in done.stderr


def test_memory_allocator_offset_is_ours():
    """`mooncake_master --memory_allocator=offset` (and the other flags of
    issue 33 at their defaults) runs, saying which allocator it has."""
    proc, addr, err = start_mooncake_master("--memory_allocator=offset", "--enable_gc=false",
                                            "--allow_evict_soft_pinned_objects=true")
    assert addr, err
    stop_master(proc)
    assert "of offset's kind" in proc.stderr.read()


def start_mooncake_master(*flags):
    """`mooncake_master FLAGS` as the console command runs it (ferry.__main__,
    FERRY_TOOL naming the built tool) and its address."""
    env = dict(os.environ, FERRY_TOOL=tool_or_skip(),
               PYTHONPATH=os.path.join(HERE, "..", "..", "python"))
    code = "import sys; from ferry.__main__ import mooncake_master; sys.exit(mooncake_master())"
    proc = subprocess.Popen([sys.executable, "-c", code, "--port=0"] + list(flags),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    line = proc.stdout.readline()
    m = re.match(r"ready master=(\S+)", line)
    if not m:
        proc.kill()
        _, err = proc.communicate(timeout=30)
        return proc, None, err
    return proc, m.group(1), None


def test_the_ssd_tier_keeps_evicted_values_in_files(tmp_path):
    """`mooncake_master --root_fs_dir=DIR`: a 1 MiB pool takes 48 values of
    64 KiB; the 32 evicted from memory stay in files under
    DIR/mooncake_cluster and read back byte-exact (get, batch_get_into,
    is_exist, get_size); remove deletes a file; a bad directory stops the
    master at start, naming the flag and the path."""
    proc, addr, _ = start_mooncake_master("--root_fs_dir=%s" % tmp_path,
                                          "--eviction_high_watermark_ratio=1")
    assert addr
    store = MooncakeDistributedStore()
    files = tmp_path / "mooncake_cluster"
    try:
        assert store.setup("127.0.0.1", "P2PHANDSHAKE", 1 * MiB, 1 * MiB, "tcp", "", addr) == 0
        for i in range(48):
            assert store.put("page_%d" % i, page_bytes(i)) == 0
        assert len(list(files.glob("*.kv"))) == 48
        assert store.is_exist("page_0") == 1  # evicted: on disk only
        assert store.get_size("page_0") == PAGE
        assert store.remove("page_1") == 0
        assert len(list(files.glob("*.kv"))) == 47
        assert store.is_exist("page_1") == 0
        for i in [0] + list(range(2, 48)):
            assert store.get("page_%d" % i) == page_bytes(i)
        pool = ctypes.create_string_buffer(4 * PAGE)
        ptr = ctypes.addressof(pool)
        assert store.register_buffer(ptr, 4 * PAGE) == 0
        keys = ["page_2", "page_40", "page_3", "page_47"]  # files, memory, file, memory
        got = store.batch_get_into(keys, [ptr + k * PAGE for k in range(4)], [PAGE] * 4)
        assert got == [PAGE] * 4
        for k, key in enumerate(keys):
            assert pool.raw[k * PAGE:(k + 1) * PAGE] == page_bytes(int(key.split("_")[1]))
        assert store.unregister_buffer(ptr) == 0
    finally:
        assert store.close() == 0
        stop_master(proc)
    proc, addr, err = start_mooncake_master("--root_fs_dir=%s" % (tmp_path / "missing"))
    assert addr is None and proc.returncode == 1
    assert "--root_fs_dir=%s" % (tmp_path / "missing") in err and "No such file" in err


def named_client(master_addr, metadata_url, hostname="localhost", segment=32 * MiB,
                 staging=16 * MiB):
    """A client named by a metadata server, as Mooncake's own tests set one up."""
    store = MooncakeDistributedStore()
    assert store.setup(hostname, metadata_url, segment, staging, "tcp", "", master_addr) == 0
    return store


def test_a_hostname_without_port_gets_one_and_preferred_segment_follows(master,
                                                                        metadata_server):
    """local_hostname "localhost" (no port): each client is "localhost:PORT",
    PORT in Mooncake's 12300-14300, so two of them on one host are two
    segments; a preferred_segment of "localhost" is the putting client's own
    (the larger segment of the other would take it otherwise), and one naming
    the other client's get_hostname() goes there."""
    big = named_client(master, metadata_server, segment=64 * MiB)
    small = named_client(master, metadata_server)
    try:
        names = [big.get_hostname(), small.get_hostname()]
        assert names[0] != names[1]
        for name in names:
            host, port = name.rsplit(":", 1)
            assert host == "localhost" and 12300 <= int(port) <= 14300
        assert small.put("mine", page_bytes(1), ReplicateConfig(preferred_segment="localhost")) == 0
        assert small.put("theirs", page_bytes(2), ReplicateConfig(preferred_segment=names[0])) == 0
        assert big.get("mine") == page_bytes(1)
    finally:
        assert small.close() == 0
    try:
        assert big.is_exist("mine") == 0  # it lived in small's segment
        assert big.get("theirs") == page_bytes(2)
    finally:
        assert big.close() == 0


def test_put_batch_and_batch_get_buffer(master):
    """put_batch(keys, values, config) stores bytes-like values (two replicas
    asked: one in each client's segment), a batch larger than the local
    buffer too; batch_get_buffer reads each into a BufferHandle (None for an
    absent key), whose bytes, size() and ptr() agree; get_batch answers bytes
    (b"" for an absent key)."""
    a, b = client(master), client(master)
    try:
        keys = ["pb_%d" % i for i in range(6)]
        values = [page_bytes(i) for i in range(4)] + [bytearray(page_bytes(9)),
                                                      memoryview(page_bytes(10))]
        assert a.put_batch(keys, values, ReplicateConfig(replica_num=2)) == 0
        for key, value in zip(keys, values):
            assert b.get(key) == bytes(value)
        big = [bytes([i]) * (6 * MiB) for i in range(4)]  # 24 MiB > the 16 MiB local buffer
        assert a.put_batch(["big_%d" % i for i in range(4)], big) == 0
        assert b.get("big_3") == big[3]
        assert a.put_batch(["x"], [b"1", b"2"]) == -600

        got = b.batch_get_buffer([keys[1], "absent", keys[4]])
        assert got[1] is None
        assert bytes(got[0]) == page_bytes(1) and got[0].size() == PAGE == len(got[0])
        assert ctypes.string_at(got[2].ptr(), PAGE) == page_bytes(9)
        assert b.batch_get_buffer([]) == []
        assert b.batch_get_buffer(["absent"]) == [None]
        assert bytes(b.get_buffer(keys[0])) == page_bytes(0) and b.get_buffer("absent") is None
        assert b.get_batch([keys[2], "absent", keys[5]]) == [page_bytes(2), b"", page_bytes(10)]
        assert b.get_batch([]) == []
    finally:
        assert a.close() == 0
        assert b.close() == 0


def test_get_into_ranges(master, tmp_path):
    """Ranges of values into registered buffers, buffer-major, each byte
    checked: from another client's segment, from this client's own (copied in
    memory) and from a value on disk only; a range past the value's end, one
    past the registered buffer (the bytes after it untouched) and lists that
    do not line up answer -600, an absent key -704."""
    proc, addr = start_master("--default_kv_lease_ttl=500", "--eviction_high_watermark_ratio=1",
                              "--root_fs_dir=%s" % tmp_path)
    own, other = MooncakeDistributedStore(), MooncakeDistributedStore()
    try:
        assert own.setup("127.0.0.1", "P2PHANDSHAKE", 1 * MiB, 1 * MiB, "tcp", "", addr) == 0
        assert other.setup("127.0.0.1", "P2PHANDSHAKE", 1 * MiB, 1 * MiB, "tcp", "", addr) == 0
        # Two 1 MiB segments hold 32 values of 64 KiB: r_0, one in each
        # segment, 29 fillers, then one more evicts r_0 (the least recently
        # used) to its file only.
        on_disk, in_own, in_other = "r_0", "own_1", "other_2"
        assert own.put(on_disk, page_bytes(0)) == 0
        assert own.put(in_own, page_bytes(1),
                       ReplicateConfig(preferred_segment=own.get_hostname())) == 0
        assert own.put(in_other, page_bytes(2),
                       ReplicateConfig(preferred_segment=other.get_hostname())) == 0
        for i in range(30):
            assert own.put("fill_%d" % i, page_bytes(3 + i)) == 0
        assert len(list((tmp_path / "mooncake_cluster").glob("*.kv"))) == 33
        assert own.is_exist(on_disk) == 1
        seeds = {on_disk: 0, in_own: 1, in_other: 2}
        size = 1024
        mem = ctypes.create_string_buffer(3 * size)  # only the first two thirds registered
        base = ctypes.addressof(mem)
        ctypes.memset(base, ord("_"), 3 * size)
        assert own.register_buffer(base, 2 * size) == 0
        b0, b1 = base, base + size
        got = own.get_into_ranges(
            [b0, b1],
            [[in_other, in_own], [on_disk, in_other]],
            [[[0, 100], [200]], [[0], [500]]],
            [[[5, 60000], [1000]], [[PAGE - 300], [7]]],
            [[[50, 36], [300]], [[300], [size - 500]]])
        assert got == [[[50, 36], [300]], [[300], [size - 500]]]

        def at(key, src, n):
            return page_bytes(seeds[key])[src:src + n]
        assert mem.raw[0:50] == at(in_other, 5, 50)
        assert mem.raw[100:136] == at(in_other, 60000, 36)
        assert mem.raw[200:500] == at(in_own, 1000, 300)
        assert mem.raw[size:size + 300] == at(on_disk, PAGE - 300, 300)
        assert mem.raw[size + 500:2 * size] == at(in_other, 7, size - 500)

        bad = own.get_into_ranges([b1], [[in_own, on_disk, "absent", in_own]],
                                  [[[size - 8], [0], [0], [0, 8]]],
                                  [[[0], [PAGE - 4], [0], [0]]], [[[16], [8], [4], [4]]])
        assert bad[0][0] == [-600]  # past the registered buffer, though in own's segment
        assert bad[0][1] == [-600]  # past the value's end
        assert bad[0][2] == [-704]
        assert bad[0][3] == [-600, -600]  # 2 destinations, 1 offset, 1 size
        assert mem.raw[2 * size:] == b"_" * size
        assert own.get_into_ranges([b0], [[in_own], [in_own]], [[[0]]], [[[0]]], [[[4]]]) == \
            [[[-600]]]
        assert own.unregister_buffer(base) == 0
    finally:
        assert own.close() == 0
        assert other.close() == 0
        stop_master(proc)


def test_a_zero_local_buffer_sets_up_and_refuses_the_copying_calls(master, caplog):
    """local_buffer_size=0, as Mooncake: setup succeeds, put, put_batch, get
    and batch_get_buffer fail (-600, the key not stored), the zero-copy calls
    work."""
    store = MooncakeDistributedStore()
    try:
        assert store.setup("127.0.0.1", "P2PHANDSHAKE", 8 * MiB, 0, "tcp", "", master) == 0
        assert store.put("zero", b"value") == -600
        assert "local_buffer_size is 0" in caplog.text
        assert store.is_exist("zero") == 0
        assert store.put_batch(["zero"], [b"value"]) == -600
        buf = ctypes.create_string_buffer(b"from a registered buffer")
        ptr = ctypes.addressof(buf)
        assert store.register_buffer(ptr, len(buf)) == 0
        assert store.put_from("zero", ptr, len(buf)) == 0
        assert store.get("zero") == b""
        assert store.batch_get_buffer(["zero"]) == [None]
        ctypes.memset(ptr, 0, len(buf))
        assert store.get_into("zero", ptr, len(buf)) == len(buf)
        assert buf.raw == b"from a registered buffer\0"
        assert store.unregister_buffer(ptr) == 0
    finally:
        assert store.close() == 0


def test_a_port_taken_meanwhile_is_tried_again_with_another(master, metadata_server,
                                                            monkeypatch):
    """The port picked for a local_hostname without one is in use (another
    listener took it): setup tries another, as Mooncake's client retries."""
    import random
    import socket
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    other = free.getsockname()[1]
    free.close()
    picks = iter([port, other])
    monkeypatch.setattr(random, "randint", lambda low, high: next(picks))
    store = None
    try:
        store = named_client(master, metadata_server, hostname="127.0.0.1")
        assert store.get_hostname() == "127.0.0.1:%d" % other
        assert store.put("k", b"v") == 0 and store.get("k") == b"v"
    finally:
        taken.close()
        if store is not None:
            assert store.close() == 0


def scrape(port, path="/metrics"):
    import urllib.request
    with urllib.request.urlopen("http://127.0.0.1:%d%s" % (port, path), timeout=10) as r:
        return r.read().decode()


def metric(text, name):
    m = re.search(r"^%s (\d+)$" % re.escape(name), text, re.M)
    assert m, "%s not in the scrape" % name
    return int(m.group(1))


def test_the_master_serves_its_metrics():
    """--metrics_port (Mooncake's flag) serves the master's counts under
    Mooncake's metric names, each key of a batch counted, a remove of a
    missing key counted as failed and an exists of one not; the summary
    line is served too; --max_threads is accepted; a port in use stops the
    master with a message naming it."""
    from conftest import free_port
    port = free_port()
    proc, addr = start_master("--default_kv_lease_ttl=500", "--metrics_port=%d" % port,
                              "--max_threads=2")
    try:
        before = scrape(port)
        assert metric(before, "master_key_count") == 0
        assert metric(before, "master_serving") == 1
        a = client(addr)
        keys = ["metrics_%d" % i for i in range(5)]
        for k in keys:
            assert a.put(k, page_bytes(3)) == 0
        text = scrape(port)
        assert metric(text, "master_key_count") == 5
        assert metric(text, "master_put_start_requests_total") == 5
        assert metric(text, "master_put_start_failures_total") == 0
        assert metric(text, "master_put_end_requests_total") == 5
        assert a.batch_is_exist(keys + ["absent"]) == [1] * 5 + [0]
        after = scrape(port)
        assert (metric(after, "master_exist_key_requests_total")
                - metric(text, "master_exist_key_requests_total")) == 6
        assert metric(after, "master_exist_key_failures_total") == 0
        assert a.get(keys[0]) == page_bytes(3)
        assert a.remove(keys[1]) == 0
        assert a.remove("absent") != 0
        text = scrape(port)
        assert (metric(text, "master_get_replica_list_requests_total")
                - metric(after, "master_get_replica_list_requests_total")) == 1
        assert metric(text, "master_get_replica_list_failures_total") == 0
        assert metric(text, "master_remove_requests_total") == 2
        assert metric(text, "master_remove_failures_total") == 1
        assert metric(text, "master_key_count") == 4
        assert metric(text, "master_active_clients") == 1
        assert metric(text, "master_mounted_segments") == 1
        assert metric(text, "master_total_capacity_bytes") >= 32 * MiB - 64 * 1024
        assert metric(text, "master_allocated_bytes") == 4 * PAGE  # one replica each
        assert "4 keys" in scrape(port, "/metrics/summary")
        a.close()
        other = subprocess.run([tool_or_skip(), "store-master", "--port=0",
                                "--metrics_port=%d" % port], stdin=subprocess.DEVNULL,
                               capture_output=True, text=True, timeout=30)
        assert other.returncode != 0
        assert "--metrics_port=%d: cannot listen" % port in other.stderr
    finally:
        stop_master(proc)


def test_remove_force_waits_out_a_get_lease(master):
    """Mooncake's remove(key, force=True): a get's lease does not fail it
    (-706 without force); ferry waits the lease out rather than free
    memory a reader may still be reading, then removes."""
    a = client(master)
    assert a.put("forced", page_bytes(5)) == 0
    assert a.get("forced") == page_bytes(5)  # a lease of 500 ms (the fixture's master)
    assert a.remove("forced") == -706
    assert a.remove("forced", force=True) == 0
    assert a.is_exist("forced") == 0
    assert a.remove("forced", force=True) == -704  # absent: no wait
    a.close()


def test_protocol_cxl_maps_the_masters_pool(tmp_path, monkeypatch):
    """setup(..., "cxl", ...) as Mooncake's CXL test does: MC_CXL_DEV_PATH and
    MC_CXL_DEV_SIZE name the device (a file here) every client maps; the
    master (--enable_cxl) keeps each value there, global_segment_size is
    not used, and the zero-copy calls take memory nobody registered. A
    client without the device is refused with the reason."""
    device = tmp_path / "dax"
    with open(device, "wb") as f:
        f.truncate(16 * MiB)
    proc, addr = start_master("--enable_cxl", "--cxl_path=%s" % device, "--cxl_size=16M")
    monkeypatch.setenv("MC_CXL_DEV_PATH", str(device))
    monkeypatch.setenv("MC_CXL_DEV_SIZE", str(16 * MiB))
    stores = []
    try:
        for _ in range(2):
            s = MooncakeDistributedStore()
            assert s.setup("127.0.0.1", "P2PHANDSHAKE", 32 * MiB, 16 * MiB, "cxl", "", addr) == 0
            stores.append(s)
        writer, reader = stores
        assert writer.put("cxl_key", page_bytes(3)) == 0
        assert reader.get("cxl_key") == page_bytes(3)
        dest = ctypes.create_string_buffer(PAGE)  # not registered
        assert reader.batch_get_into(["cxl_key"], [ctypes.addressof(dest)], [PAGE]) == [PAGE]
        assert dest.raw == page_bytes(3)
        with open(device, "rb") as f:  # the value lives in the device
            assert page_bytes(3) in f.read()
        monkeypatch.setenv("MC_CXL_DEV_SIZE", str(8 * MiB))
        small = MooncakeDistributedStore()
        assert small.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 * MiB, "cxl", "", addr) != 0
        plain = MooncakeDistributedStore()
        assert plain.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 * MiB, "tcp", "", addr) != 0
    finally:
        for s in stores:
            s.close()
        stop_master(proc)
