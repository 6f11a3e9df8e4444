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
used by one request at a time). When the connection is lost (the real client
died: the socket closes at once; or FERRY_DUMMY_TIMEOUT_S, 60 by default,
passed without an answer) the call on it fails, naming the real client and
the cause, and is not sent again (what it did there is unknown). The next
call reconnects: a new connection, the handshake again (uid and secret), and
every region this dummy had shared (the local buffer, each registered
allocation: same memfds, same addresses) registered again, so pointers from
before keep working; only then is the call sent. A real client that is not
back fails the call (FERRY_ESOCKET, Mooncake: -900) after connect attempts
for at most FERRY_DUMMY_RECONNECT_S (1 by default); the next call tries
again. A connection whose close reached this side before a call is found
so (poll) before anything is sent on it, so the first call after a restart
works.
"""

import ctypes
import logging
import os
import select
import socket
import threading
import time

import ferry

from mooncake import _dummy_ipc as ipc

logger = logging.getLogger(__name__)

# Between two connect attempts while the real client is not back.
_RETRY_PAUSE_S = 0.1


def _env_seconds(name, default):
    try:
        value = float(os.environ.get(name, default))
    except ValueError:
        return float(default)
    return value if value >= 0 else float(default)


def _real(address):
    return "the real client (mooncake_client) at %s" % address


def _lost(address, op, why):
    """A call whose request the connection's loss cut."""
    return ferry.Error(ferry.ESOCKET, op,
                       "%s: %s during %s; the call failed and is not sent again (its effect "
                       "there is unknown; a value is stored whole or not at all); the next call "
                       "reconnects" % (_real(address), why, op))


def _peer_closed(sock):
    """True when the real client closed the connection (or sent something
    unasked, which the protocol never does): found without blocking."""
    poller = select.poll()
    poller.register(sock, select.POLLIN | select.POLLRDHUP)
    return bool(poller.poll(0))


class _Shared:
    __slots__ = ("fd", "addr", "size", "registered")

    def __init__(self, fd, addr, size):
        self.fd, self.addr, self.size, self.registered = fd, addr, size, False


class DummyConnection:
    """A dummy's connection to its real client: the Store and engine calls
    MooncakeDistributedStore makes, forwarded."""

    def __init__(self, port, mem_pool_size, local_buffer_size):
        self.port = port
        self.address = ipc.printable(ipc.socket_name(port))
        self.lock = threading.Lock()
        self.pool_left = mem_pool_size
        self.shared = {}
        self.lost = None  # why the last connection was lost, while there is none
        self.closed = False
        self.sock = None
        self.local = None
        self.segment = None
        self._tls = threading.local()
        self.sock = self._connect()
        try:
            self.segment = self._handshake()
            if local_buffer_size > 0:
                self.local = self._new_shared(local_buffer_size, "mooncake-dummy-local")
                self._register(self.local)
        except BaseException:
            self.close()
            raise

    # ---- connection -------------------------------------------------------------------------

    def _connect(self):
        try:
            return self._open()
        except OSError as e:
            raise ferry.Error(ferry.ESOCKET, "connect",
                              "cannot reach the real client at %s: %s (is mooncake_client "
                              "running with --port=%d on this host?)"
                              % (self.address, e.strerror or e, self.port)) from None

    def _open(self):
        """A connection to the real client's socket, its uid checked: OSError
        when nothing listens there."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(ipc.timeout_s())
        try:
            sock.connect(ipc.socket_name(self.port))
        except OSError:
            sock.close()
            raise
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
            raise ferry.Error(ferry.ESOCKET, "setup_dummy", "%s: handshake: %s"
                              % (_real(self.address), e)) from None

    def _reply(self, what):
        msg, fds = ipc.recv(self.sock)
        _close_all(fds)
        if "error" in msg:
            code, detail = msg["error"]
            raise ferry.Error(code, what, detail)
        return msg["ok"]

    def _lose(self, why):
        """Drops the connection; the next call reconnects."""
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        self.lost = why

    def _connected(self):
        """True when the connection is there and its close has not reached
        this side (checked before a request: a request sent on a connection
        already closed would fail for nothing)."""
        if self.sock is not None and _peer_closed(self.sock):
            self._lose("the connection was closed")
        return self.sock is not None

    def _reconnect(self, op):
        """A new connection, its handshake, and every region shared again.
        Connect attempts for at most FERRY_DUMMY_RECONNECT_S."""
        window = _env_seconds("FERRY_DUMMY_RECONNECT_S", 1)
        started = time.monotonic()
        tries = 0
        while True:
            tries += 1
            try:
                self.sock = self._open()
                break
            except OSError as e:
                waited = time.monotonic() - started
                if waited + _RETRY_PAUSE_S > window:
                    raise ferry.Error(ferry.ESOCKET, op,
                                      "%s is not back: %s (%d connect attempt(s) in %.1f s, "
                                      "FERRY_DUMMY_RECONNECT_S; the connection was lost "
                                      "before: %s); the next call tries again"
                                      % (_real(self.address), e.strerror or e, tries, waited,
                                         self.lost)) from None
                time.sleep(_RETRY_PAUSE_S)
            except ferry.Error as e:
                raise ferry.Error(e.code, op, "reconnecting: %s" % e.detail) from None
        try:
            self.segment = self._handshake()
            for s in list(self.shared.values()):
                if s.registered:
                    self._share_again(s)
        except ferry.Error as e:
            self._lose("reconnecting: %s" % e.detail)
            raise ferry.Error(e.code, op, "reconnecting: %s; the next call tries again"
                              % e.detail) from None
        self.lost = None

    def _share_again(self, s):
        """Registers s with the new connection; a region the real client
        refuses is left unregistered (a call naming it is refused there,
        FERRY_ENOTREG), the others go on."""
        try:
            self._request("register", fd=s.fd, addr=s.addr, size=s.size)
        except ferry.Error as e:
            if self.sock is None:  # lost again
                raise ferry.Error(ferry.ESOCKET, "register", "%s: sharing region %#x again: %s"
                                  % (_real(self.address), s.addr, self.lost)) from None
            s.registered = False
            logger.warning("%s refused region %#x (+%d bytes) on reconnect: %s; "
                           "register_buffer it again", _real(self.address), s.addr, s.size,
                           e.detail)

    def _request(self, op, fd=None, **args):
        """Sends one request and reads its answer; a connection lost on the
        way is dropped (self.sock None) and the call fails."""
        args["op"] = op
        try:
            ipc.send(self.sock, args, fd)
            return self._reply(op)
        except ipc.IpcError as e:
            self._lose(str(e))
            raise _lost(self.address, op, str(e)) from None

    def call(self, op, fd=None, **args):
        """One request and its answer, under the lock."""
        with self.lock:
            return self._call(op, fd, **args)

    def _call(self, op, fd=None, **args):
        if self.closed:
            raise ferry.Error(ferry.ESOCKET, op, "this dummy client was closed (close()): "
                              "setup_dummy again")
        if not self._connected():
            self._reconnect(op)
        return self._request(op, fd, **args)

    def close(self):
        self.closed = True
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        for s in self.shared.values():
            ipc.unmap(s.addr, s.size)
            os.close(s.fd)
        self.shared.clear()

    # ---- shared memory ----------------------------------------------------------------------

    def _new_shared(self, size, name):
        fd, addr = ipc.new_shared(size, name)
        s = _Shared(fd, addr, size)
        with self.lock:  # a reconnect walks the regions under it
            self.shared[addr] = s
        return s

    def _register(self, s):
        with self.lock:  # flagged with the request: a reconnect shares it again
            self._call("register", fd=s.fd, addr=s.addr, size=s.size)
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
            with self.lock:
                self._unregister(s)
            return 0
        except ferry.Error as e:
            self._tls.error = e.detail
            return e.code

    def _unregister(self, s):
        """Without a connection, the real client's registration went with the
        last one (it unmaps a dummy's regions when its connection ends): only
        the flag changes, nothing reconnects."""
        try:
            if self._connected():
                self._request("unregister", addr=s.addr)
        except ferry.Error:
            if self.sock is not None:  # refused by the real client
                raise
        s.registered = False

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

    def batch_clear(self, keys, segment=""):
        return self.call("clear", keys=list(keys), segment=segment)

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
