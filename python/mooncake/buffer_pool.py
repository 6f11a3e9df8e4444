"""mooncake.buffer_pool - where Mooncake's callers import BufferPool from
(the pool itself is in _buffer_pool.py)."""

from mooncake._buffer_pool import BufferLease, BufferPool, RegisteredBufferPool  # noqa: F401

__all__ = ["BufferPool", "RegisteredBufferPool"]
