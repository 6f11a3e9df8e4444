"""mooncake._dummy_ipc - the local socket between a real client
(``mooncake_client``) and its dummy clients (``setup_dummy``): its name,
frames, handshake and the shared memory they pass. Both halves import it.

The socket is an abstract UNIX socket, ``@ferry-mooncake-client-PORT``
(PORT: the real client's ``--port``, the one a dummy's server_address
names), so it never leaves the host and leaves no file behind. Any local
process can connect to an abstract name, or bind it first, so each side
trusts only what the kernel says about the other (SO_PEERCRED): a peer of
another uid is refused. With FERRY_SECRET set (the engine's and the store
master's shared secret), both sides also prove it: HMAC-SHA256 over both
sides' nonces, the dummy first, the real client's proof back.

A frame is a 4-byte little-endian length, then that many bytes of JSON (at
most MAX_FRAME); a request that hands over shared memory carries its memfd
with the frame (SCM_RIGHTS). Values never go through the socket: they lie
in memfd memory that both processes map.
"""

import ctypes
import fcntl
import hashlib
import hmac
import json
import mmap
import os
import select
import socket
import struct

VERSION = 1
MAX_FRAME = 64 << 20
_HEADER = struct.Struct("<I")

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long)
_libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
_MAP_FAILED = ctypes.c_void_p(-1).value


class IpcError(Exception):
    """The socket failed, or the peer broke the protocol; str() says how."""


def socket_name(port):
    """The abstract socket of the real client listening for dummies as PORT."""
    return "\0ferry-mooncake-client-%d" % port


def printable(name):
    return "@" + name[1:] if name.startswith("\0") else name


def peer_uid(sock):
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


def secret():
    """The shared secret both sides must prove (FERRY_SECRET), or None."""
    return os.environ.get("FERRY_SECRET") or None


def proof(key, role, server_nonce, client_nonce):
    """role's proof of the secret over both nonces (hex)."""
    msg = b"ferry-mooncake-client|%s|%s|%s" % (role.encode(), server_nonce.encode(),
                                                client_nonce.encode())
    return hmac.new(key.encode(), msg, hashlib.sha256).hexdigest()


def proofs_match(a, b):
    return isinstance(a, str) and isinstance(b, str) and hmac.compare_digest(a, b)


def send(sock, message, fd=None):
    """Sends one frame, with fd attached when given."""
    body = json.dumps(message, separators=(",", ":")).encode()
    data = _HEADER.pack(len(body)) + body
    try:
        if fd is None:
            sock.sendall(data)
            return
        sent = socket.send_fds(sock, [data], [fd])
        if sent < len(data):
            sock.sendall(data[sent:])
    except OSError as e:
        raise IpcError("send failed: %s" % (e.strerror or e)) from None


def _recv_exact(sock, n, fds):
    out = bytearray()
    while len(out) < n:
        try:
            chunk, got, _, _ = socket.recv_fds(sock, n - len(out), 4)
        except socket.timeout:
            raise IpcError("no answer within the timeout (FERRY_DUMMY_TIMEOUT_S, %g s)"
                           % sock.gettimeout()) from None
        except OSError as e:
            raise IpcError("receive failed: %s" % (e.strerror or e)) from None
        fds.extend(got)
        if not chunk:
            raise IpcError("the connection was closed" if not out else
                           "the connection was closed inside a frame")
        out += chunk
    return bytes(out)


def recv(sock):
    """One frame: (message, [received fds]). The caller owns the fds."""
    fds = []
    try:
        (size,) = _HEADER.unpack(_recv_exact(sock, _HEADER.size, fds))
        if size > MAX_FRAME:
            raise IpcError("a frame of %d bytes (the most is %d)" % (size, MAX_FRAME))
        message = json.loads(_recv_exact(sock, size, fds))
        if not isinstance(message, dict):
            raise IpcError("a frame that is not a JSON object")
        return message, fds
    except (IpcError, ValueError) as e:
        for fd in fds:
            os.close(fd)
        raise IpcError(str(e)) from None


def wait_readable(sock):
    """Blocks, with no limit, until sock has a byte to read or was closed:
    a peer may be idle between frames for as long as it likes; the frame
    itself then must come within the socket's timeout."""
    poller = select.poll()
    poller.register(sock, select.POLLIN | select.POLLRDHUP)
    poller.poll()


def timeout_s():
    """FERRY_DUMMY_TIMEOUT_S (60 by default): how long either side waits for
    a frame it expects (an answer, a handshake step, the rest of a frame)."""
    try:
        value = float(os.environ.get("FERRY_DUMMY_TIMEOUT_S", 60))
    except ValueError:
        return 60.0
    return value if value > 0 else 60.0


def map_fd(fd, size):
    """Maps size bytes of fd shared, read and write; returns the address."""
    addr = _libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fd, 0)
    if addr in (None, _MAP_FAILED):
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return addr


def check_shared(fd, size):
    """None when fd is a memfd of at least size bytes that cannot shrink,
    else why not."""
    try:
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
        length = os.fstat(fd).st_size
    except OSError as e:
        return "not a memfd (%s)" % (e.strerror or e)
    if not seals & fcntl.F_SEAL_SHRINK:
        return "a memfd not sealed against shrinking (F_SEAL_SHRINK)"
    if length < size:
        return "a memfd of %d bytes, not %d" % (length, size)
    return None


def unmap(addr, size):
    _libc.munmap(addr, size)


def new_shared(size, name):
    """A memfd of size bytes, mapped here: (fd, address). Sealed against
    shrinking, so the real client that maps it can trust its size (a file
    cut short under a mapping would fault the process touching its end)."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, size)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
        return fd, map_fd(fd, size)
    except OSError:
        os.close(fd)
        raise
