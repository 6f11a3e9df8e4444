"""prefill.py - the prefill of the EPD example: asks the encoder, over one
control plane, to encode each request for this prefill (request id and this
engine's name only), receives the embedding from its ferry pool by request
id, and checks it byte for byte. Exits 0 when all matched.

  python3 prefill.py --plane http --encoder 127.0.0.1:PORT --count 3"""

import argparse
import json
import sys

import numpy as np

import ferry
from common import CLIENTS, HIDDEN, POOL, embedding, encode_request


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--plane", choices=sorted(CLIENTS), required=True)
    ap.add_argument("--encoder", required=True)
    ap.add_argument("--count", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=4096)
    ap.add_argument("--port", type=int, default=0, help="ferry port (a restart keeps its name)")
    ap.add_argument("--first", type=int, default=0, help="number of the first request id")
    ap.add_argument("--pool-mb", type=int, default=80, help="pool size (MiB)")
    args = ap.parse_args()
    call = CLIENTS[args.plane](args.encoder)
    with ferry.Engine("127.0.0.1", port=args.port) as engine, engine.create_pool(POOL, args.pool_mb << 20) as pool:
        for i in range(args.first, args.first + args.count):
            request_id = f"{args.plane}-req-{i}"
            reply = json.loads(call(encode_request(request_id, engine.name)))
            if not reply.get("ok"):
                sys.exit(f"encoder failed {request_id}: {reply}")
            with engine.recv(pool, request_id, timeout=30) as msg:
                got = np.frombuffer(msg, dtype=np.float16).reshape(-1, HIDDEN)
                want = embedding(request_id, args.max_tokens)
                if got.shape != want.shape or got.tobytes() != want.tobytes():
                    sys.exit(f"{request_id}: embedding differs (got {got.shape}, want {want.shape})")
                print(f"{request_id}: {got.shape[0]} x {HIDDEN} float16 verified from {msg.sender}")
                del got
    print(f"verified {args.count}")


if __name__ == "__main__":
    main()
