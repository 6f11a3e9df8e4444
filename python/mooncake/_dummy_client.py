"""mooncake._dummy_client - the dummy half of ``setup_dummy``: a stand-in
for the C binding's Store (and the engine's register calls) that forwards
every call to a real client (``mooncake_client``, mooncake.mooncake_client)
on this host, so MooncakeDistributedStore's methods, their argument checks
and their answers stay the same in both modes.

Memory is shared, never sent: the local buffer (local_buffer_size bytes) and
every ``alloc_from_mem_pool`` allocation are memfds mapped here; the real
client maps them too when they are registered (the local buffer at setup,
an allocation at ``register_buffer``, which must name it whole, as
Mooncake's dummy requires). ``put`` copies the value into the local buffer
and the store WRITEs it from there; ``get`` has the store READ into it and
copies out: one copy each, where Mooncake's dummy sends the value through
its RPC. ``put_from``/``get_into`` and the other pointer calls name
registered allocations: the store moves their bytes with no copy.

Requests go one at a time on one connection (a lock; the local buffer is
used by one request at a time). A connection that fails (the real client
died: the socket closes at once; or FERRY_DUMMY_TIMEOUT_S, 60 by default,
passed without an answer) stays failed: every later call fails naming the
real client, with FERRY_ESOCKET (Mooncake: -900). Set up again to continue.
"""

import ctypes
import os
import socket
import threading

import ferry

from mooncake import _dummy_ipc as ipc


def _gone(address, why):
    return ferry.Error(ferry.ESOCKET, "real client gone",
                       "the real client (mooncake_client) at %s: %s; its memory and "
                       "registrations are gone: setup_dummy again once it runs" % (address, why))


class _Shared:
    __slots__ = ("fd", "addr", "size", "registered")

    def __init__(self, fd, addr, size):
        self.fd, self.addr, self.size, self.registered = fd, addr, size, False


class DummyConnection:
    """A dummy's connection to its real client: the Store and engine calls
    MooncakeDistributedStore makes, forwarded."""

    def __init__(self, port, mem_pool_size, local_buffer_size):
        self.address = ipc.printable(ipc.socket_name(port))
        self.lock = threading.Lock()
        self.pool_left = mem_pool_size
        self.shared = {}
        self.error = None
        self.sock = None
        self.local = None
        self.segment = None
        self._tls = threading.local()
        self.sock = self._connect(port)
        try:
            self.segment = self._handshake()
            if local_buffer_size > 0:
                self.local = self._new_shared(local_buffer_size, "mooncake-dummy-local")
                self._register(self.local)
        except BaseException:
            self.close()
            raise

    # ---- connection -------------------------------------------------------------------------

    def _connect(self, port):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        timeout = float(os.environ.get("FERRY_DUMMY_TIMEOUT_S", 60) or 60)
        sock.settimeout(timeout)
        try:
            sock.connect(ipc.socket_name(port))
        except OSError as e:
            sock.close()
            raise ferry.Error(ferry.ESOCKET, "connect",
                              "cannot reach the real client at %s: %s (is mooncake_client "
                              "running with --port=%d on this host?)"
                              % (self.address, e.strerror or e, port)) from None
        uid = ipc.peer_uid(sock)
        if uid != os.getuid():
            sock.close()
            raise ferry.Error(ferry.EAUTH, "connect",
                              "%s is held by uid %d, not this user (%d): not a real client of "
                              "ours" % (self.address, uid, os.getuid()))
        return sock

    def _handshake(self):
        try:
            hello, fds = ipc.recv(self.sock)
            _close_all(fds)
            if "error" in hello:
                raise ferry.Error(hello["error"][0], "setup_dummy", hello["error"][1])
            key, nonce = ipc.secret(), os.urandom(16).hex()
            if hello.get("version") != ipc.VERSION:
                raise ferry.Error(ferry.EVERSION, "setup_dummy",
                                  "the real client at %s speaks version %r, this dummy %d"
                                  % (self.address, hello.get("version"), ipc.VERSION))
            if hello.get("auth") is False and key is not None:
                raise ferry.Error(ferry.EAUTH, "setup_dummy",
                                  "FERRY_SECRET is set here but the real client at %s has no "
                                  "secret" % self.address)
            server_nonce = str(hello.get("nonce", ""))
            ipc.send(self.sock, {"op": "hello", "version": ipc.VERSION, "nonce": nonce,
                                 "proof": key and ipc.proof(key, "dummy", server_nonce, nonce)})
            reply = self._reply("setup_dummy")
            if key is not None and not ipc.proofs_match(
                    reply.get("proof"), ipc.proof(key, "real", server_nonce, nonce)):
                raise ferry.Error(ferry.EAUTH, "setup_dummy",
                                  "the real client at %s did not prove the shared secret"
                                  % self.address)
            return reply["segment"]
        except ipc.IpcError as e:
            raise _gone(self.address, str(e)) from None

    def _reply(self, what):
        msg, fds = ipc.recv(self.sock)
        _close_all(fds)
        if "error" in msg:
            code, detail = msg["error"]
            raise ferry.Error(code, what, detail)
        return msg["ok"]

    def call(self, op, fd=None, **args):
        """One request and its answer, under the lock (FERRY_ESOCKET once the
        connection failed)."""
        with self.lock:
            return self._call(op, fd, **args)

    def _call(self, op, fd=None, **args):
        if self.error is not None:
            raise _gone(self.address, self.error)
        args["op"] = op
        try:
            ipc.send(self.sock, args, fd)
            return self._reply(op)
        except ipc.IpcError as e:
            self.error = str(e)
            self.sock.close()
            raise _gone(self.address, self.error) from None

    def close(self):
        if self.sock is not None:
            self.sock.close()
        self.error = self.error or "this dummy was closed"
        for s in self.shared.values():
            ipc.unmap(s.addr, s.size)
            os.close(s.fd)
        self.shared.clear()

    # ---- shared memory ----------------------------------------------------------------------

    def _new_shared(self, size, name):
        fd, addr = ipc.new_shared(size, name)
        s = _Shared(fd, addr, size)
        self.shared[addr] = s
        return s

    def _register(self, s):
        self.call("register", fd=s.fd, addr=s.addr, size=s.size)
        s.registered = True

    def alloc(self, size):
        """alloc_from_mem_pool: the address of size fresh shared bytes."""
        if not isinstance(size, int) or size <= 0:
            raise ValueError("alloc_from_mem_pool: size must be a positive int, not %r" % (size,))
        with self.lock:
            if size > self.pool_left:
                raise ValueError("alloc_from_mem_pool(%d): only %d bytes of mem_pool_size are "
                                 "left" % (size, self.pool_left))
            self.pool_left -= size
        try:
            return self._new_shared(size, "mooncake-dummy-pool").addr
        except OSError as e:
            with self.lock:
                self.pool_left += size
            raise ValueError("alloc_from_mem_pool(%d): %s" % (size, e.strerror)) from None

    def register_memory(self, addr, size, location="*"):
        s = self.shared.get(addr)
        try:
            if s is None or s is self.local or s.size != size:
                raise ferry.Error(ferry.EINVAL, "register_buffer",
                                  "a dummy registers only a whole alloc_from_mem_pool allocation "
                                  "(address and size as allocated): %#x (+%d bytes) is not one"
                                  % (addr, size))
            if not s.registered:
                self._register(s)
            return 0
        except ferry.Error as e:
            self._tls.error = e.detail
            return e.code

    def unregister_memory(self, addr):
        s = self.shared.get(addr)
        try:
            if s is None or s is self.local or not s.registered:
                raise ferry.Error(ferry.EINVAL, "unregister_buffer",
                                  "%#x is not a registered alloc_from_mem_pool allocation" % addr)
            self.call("unregister", addr=addr)
            s.registered = False
            return 0
        except ferry.Error as e:
            self._tls.error = e.detail
            return e.code

    def last_error(self):
        return getattr(self._tls, "error", None)

    # ---- the Store calls --------------------------------------------------------------------

    def _local(self, size, what):
        if self.local is None or size > self.local.size:
            raise ferry.Error(ferry.EINVAL, what,
                              "%d bytes do not fit the dummy's local buffer (local_buffer_size "
                              "%d)" % (size, self.local.size if self.local else 0))
        return self.local.addr

    def put(self, key, data, replicas=1, preferred_segment=None, pin=0, upsert=False):
        data = data if isinstance(data, bytes) else bytes(data)  # store.py passes bytes
        with self.lock:
            addr = self._local(len(data), "put")
            ctypes.memmove(addr, data, len(data))
            answers, detail = self._call("put_from", keys=[key], addrs=[addr], sizes=[len(data)],
                                         rep=[replicas, preferred_segment, pin], upsert=upsert)
        if answers[0] < 0:
            raise ferry.Error(answers[0], "put", detail)

    def put_batch(self, keys, values, replicas=1, preferred_segment=None, pin=0):
        values = [bytes(v) for v in values]
        with self.lock:
            base = self._local(sum(len(v) for v in values), "put_batch")
            addrs, at = [], base
            for v in values:
                ctypes.memmove(at, v, len(v))
                addrs.append(at)
                at += len(v)
            return self._call("put_from", keys=list(keys), addrs=addrs,
                              sizes=[len(v) for v in values],
                              rep=[replicas, preferred_segment, pin])

    def get(self, key):
        with self.lock:
            addr = self._local(0, "get")
            n = self._call("get", key=key, addr=addr, cap=self.local.size)
            return ctypes.string_at(addr, n)

    def batch_put_from(self, keys, addrs, sizes, replicas=1, preferred_segment=None, pin=0,
                       upsert=False):
        _same_length(keys=keys, addrs=addrs, sizes=sizes)
        return self.call("put_from", keys=keys, addrs=addrs, sizes=sizes,
                         rep=[replicas, preferred_segment, pin], upsert=upsert)

    def batch_put_from_multi(self, keys, all_addrs, all_sizes, replicas=1,
                             preferred_segment=None, pin=0):
        _same_length(keys=keys, all_addrs=all_addrs, all_sizes=all_sizes)
        return self.call("put_from_multi", keys=keys, all_addrs=all_addrs, all_sizes=all_sizes,
                         rep=[replicas, preferred_segment, pin])

    def batch_get_into(self, keys, addrs, sizes):
        _same_length(keys=keys, addrs=addrs, sizes=sizes)
        return self.call("get_into", keys=keys, addrs=addrs, sizes=sizes)

    def batch_get_into_multi(self, keys, all_addrs, all_sizes):
        _same_length(keys=keys, all_addrs=all_addrs, all_sizes=all_sizes)
        return self.call("get_into_multi", keys=keys, all_addrs=all_addrs, all_sizes=all_sizes)

    def get_ranges(self, keys, addrs, offsets, lengths):
        _same_length(keys=keys, addrs=addrs, offsets=offsets, lengths=lengths)
        return self.call("get_ranges", keys=keys, addrs=addrs, offsets=offsets, lengths=lengths)

    def batch_exists(self, keys):
        return self.call("exists", keys=list(keys))

    def remove(self, key):
        self.call("remove", key=key)

    def remove_all(self):
        return self.call("remove_all")

    def status(self):
        """The real client's dummies and their shared regions (tests)."""
        return self.call("status")


def _same_length(**lists):
    if len({len(v) for v in lists.values()}) > 1:
        raise ValueError(", ".join("%d %s" % (len(v), k) for k, v in lists.items()) +
                         ": one of each per key")


def _close_all(fds):
    for fd in fds:
        os.close(fd)
