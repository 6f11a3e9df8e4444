"""nixl_peer.py - a nixl agent in its own process for the nixl tests: the
prefill side of vLLM's NixlConnector flow with host KV buffers.

It makes an agent (MC_TCP_BIND_ADDRESS=127.0.0.1 keeps ferry on loopback),
allocates 2 x LAYERS host KV regions (K and V per layer) of BLOCKS blocks of
BLOCK_BYTES each, registers one descriptor per region as vLLM does, and
prints one JSON line {"agent", "metadata" (base64), "pid", "regions": [addr,
...], "blocks", "block_bytes"}. Then it answers one JSON line per stdin
command until stdin closes:

    {"cmd": "add_remote", "metadata": b64}        -> {"agent": name}
    {"cmd": "prefill", "req": R, "blocks": N}     -> {"block_ids": [...]}: N free
        blocks (scattered), each region's block j of the request filled
        with kv_block(R, region, j)
    {"cmd": "poll"}   -> {"freed": [R, ...], "notifs": {agent: [text]}}: drains
        notifications; a "R:TP" message from TP agents frees R's blocks
        (back on the free list, overwritten with 0xEE as reuse would)
    {"cmd": "free_count"}                         -> {"free": N}
    {"cmd": "dump", "region": r, "block": b}      -> {"data": b64 of that block}
    {"cmd": "send_notif", "agent": A, "msg": m}   -> {"ok": true}
    {"cmd": "known", "agent": A}                  -> {"known": bool}: whether the
        agent's metadata is loaded (its listener's doing, with --listen PORT)
"""

import argparse
import base64
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

import numpy as np  # noqa: E402


def kv_block(req, region, j, block_bytes):
    """The bytes the prefill computes for request req, region, its j-th block."""
    rng = np.random.default_rng(req * 1000003 + region * 1009 + j)
    return rng.integers(0, 256, block_bytes, dtype=np.uint8)


def reply(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


class Prefill:
    def __init__(self, agent, layers, blocks, block_bytes):
        self.agent = agent
        self.block_bytes = block_bytes
        self.kv = [np.zeros(blocks * block_bytes, dtype=np.uint8) for _ in range(2 * layers)]
        descs = [(t.ctypes.data, t.nbytes, 0, "") for t in self.kv]
        agent.register_memory(agent.get_reg_descs(descs, "DRAM"))
        order = np.random.default_rng(7).permutation(blocks)  # scattered allocation
        self.free = [int(b) for b in order]
        self.requests = {}  # req -> block ids
        self.seen = {}  # req -> notifications counted

    def prefill(self, req, n):
        ids, self.free = self.free[:n], self.free[n:]
        for r, region in enumerate(self.kv):
            for j, b in enumerate(ids):
                region[b * self.block_bytes:(b + 1) * self.block_bytes] = \
                    kv_block(req, r, j, self.block_bytes)
        self.requests[req] = ids
        return ids

    def poll(self):
        freed, texts = [], {}
        for agent, msgs in self.agent.get_new_notifs().items():
            for m in msgs:
                texts.setdefault(agent, []).append(m.decode())
                req, tp = (int(x) for x in m.decode().split(":"))
                self.seen[req] = self.seen.get(req, 0) + 1
                if self.seen[req] == tp:
                    self.release(req)
                    freed.append(req)
        return {"freed": freed, "notifs": texts}

    def release(self, req):
        ids = self.requests.pop(req)
        for region in self.kv:
            for b in ids:
                region[b * self.block_bytes:(b + 1) * self.block_bytes] = 0xEE
        self.free.extend(ids)


def serve(agent, prefill):
    for line in sys.stdin:
        if not line.strip():
            continue
        cmd = json.loads(line)
        op = cmd["cmd"]
        if op == "add_remote":
            reply({"agent": agent.add_remote_agent(base64.b64decode(cmd["metadata"])).decode()})
        elif op == "prefill":
            reply({"block_ids": prefill.prefill(cmd["req"], cmd["blocks"])})
        elif op == "poll":
            reply(prefill.poll())
        elif op == "free_count":
            reply({"free": len(prefill.free)})
        elif op == "dump":
            bb = prefill.block_bytes
            data = prefill.kv[cmd["region"]][cmd["block"] * bb:(cmd["block"] + 1) * bb]
            reply({"data": base64.b64encode(data.tobytes()).decode()})
        elif op == "send_notif":
            agent.send_notif(cmd["agent"], cmd["msg"].encode())
            reply({"ok": True})
        elif op == "known":
            reply({"known": agent.check_remote_metadata(cmd["agent"])})
        else:
            reply({"error": f"unknown command {op!r}"})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--name", default="prefill")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--blocks", type=int, default=48)
    ap.add_argument("--block-bytes", type=int, default=4096)
    ap.add_argument("--transports", default="all")
    ap.add_argument("--listen", type=int, default=0, help="the metadata listener's port")
    args = ap.parse_args()
    os.environ.setdefault("MC_TCP_BIND_ADDRESS", "127.0.0.1")
    from nixl._api import nixl_agent, nixl_agent_config

    agent = nixl_agent(args.name, nixl_agent_config(backends=[], enable_listen_thread=bool(args.listen),
                                                    listen_port=args.listen))
    agent.create_backend("UCX", {"ferry_transports": args.transports})
    prefill = Prefill(agent, args.layers, args.blocks, args.block_bytes)
    reply({"agent": args.name, "pid": os.getpid(),
           "metadata": base64.b64encode(agent.get_agent_metadata()).decode(),
           "regions": [t.ctypes.data for t in prefill.kv], "blocks": args.blocks,
           "block_bytes": args.block_bytes})
    serve(agent, prefill)
    agent.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
