"""test_mooncake_buffer_pool.py - mooncake.store.BufferPool (Mooncake's
BufferPool helper, python/mooncake/_buffer_pool.py) on a store against a
`ferry store-master`: a lease is registered memory that get_into and
get_into_ranges fill (every byte checked), a released region is reused
without registering again, the pool's limits (max_bytes, max_regions,
block=False, timeout) refuse with Mooncake's texts, and close() refuses while
a lease is out."""

import ctypes

import pytest

from test_mooncake_store import client, master  # noqa: F401  (the fixture)

from mooncake.buffer_pool import BufferPool as ImportedPool
from mooncake.store import BufferPool


def pattern(n, seed):
    return bytes((i * 7 + seed) % 251 for i in range(n))


def test_a_lease_is_registered_memory_the_zero_copy_calls_fill(master):
    assert ImportedPool is BufferPool
    writer, reader = client(master), client(master)
    value = pattern(100000, 3)
    assert writer.put("bp", value) == 0
    pool = BufferPool(reader, min_size_class=4096, alignment=4096)
    lease = pool.acquire(len(value))
    assert lease.size == len(value) and lease.ptr % 4096 == 0
    assert reader.get_into("bp", lease.ptr, lease.size) == len(value)
    assert bytes(lease.buffer) == value
    lease.release()
    with pool.buffer(1000) as small:  # the context-manager form
        got = reader.get_into_ranges([small.ptr], [["bp"]], [[[0, 500]]], [[[10, 90000]]],
                                     [[[300, 200]]])
        assert got == [[[300, 200]]]
        view = small.buffer
        assert bytes(view[:300]) == value[10:310] and bytes(view[500:700]) == value[90000:90200]
        view.release()
    # a buffer of the caller's own, never registered, is refused: the pool is what registers
    raw = ctypes.create_string_buffer(4096)
    assert reader.get_into("bp", ctypes.addressof(raw), 4096) < 0
    with pytest.raises(RuntimeError, match="closed"):
        _ = small.ptr
    pool.close()
    writer.close()
    reader.close()


def test_released_regions_are_reused_and_limits_hold(master):
    store = client(master)
    calls = []
    real = store.register_buffer
    store.register_buffer = lambda ptr, size: calls.append(size) or real(ptr, size)
    pool = BufferPool(store, max_bytes=1 << 20, min_size_class=64 * 1024, alignment=4096,
                      max_regions=2)
    a = pool.acquire(1000)
    ptr = a.ptr
    a.release()
    b = pool.acquire(60000)  # the same 64 KiB class: the kept region, not a new registration
    assert b.ptr == ptr and calls == [64 * 1024]
    c = pool.acquire(5)
    with pytest.raises(RuntimeError, match="exhausted"):  # max_regions 2
        pool.acquire(5, block=False)
    with pytest.raises(RuntimeError, match="timed out"):
        pool.acquire(5, timeout=0.01)
    with pytest.raises(RuntimeError, match="exceeds pool capacity"):
        pool.acquire(2 << 20)
    with pytest.raises(RuntimeError, match="active leases"):
        pool.close()
    b.release()
    c.release()
    with pytest.raises(RuntimeError, match="closed"):
        c.release()
    big = pool.acquire(1 << 20)  # room made by dropping the kept 64 KiB regions
    big.release()
    pool.close()
    with pytest.raises(RuntimeError, match="closed"):
        pool.acquire(5)
    store.close()
