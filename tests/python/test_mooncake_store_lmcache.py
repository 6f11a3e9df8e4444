"""test_mooncake_store_lmcache.py - mooncake.store.MooncakeDistributedStore
driven the way LMCache's mooncakestore_connector drives Mooncake's store
(docs/store.md): two LMCache instances on one `ferry store-master`, each
`setup` with seven positional arguments and a bare local_hostname, a
page-aligned host buffer (LMCache's pinned one) given to `register_buffer`,
chunks put with `ReplicateConfig(replica_num, preferred_segment=hostname)`,
looked up with `is_exist`, read back by `batch_get_into` into the registered
buffer and by `batch_get_buffer`, then `unregister_buffer` and `close`.
Every byte is checked, and where each chunk landed is checked too: a chunk
preferring its writer's own segment lives there (the reader's larger segment
would take it otherwise), so it goes with its writer."""

import ctypes
import mmap

from test_mooncake_store import MiB, master, page_bytes  # noqa: F401 (master: a fixture)

from mooncake.store import MooncakeDistributedStore, ReplicateConfig

CHUNK = 64 * 1024  # one LMCache chunk's KV bytes here (256 tokens in real use)
CHUNKS = 8
HOST = "127.0.0.1"  # LMCache's local_hostname: no port


def lmcache_instance(master_addr, segment):
    """setup as LMCache's connector calls it: seven positional arguments
    (local_hostname, metadata_server, global_segment_size, local_buffer_size,
    protocol, device_name, master_server_address)."""
    store = MooncakeDistributedStore()
    assert store.setup(HOST, "P2PHANDSHAKE", segment, 16 * MiB, "tcp", "", master_addr) == 0
    return store


class HostBuffer:
    """A page-aligned host buffer (LMCache pins its own with the CUDA
    runtime; pinning changes nothing for the store), registered on a store."""

    def __init__(self, store, size):
        self.map = mmap.mmap(-1, size)
        self.cbuf = (ctypes.c_char * size).from_buffer(self.map)
        self.base = ctypes.addressof(self.cbuf)
        self.size = size
        self.store = store
        assert store.register_buffer(self.base, size) == 0

    def at(self, i):
        return self.base + i * CHUNK

    def release(self):
        assert self.store.unregister_buffer(self.base) == 0
        del self.cbuf
        self.map.close()


def chunk_key(worker, chunk_hash):
    """LMCache's CacheEngineKey string: fmt@model@world_size@worker_id@hash."""
    return "vllm@llama-3-8b@2@%d@%016x" % (worker, chunk_hash * 0x9E3779B97F4A7C15 & (2**64 - 1))


def test_lmcache_call_pattern(master):  # noqa: F811 (the fixture)
    # The reader contributes the larger segment: a chunk without a preferred
    # segment would land there, so a chunk found in the writer's shows the
    # preference was honoured.
    writer = lmcache_instance(master, 16 * MiB)
    reader = lmcache_instance(master, 64 * MiB)
    closed = []
    try:
        wbuf, rbuf = HostBuffer(writer, CHUNKS * CHUNK), HostBuffer(reader, CHUNKS * CHUNK)
        keys = [chunk_key(0, h) for h in range(CHUNKS)]
        for i in range(CHUNKS):
            ctypes.memmove(wbuf.at(i), page_bytes(100 + i), CHUNK)

        # LMCache's put: one replica, preferring the writer's own host.
        local = ReplicateConfig(1, preferred_segment=HOST)
        assert writer.batch_put_from(keys, [wbuf.at(i) for i in range(CHUNKS)],
                                     [CHUNK] * CHUNKS, local) == [0] * CHUNKS
        # A chunk of the reader's own, and one stored in both segments.
        ctypes.memmove(rbuf.at(0), page_bytes(7), CHUNK)
        assert reader.put_from("reader_chunk", rbuf.at(0), CHUNK, local) == 0
        assert writer.put_from("both_chunk", wbuf.at(3), CHUNK,
                               ReplicateConfig(2, preferred_segment=HOST)) == 0

        # The reader's lookups, then its reads into its registered buffer.
        for key in keys + ["reader_chunk", "both_chunk"]:
            assert reader.is_exist(key) == 1, key
        assert reader.is_exist(chunk_key(1, 0)) == 0
        ctypes.memset(rbuf.base, 0, CHUNKS * CHUNK)
        assert reader.batch_get_into(keys, [rbuf.at(i) for i in range(CHUNKS)],
                                     [CHUNK] * CHUNKS) == [CHUNK] * CHUNKS
        for i in range(CHUNKS):
            assert ctypes.string_at(rbuf.at(i), CHUNK) == page_bytes(100 + i), keys[i]

        # batch_get_buffer: the connector's copying read (None for a miss).
        got = reader.batch_get_buffer([keys[5], chunk_key(1, 0), "reader_chunk", "both_chunk"])
        assert got[1] is None
        assert bytes(got[0]) == page_bytes(105) and got[0].size() == CHUNK
        assert bytes(got[2]) == page_bytes(7)
        assert bytes(got[3]) == page_bytes(103)
        del got
        assert writer.get("reader_chunk") == page_bytes(7)

        wbuf.release()
        rbuf.release()

        # Where the chunks landed: the writer's go with it, the reader's and
        # the two-replica one stay.
        assert writer.close() == 0
        closed.append(writer)
        assert [reader.is_exist(k) for k in keys] == [0] * CHUNKS
        assert reader.is_exist("reader_chunk") == 1
        assert reader.get("both_chunk") == page_bytes(103)
    finally:
        if writer not in closed:
            assert writer.close() == 0
        assert reader.close() == 0
