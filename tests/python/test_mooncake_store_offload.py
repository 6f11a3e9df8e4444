"""Client-owned SSD offload through the Mooncake names (docs/store.md
"Client-owned SSD offload"): `mooncake_master --enable_offload`,
`mooncake_client --enable_offload` with MOONCAKE_OFFLOAD_FILE_STORAGE_PATH,
`setup(..., enable_ssd_offload=True, ssd_offload_path=...)`. The C cases
(tests/integration/test_store_offload.c) cover the mechanisms; these show the
flags and the arguments reach them, and that every get form of another
process reads an evicted object's exact bytes."""
import ctypes
import os
import subprocess
import sys
import time

import pytest

from test_mooncake_dummy import PYTHON_DIR, dummy, pattern, shared, start_real_client, stop
from test_mooncake_store import MiB, metric, scrape, start_master, stop_master, tool_or_skip

from mooncake.store import MooncakeDistributedStore  # noqa: E402

VALUE = 600 * 1024  # two do not fit the owner's 1 MB segment


def files(path):
    return sorted(n for n in os.listdir(path) if n.endswith(".kv"))


def wait_for(what, fn, limit=20.0):
    until = time.monotonic() + limit
    while not fn():
        if time.monotonic() > until:
            raise AssertionError("%s: not within %.0f s" % (what, limit))


def put_room(store, key, data):
    """A put that needs the room of an object being written to disk may be
    refused meanwhile (-200, the store is full); the next one fits."""
    until = time.monotonic() + 20
    while True:
        rc = store.put(key, data)
        if rc == 0:
            return
        assert rc == -200 and time.monotonic() < until, rc


def reader(master_addr):
    """A client of its own with no segment: every value lives in the owner's."""
    store = MooncakeDistributedStore()
    assert store.setup("127.0.0.1", "P2PHANDSHAKE", 0, 4 * MiB, "tcp", "", master_addr) == 0
    return store


def test_an_evicted_object_is_read_back_from_its_owners_disk(tmp_path):
    proc, addr = start_master("--enable_offload", "--eviction_high_watermark_ratio=1",
                              "--default_kv_lease_ttl=1")
    owner = None
    try:
        owner, port = start_real_client(addr, "--enable_offload", "--global_segment_size=1MB",
                                        env={"MOONCAKE_OFFLOAD_FILE_STORAGE_PATH":
                                             str(tmp_path)})
        app = dummy(port, pool=4 * MiB, local=2 * MiB)
        one, two = pattern(1, VALUE), pattern(2, VALUE)
        try:
            assert app.put("k1", one) == 0
            wait_for("k1's file", lambda: len(files(tmp_path)) == 1)
            put_room(app, "k2", two)  # k1 evicted from memory, kept on disk
            wait_for("k2's file", lambda: len(files(tmp_path)) == 2)
            other = reader(addr)
            try:
                assert other.is_exist("k1") == 1
                assert other.get_offload_rpc_read_count() == 0
                assert other.get("k1") == one  # loaded back by the owner
                assert other.get_offload_rpc_read_count() == 1  # Mooncake's counter
                buf = ctypes.create_string_buffer(VALUE)
                assert other.register_buffer(ctypes.addressof(buf), VALUE) == 0
                assert other.batch_get_into(["k2"], [ctypes.addressof(buf)], [VALUE]) == [VALUE]
                assert buf.raw == two
                assert other.get_into("k1", ctypes.addressof(buf), VALUE) == VALUE
                assert buf.raw == one
                assert other.remove("k1", force=True) == 0  # waits out the get's lease
                wait_for("k1's file gone", lambda: len(files(tmp_path)) == 1)
            finally:
                other.close()
            addr2 = shared(app, bytes(VALUE))
            assert app.get_into("k2", addr2, VALUE) == VALUE  # the dummy's get too
            assert ctypes.string_at(addr2, VALUE) == two
        finally:
            app.close()
    finally:
        if owner:
            stop(owner)
        stop_master(proc)


def test_setup_takes_mooncakes_positional_offload_arguments(tmp_path, caplog, monkeypatch):
    """Mooncake's own offload tests call setup(..., master, None, True): the
    engine, then enable_ssd_offload, positionally; the directory from the
    environment. Its tenant and client HTTP server arguments are refused."""
    monkeypatch.setenv("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH", str(tmp_path))
    proc, addr = start_master("--enable_offload")
    try:
        store = MooncakeDistributedStore()
        assert store.setup("127.0.0.1", "P2PHANDSHAKE", MiB, MiB, "tcp", "", addr, None,
                           True) == 0
        try:
            assert store.put("k1", pattern(1, 4096)) == 0
            wait_for("k1's file", lambda: len(files(tmp_path)) == 1)
        finally:
            store.close()
        other = MooncakeDistributedStore()
        assert other.setup("127.0.0.1", "P2PHANDSHAKE", MiB, MiB, "tcp", "", addr, None, False,
                           "", "tenant2") == -600
        assert "tenant_id='tenant2'" in caplog.text
        assert other.setup("127.0.0.1", "P2PHANDSHAKE", MiB, MiB, "tcp", "", addr, None, False,
                           "", "default", True) == -600
        assert "enable_client_http_server" in caplog.text
        assert other.setup(*(["127.0.0.1", "P2PHANDSHAKE"] + [MiB] * 12)) == -600
        assert "at most 13 positional arguments" in caplog.text
    finally:
        stop_master(proc)


def test_unusable_offload_setups_are_refused(tmp_path, caplog, monkeypatch):
    proc, addr = start_master("--enable_offload")
    try:
        store = MooncakeDistributedStore()
        missing = str(tmp_path / "missing")
        assert store.setup("127.0.0.1", "P2PHANDSHAKE", MiB, MiB, "tcp", "", addr,
                           enable_ssd_offload=True, ssd_offload_path=missing) == -600
        assert missing + " cannot be resolved" in caplog.text
        monkeypatch.delenv("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH", raising=False)
        assert store.setup("127.0.0.1", "P2PHANDSHAKE", MiB, MiB, "tcp", "", addr,
                           enable_ssd_offload=True) == -600
        assert "MOONCAKE_OFFLOAD_FILE_STORAGE_PATH" in caplog.text
        out = subprocess.run(
            [sys.executable, "-m", "mooncake.mooncake_client", "--port=%d" % 45871,
             "--master_server_address=%s" % addr, "--metadata_server=P2PHANDSHAKE",
             "--global_segment_size=1MB", "--enable_offload"],
            capture_output=True, text=True, timeout=60,
            env=dict(os.environ, PYTHONPATH=PYTHON_DIR,
                     MOONCAKE_OFFLOAD_FILE_STORAGE_PATH=missing))
        assert out.returncode == 1 and missing + " cannot be resolved" in out.stderr, out.stderr
    finally:
        stop_master(proc)


def offload_rig(tmp_path, *flags):
    """A master with --enable_offload, flags and /metrics; the owner (a
    mooncake_client with a 1 MB segment) and a dummy of it: (master, port
    of /metrics, owner, app); close with close_rig."""
    from conftest import free_port
    metrics = free_port()
    proc, addr = start_master("--enable_offload", "--eviction_high_watermark_ratio=1",
                              "--default_kv_lease_ttl=1", "--metrics_port=%d" % metrics, *flags)
    owner = app = None
    try:
        owner, port = start_real_client(addr, "--enable_offload", "--global_segment_size=1MB",
                                        env={"MOONCAKE_OFFLOAD_FILE_STORAGE_PATH":
                                             str(tmp_path)})
        app = dummy(port, pool=4 * MiB, local=2 * MiB)
    except BaseException:
        close_rig(proc, owner, app)
        raise
    return proc, addr, metrics, owner, app


def close_rig(proc, owner, app):
    if app:
        app.close()
    if owner:
        stop(owner)
    stop_master(proc)


def loads_of_three_gets(tmp_path, *flags):
    """k1 evicted to its owner's disk, then three gets of it by another
    client, each after the last one's lease (1 ms) ended: how many loads
    back the owner did, and the promotion counts."""
    proc, addr, port, owner, app = offload_rig(tmp_path, *flags)
    try:
        one = pattern(1, VALUE)
        assert app.put("k1", one) == 0
        wait_for("k1's file", lambda: len(files(tmp_path)) == 1)
        put_room(app, "k2", pattern(2, VALUE))
        other = reader(addr)
        try:
            for _ in range(3):
                assert other.get("k1") == one
                time.sleep(0.01)  # past the get's lease (1 ms): a TTL, not an order of events
        finally:
            other.close()
        text = scrape(port)
        return (metric(text, "master_offload_load_requests_total"),
                metric(text, "master_promotion_admitted_total"),
                metric(text, "master_promotion_rejected_frequency_total"),
                metric(text, "master_offload_write_requests_total"))
    finally:
        close_rig(proc, owner, app)


def test_without_promotion_every_get_loads_the_object_back(tmp_path):
    """Mooncake's default (--promotion_on_hit=false): a get of a key on disk
    only reads it from the disk, and the key stays there: the owner loads
    it for each get (the memory it took goes once the get's lease ended).
    Red when a load keeps the object in memory (1 load)."""
    loads, admitted, rejected, writes = loads_of_three_gets(tmp_path)
    assert (loads, admitted, rejected) == (3, 0, 3)
    assert writes == 2  # k1 and k2, each offloaded once after its put


def test_promotion_keeps_an_object_in_memory_from_its_nth_get(tmp_path):
    """--promotion_on_hit with --promotion_admission_threshold=2: the first
    get loads k1 and leaves it on disk only, the second loads it and keeps
    it (admitted), the third reads memory. Red without the admission count
    (1 load, always admitted; the same when the threshold is ignored)."""
    loads, admitted, rejected, _ = loads_of_three_gets(
        tmp_path, "--promotion_on_hit", "--promotion_admission_threshold=2")
    assert (loads, admitted, rejected) == (2, 1, 1)


def test_the_queue_limit_bounds_an_owners_waiting_offloads(tmp_path):
    """--offloading_queue_limit=1: a batch of 4 puts commits in one
    PUT_END, before the owner can poll: the first offload waits in the
    queue, the other three find it full and are not offloaded (4 files with
    Mooncake's default). Red with the fixed limit of 50,000."""
    for limit, written in ((1, 1), (50000, 4)):
        directory = tmp_path / str(limit)
        directory.mkdir()
        proc, addr, port, owner, app = offload_rig(directory,
                                                   "--offloading_queue_limit=%d" % limit)
        try:
            keys = ["b%d" % i for i in range(4)]
            assert app.put_batch(keys, [pattern(i, 100 * 1024) for i in range(4)]) == 0
            wait_for("the offloads reported",
                     lambda: metric(scrape(port), "master_offload_write_requests_total") == written)
            assert len(files(directory)) == written
            assert metric(scrape(port), "master_offload_poll_requests_total") > 0
        finally:
            close_rig(proc, owner, app)


def test_force_evict_past_the_cap_evicts_without_a_copy(tmp_path):
    """--offload_on_evict --offload_force_evict --offload_cap_ratio=0: an
    eviction round may queue no offload, so the evicted k1 goes without a
    file (with the cap it is written, then evicted: the C case). Red
    without the cap."""
    proc, addr, port, owner, app = offload_rig(tmp_path, "--offload_on_evict",
                                               "--offload_force_evict", "--offload_cap_ratio=0")
    try:
        assert app.put("k1", pattern(1, VALUE)) == 0
        assert app.put("k2", pattern(2, VALUE)) == 0  # k1 evicted at once, no room to wait for
        assert app.is_exist("k1") == 0
        assert app.get("k2") == pattern(2, VALUE)
        assert files(tmp_path) == []
        assert metric(scrape(port), "master_offload_write_requests_total") == 0
    finally:
        close_rig(proc, owner, app)


@pytest.mark.parametrize("flag,value,says", [
    ("offloading_queue_limit", "0", "a whole number in 1..100000000"),
    ("offloading_queue_limit", "100000001", "a whole number in 1..100000000"),
    ("offload_cap_ratio", "1.5", "a number in [0, 1]"),
    ("offload_cap_ratio", "x", "a number in [0, 1]"),
    ("promotion_admission_threshold", "256", "a whole number in 1..255"),
    ("offload_force_evict", "maybe", "true or false"),
    ("promotion_on_hit", "2", "true or false"),
])
def test_bad_offload_flag_values_stop_the_master(flag, value, says):
    out = subprocess.run([tool_or_skip(), "store-master", "--port=0", "--enable_offload",
                          "--%s=%s" % (flag, value)], capture_output=True, text=True,
                         timeout=60, stdin=subprocess.DEVNULL)
    assert out.returncode == 2, out.stderr  # the tool's usage error, as for its other flags
    assert "--%s" % flag in out.stderr and value in out.stderr and says in out.stderr, out.stderr


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
