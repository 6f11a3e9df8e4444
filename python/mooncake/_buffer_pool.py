"""_buffer_pool.py - Mooncake's BufferPool (mooncake.store.BufferPool,
mooncake.buffer_pool.BufferPool): leases of memory registered on a store's
engine, for repeated zero-copy calls (get_into, get_into_ranges, put_from)
without registering and unregistering a buffer for each. Each lease is a
region of a size class (a power of two, at least min_size_class) mapped for
the pool and registered once; a released region is kept, still registered,
for the next lease of its class. max_bytes bounds the regions held (leased
or kept), max_regions the leases out at once; an acquire past either waits
(or raises, block=False / timeout). Errors are RuntimeError with Mooncake's
texts."""

import ctypes
import mmap
import threading
import time


class BufferLease:
    """One leased region: ptr and size (the requested size), buffer (a
    memoryview of size bytes), release(); a context manager releasing on exit."""

    def __init__(self, pool, region, size):
        self._pool, self._region, self._size, self._views = pool, region, size, []

    def _live(self):
        if self._region is None:
            raise RuntimeError("buffer lease is closed")
        return self._region

    @property
    def ptr(self):
        return self._live().ptr

    @property
    def size(self):
        self._live()
        return self._size

    @property
    def buffer(self):
        region = self._live()
        view = memoryview(region.map)[region.skip:region.skip + self._size]
        self._views.append(view)
        return view

    def release(self):
        """Gives the region back; a RuntimeError while a view of it is still
        exported (a numpy array over lease.buffer, say): delete that first."""
        region = self._live()
        for view in self._views:
            try:
                view.release()
            except BufferError:
                raise RuntimeError("buffer lease has exported views alive; delete them "
                                   "before release()") from None
        self._views, self._region = [], None
        self._pool._give_back(region)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self._region is not None:
            self.release()
        return False


class _Region:
    """A mapped, registered area of one size class; ptr honours the pool's alignment."""

    def __init__(self, store, size_class, alignment):
        self.size_class = size_class
        self.map = mmap.mmap(-1, size_class + max(alignment - mmap.PAGESIZE, 0))
        first = ctypes.c_char.from_buffer(self.map)
        base = ctypes.addressof(first)
        del first  # an export of the map: close() refuses while one is alive
        self.ptr = (base + alignment - 1) & ~(alignment - 1)
        self.skip = self.ptr - base
        if store.register_buffer(self.ptr, size_class) != 0:
            self.map.close()
            raise RuntimeError("overflow buffer registration failed (%d bytes)" % size_class)
        self._store = store

    def free(self):
        self._store.unregister_buffer(self.ptr)
        self.map.close()


class BufferPool:
    """BufferPool(store, max_bytes=0, min_size_class=64 KiB, max_size_class=None,
    alignment=8 MiB, block_on_exhaustion=True, default_timeout=None,
    max_regions=None, prewarm_size=None, prewarm_count=0). max_bytes 0 is
    twice the store's local_buffer_size (its local buffer plus one burst of
    that size, as Mooncake's default)."""

    def __init__(self, store, max_bytes=0, min_size_class=64 * 1024, max_size_class=None,
                 alignment=8 * 1024 * 1024, block_on_exhaustion=True, default_timeout=None,
                 max_regions=None, prewarm_size=None, prewarm_count=0):
        if getattr(store, "_engine", None) is None:
            raise RuntimeError("MooncakeDistributedStore is not initialized")
        if not getattr(store, "_staging", 0):
            raise RuntimeError("BufferPool requires a store configured with a local buffer")
        for name, value in (("min_size_class", min_size_class), ("alignment", alignment)):
            if value <= 0 or value & (value - 1):
                raise RuntimeError("BufferPool %s must be a power of two, not %d" % (name, value))
        if max_size_class is not None and max_size_class < min_size_class:
            raise RuntimeError("BufferPool max_size_class is below min_size_class")
        self._store = store
        self._max_bytes = int(max_bytes) or 2 * store._staging
        self._min, self._max_class = int(min_size_class), max_size_class
        self._alignment = max(int(alignment), 1)
        self._block, self._timeout = bool(block_on_exhaustion), default_timeout
        self._max_regions = max_regions
        self._cond = threading.Condition()
        self._kept = {}          # size class -> [free registered _Region]
        self._held = 0           # bytes of regions leased or kept
        self._active = 0         # leases out
        self._closed = False
        if prewarm_size and prewarm_count:
            self.prewarm(prewarm_size, prewarm_count)

    def _class_of(self, size):
        if size <= 0:
            raise RuntimeError("buffer size must be positive, not %d" % size)
        cls = self._min
        while cls < size:
            cls <<= 1
        if self._max_class is not None and cls > self._max_class:  # past the classes: exact pages
            cls = -(-size // mmap.PAGESIZE) * mmap.PAGESIZE
        return cls

    def acquire(self, size, block=None, timeout=None):
        """A BufferLease of size bytes; waits while the pool is full unless
        block is False (then RuntimeError) or timeout seconds pass."""
        block = self._block if block is None else bool(block)
        timeout = self._timeout if timeout is None else timeout
        if timeout is not None and timeout < 0:
            raise RuntimeError("timeout must be non-negative")
        cls = self._class_of(int(size))
        if cls > self._max_bytes:
            raise RuntimeError("requested buffer size exceeds pool capacity")
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                if self._closed:
                    raise RuntimeError("buffer pool is closed")
                region = self._take_locked(cls)
                if region is not None:
                    self._active += 1
                    return BufferLease(self, region, int(size))
                if not block:
                    raise RuntimeError("buffer pool is exhausted")
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise RuntimeError("timed out waiting for buffer")
                self._cond.wait(left)

    buffer = acquire  # Mooncake's pool.buffer(size): the same lease, used with `with`

    def _take_locked(self, cls):
        """A kept region of the class, or a new one when the limits allow
        (dropping kept regions of other classes to make room); else None."""
        if self._max_regions is not None and self._active >= self._max_regions:
            return None
        kept = self._kept.get(cls)
        if kept:
            return kept.pop()
        for other in list(self._kept):
            while self._held + cls > self._max_bytes and self._kept[other]:
                self._drop_locked(self._kept[other].pop())
        if self._held + cls > self._max_bytes:
            return None
        region = _Region(self._store, cls, self._alignment)
        self._held += cls
        return region

    def _drop_locked(self, region):
        self._held -= region.size_class
        region.free()

    def _give_back(self, region):
        with self._cond:
            self._active -= 1
            if self._closed:
                self._drop_locked(region)
            else:
                self._kept.setdefault(region.size_class, []).append(region)
            self._cond.notify_all()

    def prewarm(self, size, count):
        """Maps and registers count regions of size's class ahead of use."""
        cls = self._class_of(int(size))
        with self._cond:
            for _ in range(int(count)):
                if self._held + cls > self._max_bytes:
                    raise RuntimeError("buffer pool capacity exceeded")
                self._kept.setdefault(cls, []).append(_Region(self._store, cls, self._alignment))
                self._held += cls

    def close(self):
        """Unregisters and unmaps every kept region; RuntimeError while leases are out."""
        with self._cond:
            if self._active:
                raise RuntimeError("cannot close buffer pool with active leases")
            for regions in self._kept.values():
                for region in regions:
                    self._drop_locked(region)
            self._kept, self._closed = {}, True


RegisteredBufferPool = BufferPool
