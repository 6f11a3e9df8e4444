"""target_proc.py - a transfer target for the Python tests, run as a separate process.

It initializes a mooncake.engine.TransferEngine (P2PHANDSHAKE on 127.0.0.1, or
an http metadata service with --metadata), allocates one managed buffer and
prints one JSON line:

    {"session": "127.0.0.1:PORT", "addr": ..., "size": ..., "pid": ...}

Then it serves JSON commands, one per stdin line, answering one JSON line each,
until stdin closes (or it is killed):

    {"cmd": "sha256", "off": O, "len": N}   -> {"sha256": hex of buffer[O:O+N]}
    {"cmd": "dump", "off": O, "len": N}     -> {"data": base64 of buffer[O:O+N]}
    {"cmd": "fill", "off": O, "data": b64}  -> {"ok": true}
    {"cmd": "notifies"}                     -> {"notifies": [[name, msg], ...]}
    {"cmd": "register", "size": N}          -> {"addr": A, "rc": 0}   (extra region)
    {"cmd": "notify", "target": T, "name": n, "msg": m} -> {"rc": 0}
    {"cmd": "exit"}                         -> exits

Options: --port P binds that RPC port (Mooncake's MC_LEGACY_RPC_PORT_BINDING
behaviour), --metadata URL --name SEGMENT uses a metadata service, --size N
sets the buffer size, --protocol sets the protocol string.
"""

import argparse
import base64
import ctypes
import hashlib
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))


def reply(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--metadata", default=None)
    ap.add_argument("--name", default=None)
    ap.add_argument("--size", type=int, default=1 << 20)
    ap.add_argument("--protocol", default=os.environ.get("FERRY_TEST_PROTOCOL") or "tcp")
    args = ap.parse_args()

    if args.port:
        os.environ["MC_LEGACY_RPC_PORT_BINDING"] = "1"
    from mooncake.engine import TransferEngine

    te = TransferEngine()
    if args.metadata:
        local = args.name or "%s:%d" % (args.host, args.port)
        rc = te.initialize(local, args.metadata, args.protocol, "")
    else:
        local = "%s:%d" % (args.host, args.port) if args.port else args.host
        rc = te.initialize(local, "P2PHANDSHAKE", args.protocol, "")
    if rc != 0:
        reply({"error": "initialize failed", "rc": rc, "detail": te.last_error()})
        return 3
    addr = te.allocate_managed_buffer(args.size)
    if not addr:
        reply({"error": "allocate_managed_buffer failed", "detail": te.last_error()})
        return 4
    if args.metadata:
        session = args.name
    else:
        session = "%s:%d" % (args.host, te.get_rpc_port())
    reply({"session": session, "addr": addr, "size": args.size, "pid": os.getpid(),
           "port": te.get_rpc_port()})

    extra = []  # keeps extra regions alive
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        cmd = json.loads(line)
        op = cmd.get("cmd")
        if op == "sha256":
            data = ctypes.string_at(addr + cmd["off"], cmd["len"])
            reply({"sha256": hashlib.sha256(data).hexdigest()})
        elif op == "dump":
            data = ctypes.string_at(addr + cmd["off"], cmd["len"])
            reply({"data": base64.b64encode(data).decode()})
        elif op == "fill":
            data = base64.b64decode(cmd["data"])
            te.write_bytes_to_buffer(addr + cmd["off"], data, len(data))
            reply({"ok": True})
        elif op == "notifies":
            reply({"notifies": [[n.name, n.msg] for n in te.get_notifies()]})
        elif op == "register":
            buf = ctypes.create_string_buffer(cmd["size"])
            extra.append(buf)
            a = ctypes.addressof(buf)
            reply({"addr": a, "rc": te.register_memory(a, cmd["size"])})
        elif op == "notify":
            try:
                te.get_engine().notify(cmd["target"], cmd["name"], cmd["msg"])
                reply({"rc": 0})
            except Exception as e:  # reported to the test, which fails on it
                reply({"rc": -1, "detail": str(e)})
        elif op == "exit":
            break
        else:
            reply({"error": "unknown command %r" % op})
    return 0


if __name__ == "__main__":
    sys.exit(main())
