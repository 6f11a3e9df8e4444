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
from test_mooncake_store import MiB, start_master, stop_master, tool_or_skip

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
                assert other.get("k1") == one  # loaded back by the owner
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
    out = subprocess.run([tool_or_skip(), "store-master", "--port=0", "--enable_offload",
                          "--root_fs_dir=%s" % tmp_path], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 1 and "--enable_offload with --root_fs_dir" in out.stderr, out.stderr


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
