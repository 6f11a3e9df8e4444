"""encoder.py - the encoder of the EPD example: serves "encode this request
for that prefill" on one control plane (http, grpc or zmq) and hands the
embedding to the prefill's pool with ferry.send. Prints "READY <port>".
A send that fails (the pool is full under "nowait", or too small, or the
prefill is gone) is reported back on the control plane: {"error", "code"}.

  python3 encoder.py --plane http [--min-tokens 256] [--max-tokens 4096]"""

import argparse
import json
import sys

import ferry
from common import POOL, SERVERS, decode_request, embedding


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--plane", choices=sorted(SERVERS), required=True)
    ap.add_argument("--min-tokens", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=4096)
    args = ap.parse_args()
    engine = ferry.Engine("127.0.0.1")

    def handle(body):
        request_id, prefill, nowait = decode_request(body)
        emb = embedding(request_id, args.max_tokens, args.min_tokens)
        try:
            engine.send(prefill, POOL, request_id, emb, timeout=30, nowait=nowait)
        except ferry.Error as e:
            return 500, json.dumps({"error": str(e), "code": e.code}).encode()
        return 200, b'{"ok": true}'

    port = SERVERS[args.plane](handle)
    print(f"READY {port}", flush=True)
    sys.stdin.read()  # runs until its parent closes our stdin
    engine.close()


if __name__ == "__main__":
    main()
