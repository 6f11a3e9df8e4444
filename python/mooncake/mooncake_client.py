"""mooncake.mooncake_client - Mooncake's ``mooncake_client``: a "real client"
process that owns a store client (its segment, its transfer engine, its
master connection) and serves *dummy clients*, processes on this host that
call ``MooncakeDistributedStore().setup_dummy(mem_pool_size,
local_buffer_size, "127.0.0.1:PORT")`` and then use the store through it:

    mooncake_client [--port=50052] [--master_server_address=127.0.0.1:50051]
                    [--metadata_server=http://127.0.0.1:8080/metadata]
                    [--global_segment_size="4 GB"] [--local_buffer_size=0]
                    [--host=127.0.0.1] [--protocol=tcp] [--device_names=]
    python -m mooncake.mooncake_client ...

Mooncake's flags and defaults, but --host (the store engine's name, the
segment's) is 127.0.0.1 by default, not 0.0.0.0: ferry serves only what is
asked beyond loopback. Dummies reach it on an abstract UNIX socket named by
--port (mooncake._dummy_ipc), not over TCP: a peer of another uid is
refused, and with FERRY_SECRET both sides prove it. Each dummy shares its
buffers as memfds that this process maps and registers on its engine
(its local buffer at setup, ``alloc_from_mem_pool`` memory at
``register_buffer``), so the store moves their bytes straight between the
dummy's memory and the replica; a request names the dummy's addresses,
translated here and checked to lie inside memory that dummy shared.

A dummy is served by a thread of its own, one request at a time. When its
connection ends (closed, or the process died) its memory is unregistered
and unmapped after its last request finished; a request already received
completes (its bytes are in the shared memory), one cut short is dropped.
A dummy may be idle between requests for as long as it likes, but once it
connects or begins a frame, the handshake step or the rest of the frame
must come within FERRY_DUMMY_TIMEOUT_S (60 s): one that stalls there is
dropped as a dead one (its regions released), so a stuck peer holds no
memory. A dummy that reconnects (this process restarted, or its connection
lost) is a new one here: it shares its regions again.
Prints "ready mooncake_client=@ferry-mooncake-client-PORT segment=NAME"
once it listens, and runs until SIGINT or SIGTERM.
"""

import argparse
import logging
import os
import secrets
import signal
import socket
import struct
import sys
import threading

import ferry

from mooncake import _dummy_ipc as ipc
from mooncake.store import MooncakeDistributedStore

logger = logging.getLogger("mooncake.mooncake_client")

# Mooncake's flags this real client does not implement; refused by name when set.
_NOT_IMPLEMENTED = ("enable_http_server",)


def _bool(text):
    if text.lower() in ("1", "true", "yes"):
        return True
    if text.lower() in ("0", "false", "no"):
        return False
    raise argparse.ArgumentTypeError("not a boolean: %r" % text)


def parse_args(argv):
    p = argparse.ArgumentParser(prog="mooncake_client",
                                description="Mooncake's real client on ferry: a store client "
                                "that serves dummy clients on this host (docs/store.md).")
    p.add_argument("--host", default="127.0.0.1",
                   help="the store engine's name, its segment's (default 127.0.0.1; no port: "
                   "one is picked in 12300-14300)")
    p.add_argument("--metadata_server", default="http://127.0.0.1:8080/metadata")
    p.add_argument("--device_names", default="")
    p.add_argument("--master_server_address", default="127.0.0.1:50051")
    p.add_argument("--protocol", default="tcp")
    p.add_argument("--port", type=int, default=50052,
                   help="names the socket dummies connect to (default 50052)")
    p.add_argument("--global_segment_size", default="4 GB")
    p.add_argument("--local_buffer_size", default="0")
    p.add_argument("--threads", type=int, default=1,
                   help="accepted for Mooncake's sake: each dummy has a thread of its own")
    p.add_argument("--tenant_id", default="default")
    p.add_argument("--enable_offload", type=_bool, nargs="?", const=True, default=False,
                   help="client-owned SSD offload (the master runs with --enable_offload): "
                   "copies of this segment's objects in MOONCAKE_OFFLOAD_FILE_STORAGE_PATH")
    p.add_argument("--start_offload_rpc_server", type=_bool, nargs="?", const=True, default=True,
                   help="accepted; no effect: gets reach offloaded objects through the master "
                   "(docs/store.md)")
    p.add_argument("--http_port", type=int, default=9300, help="accepted; see --enable_http_server")
    for name in _NOT_IMPLEMENTED:
        p.add_argument("--" + name, type=_bool, nargs="?", const=True, default=False,
                       help="not implemented by ferry: refused when true")
    args = p.parse_args(argv)
    for name in _NOT_IMPLEMENTED:
        if getattr(args, name):
            p.error("--%s is not implemented by ferry's mooncake_client; refusing to run "
                    "without it" % name)
    if args.tenant_id != "default":
        p.error("--tenant_id=%s: ferry's store has one tenant (default)" % args.tenant_id)
    if not 0 < args.port < 65536:
        p.error("--port=%d: not a port (1..65535)" % args.port)
    return args


class _Region:
    """Memory a dummy shared: its address there, its size, its address here."""

    __slots__ = ("dummy_addr", "size", "addr")

    def __init__(self, dummy_addr, size, addr):
        self.dummy_addr, self.size, self.addr = dummy_addr, size, addr


class _Dummy:
    """One dummy's connection: its shared memory and its requests."""

    def __init__(self, server, sock, number):
        self.server = server
        self.sock = sock
        # A handshake step, or the rest of a frame begun, must come within it;
        # a dummy that stalls there is dropped with its regions (its wait
        # between frames has no limit: serve_one).
        self.sock.settimeout(ipc.timeout_s())
        self.name = "dummy %d (pid %d)" % (number, _peer_pid(sock))
        self.regions = {}

    # ---- address translation ----------------------------------------------------------------

    def here(self, addr, size):
        """The address here of the dummy's [addr, addr + size), or None when
        that range is not inside one region the dummy shared."""
        if not isinstance(addr, int) or not isinstance(size, int) or size < 0:
            return None
        for r in self.regions.values():
            if r.dummy_addr <= addr and addr + size <= r.dummy_addr + r.size:
                return r.addr + (addr - r.dummy_addr)
        return None

    def _not_shared(self, addr, size):
        return ("local address %#x (+%d bytes) is not in memory %s shared with the real client "
                "(alloc_from_mem_pool, then register_buffer)" % (addr, size, self.name))

    def _translated(self, call, columns):
        """Runs call(rows) on the rows whose (address, size) pairs all lie in
        shared memory, translated; the others answer FERRY_ENOTREG.
        columns: per row, a list of (address, size) pairs."""
        answers, keep, rows, detail = [ferry.ENOTREG] * len(columns), [], [], None
        for i, pairs in enumerate(columns):
            here = [self.here(a, n) for a, n in pairs]
            if any(h is None for h in here):
                bad = next(p for p, h in zip(pairs, here) if h is None)
                detail = detail or self._not_shared(*bad)
                continue
            keep.append(i)
            rows.append(here)
        if rows:
            got, first = call(keep, rows)
            for i, a in zip(keep, got):
                answers[i] = a
            detail = detail or first
        return [answers, detail]

    # ---- requests ---------------------------------------------------------------------------

    def op_register(self, msg, fds):
        addr, size = msg["addr"], msg["size"]
        if len(fds) != 1:
            raise ValueError("register: expected one memfd, got %d" % len(fds))
        if not isinstance(addr, int) or not isinstance(size, int) or size <= 0:
            raise ValueError("register: bad address or size")
        if addr in self.regions:
            raise ValueError("register: %#x is registered already" % addr)
        why = ipc.check_shared(fds[0], size)
        if why:
            raise ValueError("register: the descriptor sent is %s" % why)
        here = ipc.map_fd(fds[0], size)
        if self.server.engine.register_memory(here, size) != 0:
            ipc.unmap(here, size)
            raise ferry.Error(ferry.EINVAL, "register", self.server.engine.last_error())
        self.regions[addr] = _Region(addr, size, here)
        self.server.count_shared(1)
        return 0

    def op_unregister(self, msg, fds):
        r = self.regions.pop(msg["addr"], None)
        if r is None:
            raise ValueError("unregister: %#x is not registered with the real client"
                             % msg["addr"])
        self._release(r)
        return 0

    def _release(self, r):
        self.server.engine.unregister_memory(r.addr)
        ipc.unmap(r.addr, r.size)
        self.server.count_shared(-1)

    def op_put_from(self, msg, fds):
        rep, keys, upsert = _rep(msg["rep"]), msg["keys"], bool(msg.get("upsert"))
        return self._translated(
            lambda keep, rows: self.server.store.batch_put_from(
                [keys[i] for i in keep], [r[0] for r in rows],
                [msg["sizes"][i] for i in keep], *rep, upsert=upsert),
            [[(a, n)] for a, n in zip(msg["addrs"], msg["sizes"])])

    def op_put_from_multi(self, msg, fds):
        rep, keys = _rep(msg["rep"]), msg["keys"]
        return self._translated(
            lambda keep, rows: self.server.store.batch_put_from_multi(
                [keys[i] for i in keep], rows, [msg["all_sizes"][i] for i in keep], *rep),
            [list(zip(a, n)) for a, n in zip(msg["all_addrs"], msg["all_sizes"])])

    def op_get_into(self, msg, fds):
        keys = msg["keys"]
        return self._translated(
            lambda keep, rows: self.server.store.batch_get_into(
                [keys[i] for i in keep], [r[0] for r in rows], [msg["sizes"][i] for i in keep]),
            [[(a, n)] for a, n in zip(msg["addrs"], msg["sizes"])])

    def op_get_into_multi(self, msg, fds):
        keys = msg["keys"]
        return self._translated(
            lambda keep, rows: self.server.store.batch_get_into_multi(
                [keys[i] for i in keep], rows, [msg["all_sizes"][i] for i in keep]),
            [list(zip(a, n)) for a, n in zip(msg["all_addrs"], msg["all_sizes"])])

    def op_get_ranges(self, msg, fds):
        keys, offsets = msg["keys"], msg["offsets"]
        return self._translated(
            lambda keep, rows: self.server.store.get_ranges(
                [keys[i] for i in keep], [r[0] for r in rows], [offsets[i] for i in keep],
                [msg["lengths"][i] for i in keep]),
            [[(a, n)] for a, n in zip(msg["addrs"], msg["lengths"])])

    def op_get(self, msg, fds):
        """A whole value into the dummy's buffer at addr (cap bytes): its size."""
        key, addr, cap = msg["key"], msg["addr"], msg["cap"]
        here = self.here(addr, cap)
        if here is None:
            raise ferry.Error(ferry.ENOTREG, "get", self._not_shared(addr, cap))
        answers, detail = self.server.store.batch_get_into([key], [here], [cap])
        if answers[0] == ferry.EINVAL and detail and "buffers hold" in detail:
            detail += " (the dummy's local_buffer_size)"
        if answers[0] < 0:
            raise ferry.Error(answers[0], "get", detail)
        return answers[0]

    def op_exists(self, msg, fds):
        return list(self.server.store.batch_exists(msg["keys"]))

    def op_clear(self, msg, fds):
        return list(self.server.store.batch_clear(msg["keys"], msg["segment"]))

    def op_remove(self, msg, fds):
        self.server.store.remove(msg["key"])
        return 0

    def op_remove_all(self, msg, fds):
        return self.server.store.remove_all()

    def op_status(self, msg, fds):
        """For tests and operators: dummies connected, regions mapped for them."""
        return self.server.status()

    # ---- the connection ---------------------------------------------------------------------

    def handshake(self):
        """Greets the dummy and checks its proof; True when it may go on."""
        key, nonce = ipc.secret(), secrets.token_hex(16)
        ipc.send(self.sock, {"hello": "ferry-mooncake-client", "version": ipc.VERSION,
                             "nonce": nonce, "auth": key is not None})
        msg, fds = ipc.recv(self.sock)
        _close_all(fds)
        if msg.get("op") != "hello" or msg.get("version") != ipc.VERSION:
            ipc.send(self.sock, {"error": [ferry.EVERSION, "expected hello of version %d"
                                           % ipc.VERSION]})
            return False
        client_nonce = str(msg.get("nonce", ""))
        if key is not None and not ipc.proofs_match(
                msg.get("proof"), ipc.proof(key, "dummy", nonce, client_nonce)):
            logger.warning("mooncake_client: %s refused: its proof of the shared secret "
                           "(FERRY_SECRET) is %s", self.name,
                           "missing" if msg.get("proof") is None else "wrong")
            ipc.send(self.sock, {"error": [ferry.EAUTH, "the real client refused the shared "
                                           "secret's proof (FERRY_SECRET differs or is unset)"]})
            return False
        ipc.send(self.sock, {"ok": {"segment": self.server.hostname,
                                    "proof": key and ipc.proof(key, "real", nonce,
                                                               client_nonce)}})
        return True

    def serve(self):
        try:
            if self.handshake():
                logger.info("mooncake_client: %s connected", self.name)
                while self.serve_one():
                    pass
        except ipc.IpcError as e:
            logger.info("mooncake_client: %s gone or stalled: %s", self.name, e)
        finally:
            for r in self.regions.values():
                self._release(r)
            logger.info("mooncake_client: %s: released %d shared region(s)", self.name,
                        len(self.regions))
            self.regions.clear()
            self.server.forget(self)
            self.sock.close()  # last: a peer that sees the close finds everything released

    def serve_one(self):
        ipc.wait_readable(self.sock)
        msg, fds = ipc.recv(self.sock)
        try:
            handler = getattr(self, "op_" + str(msg.get("op")), None)
            if handler is None:
                reply = {"error": [ferry.ENOTIMPL, "unknown request %r" % msg.get("op")]}
            else:
                reply = {"ok": handler(msg, fds)}
        except ferry.Error as e:
            reply = {"error": [e.code, e.detail]}
        except (KeyError, TypeError, ValueError, OverflowError, OSError) as e:
            reply = {"error": [ferry.EINVAL, "%s: %s" % (msg.get("op"), e)]}
        finally:
            _close_all(fds)
        ipc.send(self.sock, reply)
        return True


class RealClient:
    """The store client and the socket dummies reach it on."""

    def __init__(self, store, port):
        # The store calls take the C binding directly (MooncakeDistributedStore
        # holds it as _store): batches answer per key, as a dummy needs.
        self.store = store._store
        self.engine = store._engine
        self.hostname = store.get_hostname()
        self.name = ipc.socket_name(port)
        self.lock = threading.Lock()
        self.dummies = []
        self.count = 0
        self.shared = 0
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.listener.bind(self.name)
        except OSError as e:
            self.listener.close()
            raise OSError(e.errno, "cannot listen on %s: %s (another mooncake_client with "
                          "--port=%d?)" % (ipc.printable(self.name), e.strerror, port)) from None
        self.listener.listen(64)

    def status(self):
        with self.lock:
            return {"dummies": len(self.dummies), "regions": self.shared}

    def count_shared(self, n):
        """Regions mapped and registered for dummies, all together."""
        with self.lock:
            self.shared += n

    def forget(self, dummy):
        with self.lock:
            if dummy in self.dummies:
                self.dummies.remove(dummy)

    def accept_forever(self):
        uid = os.getuid()
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:  # closed by shutdown()
                return
            other = ipc.peer_uid(sock)
            if other != uid:
                logger.warning("mooncake_client: refused a connection from uid %d (this "
                               "process runs as uid %d)", other, uid)
                try:
                    ipc.send(sock, {"error": [ferry.EAUTH, "the real client serves its own "
                                              "user only (uid %d)" % uid]})
                except ipc.IpcError:
                    pass
                sock.close()
                continue
            with self.lock:
                self.count += 1
                dummy = _Dummy(self, sock, self.count)
                self.dummies.append(dummy)
            threading.Thread(target=dummy.serve, name=dummy.name, daemon=True).start()

    def shutdown(self):
        """Ends every dummy's connection, waits for their threads, closes the store."""
        try:
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes accept()
        except OSError:
            pass
        self.listener.close()
        with self.lock:
            dummies = list(self.dummies)
        for d in dummies:
            try:
                d.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for t in threading.enumerate():
            if t is not threading.current_thread() and t.daemon and t.name.startswith("dummy"):
                t.join(5)


def _rep(rep):
    """(replicas, preferred segment, pin) from a request, as _ferry.Store takes them."""
    replicas, preferred, pin = rep
    return (replicas, preferred, tuple(pin) if isinstance(pin, list) else pin)


def _peer_pid(sock):
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[0]


def _close_all(fds):
    for fd in fds:
        os.close(fd)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    # Blocked in every thread (the store's and the dummies' inherit it), taken
    # by sigwait below: a signal handler would run only when the main thread
    # wakes, and a thread blocked in accept() is not woken by one delivered
    # to another thread.
    stop = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop)
    store = MooncakeDistributedStore()
    rc = store.setup(args.host, args.metadata_server, args.global_segment_size,
                     args.local_buffer_size, args.protocol, args.device_names,
                     args.master_server_address, enable_ssd_offload=args.enable_offload)
    if rc != 0:
        sys.stderr.write("mooncake_client: cannot set up the store client (%d): see the "
                         "warning above\n" % rc)
        return 1
    try:
        real = RealClient(store, args.port)
    except OSError as e:
        sys.stderr.write("mooncake_client: %s\n" % e.strerror)
        store.close()
        return 1
    print("ready mooncake_client=%s segment=%s" % (ipc.printable(real.name), real.hostname),
          flush=True)
    threading.Thread(target=real.accept_forever, name="accept", daemon=True).start()
    signum = signal.sigwait(stop)
    logger.info("mooncake_client: signal %d, stopping", signum)
    real.shutdown()
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
