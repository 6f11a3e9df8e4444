"""get_replica_desc / batch_get_replica_desc (docs/store.md "Where an
object is"): each replica of a stored object with its kind and place, from
the master's REPLICAS request: memory replicas (one, two), the
--root_fs_dir file (Mooncake's DISK), the copy on its owner's disk
(--enable_offload, Mooncake's LOCAL_DISK); an absent key is left out of the
dict ([] from get_replica_desc), as Mooncake's binding does."""
import os
import sys

import pytest

from test_mooncake_store import MiB, client, page_bytes, start_master, stop_master
from test_mooncake_store_offload import files, put_room, wait_for

from mooncake.store import MooncakeDistributedStore, ReplicateConfig, ReplicaStatus  # noqa: E402

PAGE = 64 * 1024


def kinds(descs):
    return sorted(d.type for d in descs)


def test_memory_replicas_one_and_two_and_an_absent_key():
    proc, addr = start_master()
    a, b = client(addr), client(addr)
    try:
        assert a.put("one", page_bytes(1), ReplicateConfig(preferred_segment=a.get_hostname())) == 0
        assert a.put("two", page_bytes(2), ReplicateConfig(replica_num=2)) == 0
        got = b.batch_get_replica_desc(["one", "absent", "two"])
        assert sorted(got) == ["one", "two"]  # the absent key left out, as Mooncake's
        (one,) = got["one"]
        assert one.type == "MEMORY" and one.is_memory_replica()
        assert not one.is_disk_replica() and not one.is_local_disk_replica()
        assert one.status == ReplicaStatus.COMPLETE
        buf = one.get_memory_descriptor().buffer_descriptor
        assert buf.size == PAGE and buf.transport_endpoint == a.get_hostname()
        assert buf.buffer_address != 0
        with pytest.raises(RuntimeError):
            one.get_disk_descriptor()
        two = got["two"]
        assert kinds(two) == ["MEMORY", "MEMORY"]
        assert sorted(d.location for d in two) == sorted([a.get_hostname(), b.get_hostname()])
        assert b.get_replica_desc("absent") == []
        assert kinds(b.get_replica_desc("two")) == ["MEMORY", "MEMORY"]
        assert b.batch_get_replica_desc([]) == {}
        assert b.get("one") == page_bytes(1)  # a look changed nothing
    finally:
        assert a.close() == 0 and b.close() == 0
        stop_master(proc)


def test_a_root_fs_dir_file_is_a_disk_replica(tmp_path):
    proc, addr = start_master("--eviction_high_watermark_ratio=1", "--root_fs_dir=%s" % tmp_path)
    store = MooncakeDistributedStore()
    try:
        assert store.setup("127.0.0.1", "P2PHANDSHAKE", 1 * MiB, 1 * MiB, "tcp", "", addr) == 0
        for i in range(17):  # 16 pages fill the 1 MiB segment: page_0 is evicted
            assert store.put("page_%d" % i, page_bytes(i)) == 0
        assert kinds(store.get_replica_desc("page_16")) == ["DISK", "MEMORY"]
        (disk,) = store.get_replica_desc("page_0")  # on disk only
        assert disk.is_disk_replica() and disk.type == "DISK"
        d = disk.get_disk_descriptor()
        assert d.object_size == PAGE and os.path.isfile(d.file_path)
        assert os.path.dirname(d.file_path) == str(tmp_path / "mooncake_cluster")
        with pytest.raises(RuntimeError):
            disk.get_memory_descriptor()
    finally:
        assert store.close() == 0
        stop_master(proc)


def test_an_offloaded_copy_is_a_local_disk_replica(tmp_path):
    proc, addr = start_master("--enable_offload", "--eviction_high_watermark_ratio=1",
                              "--default_kv_lease_ttl=1")
    owner = MooncakeDistributedStore()
    value = 600 * 1024  # two do not fit the owner's 1 MB segment
    try:
        assert owner.setup("127.0.0.1", "P2PHANDSHAKE", 1 * MiB, 2 * MiB, "tcp", "", addr,
                           enable_ssd_offload=True, ssd_offload_path=str(tmp_path)) == 0
        assert owner.put("k1", bytes([1]) * value) == 0
        wait_for("k1's LOCAL_DISK replica",
                 lambda: kinds(owner.get_replica_desc("k1")) == ["LOCAL_DISK", "MEMORY"])
        assert len(files(tmp_path)) == 1
        local = [d for d in owner.get_replica_desc("k1") if d.is_local_disk_replica()][0]
        ld = local.get_local_disk_descriptor()
        assert ld.object_size == value and ld.transport_endpoint == owner.get_hostname()
        put_room(owner, "k2", bytes([2]) * value)  # k1's memory goes, its file stays
        wait_for("k1 on disk only", lambda: kinds(owner.get_replica_desc("k1")) == ["LOCAL_DISK"])
    finally:
        assert owner.close() == 0
        stop_master(proc)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))


def test_batch_replica_clear():
    """batch_replica_clear(keys, segment_name): the keys cleared, as
    Mooncake's answers: one segment's replica (the other stays, readable),
    all of them (the object goes); absent keys, a segment holding nothing
    and a key a get's lease holds (60 s here) are left out and keep what
    they had."""
    proc, addr = start_master("--default_kv_lease_ttl=60000")
    a, b = client(addr), client(addr)
    try:
        assert a.put("two", page_bytes(2), ReplicateConfig(replica_num=2)) == 0
        assert a.put("one", page_bytes(1)) == 0
        assert a.batch_replica_clear(["two", "absent"], segment_name=a.get_hostname()) == ["two"]
        (left,) = b.get_replica_desc("two")
        assert left.location == b.get_hostname()
        assert a.batch_replica_clear(["two"], segment_name=a.get_hostname()) == []
        assert a.batch_replica_clear(["two"], segment_name="nowhere:1") == []
        assert b.get("two") == page_bytes(2)  # a lease: cleared by nobody now
        assert a.batch_replica_clear(["two"]) == []
        assert a.batch_replica_clear(["two"], segment_name=b.get_hostname()) == []
        assert a.is_exist("two") == 1
        assert b.batch_replica_clear(["one", "absent"]) == ["one"]
        assert a.is_exist("one") == 0
        assert a.batch_replica_clear([]) == []
    finally:
        a.close()
        b.close()
        stop_master(proc)


def test_preferred_segments_place_the_replicas():
    """ReplicateConfig.preferred_segments (Mooncake's list): the replicas go
    to the segments named, in order, not to the roomiest; set as an
    attribute too, and through put_batch; more than 9 names is -600."""
    proc, addr = start_master()
    a, b, c = client(addr), client(addr), client(addr)
    try:
        names = [c.get_hostname(), b.get_hostname()]
        assert a.put("p", page_bytes(3), ReplicateConfig(replica_num=2,
                                                         preferred_segments=names)) == 0
        assert [d.location for d in a.get_replica_desc("p")] == names
        config = ReplicateConfig()
        config.replica_num = 2
        config.preferred_segments = [b.get_hostname(), c.get_hostname()]
        assert a.put_batch(["q"], [page_bytes(4)], config) == 0
        assert [d.location for d in a.get_replica_desc("q")] == config.preferred_segments
        assert b.get("q") == page_bytes(4)
        config.preferred_segments = ["x:%d" % i for i in range(10)]
        assert a.put("r", page_bytes(5), config) == -600
        same_node = ReplicateConfig()
        same_node.prefer_alloc_in_same_node = True  # refused, as Mooncake's client does
        assert a.put("r", page_bytes(5), same_node) == -600
        assert a.is_exist("r") == 0
    finally:
        for s in (a, b, c):
            s.close()
        stop_master(proc)
