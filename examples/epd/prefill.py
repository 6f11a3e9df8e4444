"""prefill.py - the prefill of the EPD example: asks the encoder, over one
control plane, to encode each request for this prefill (request id and this
engine's name only), receives the embedding from its ferry pool by request
id, and checks it byte for byte. Exits 0 when all matched.

  python3 prefill.py --plane http --encoder 127.0.0.1:PORT --count 3

Two faults it shows how to handle (tests/python/test_epd_examples.py):
  --fill-pool             keeps what it receives until a "nowait" request is
                          refused (FERRY_EBUSY names the pool), then asks
                          again without it: the encoder's send waits for room
                          (pool_senders_waiting) and goes through once the
                          prefill releases a message.
  --replace-lost-encoder  when the encoder is lost mid-request, waits until
                          the request's slot is back (pool_bytes_granted 0),
                          checks that nothing of it comes (FERRY_ETIMEDOUT
                          naming tag and pool), prints "NEED ENCODER", reads
                          a new encoder's address from stdin and redoes the
                          request; the run ends there. (One encoder at a
                          time: the gauge counts every sender's slots.)
With FERRY_METRICS_PORT=0 it prints "METRICS <port>" first (its /metrics)."""

import argparse
import json
import sys
import threading
import time

import numpy as np

import ferry
from common import CLIENTS, HIDDEN, POOL, EncoderLost, embedding, encode_request

RECLAIM_WAIT_S = 30  # a lost sender's slot comes back once its connections closed
WAIT_GAUGE_S = 30


class Prefill:
    def __init__(self, args, engine, pool):
        self.args, self.engine, self.pool = args, engine, pool
        self.call = CLIENTS[args.plane](args.encoder)

    def ask(self, request_id, nowait=False):
        """The encoder's reply: {"ok": true} once the prefill has the embedding."""
        return json.loads(self.call(encode_request(request_id, self.engine.name, nowait)))

    def receive(self, request_id, timeout=30):
        """The request's message, checked byte for byte; the caller releases it."""
        msg = self.engine.recv(self.pool, request_id, timeout=timeout)
        got = np.frombuffer(msg, dtype=np.float16).reshape(-1, HIDDEN)
        want = embedding(request_id, self.args.max_tokens, self.args.min_tokens)
        if got.shape != want.shape or not np.array_equal(got.view(np.uint16), want.view(np.uint16)):
            sys.exit(f"{request_id}: embedding differs (got {got.shape}, want {want.shape})")
        print(f"{request_id}: {got.shape[0]} x {HIDDEN} float16 verified from {msg.sender}", flush=True)
        return msg

    def handoff(self, request_id):
        reply = self.ask(request_id)
        if not reply.get("ok"):
            sys.exit(f"encoder failed {request_id}: {reply}")
        self.receive(request_id).release()

    def wait_stat(self, name, done, limit_s, busy=lambda: True):
        """Polls this engine's statistic name until done(value), while busy()."""
        deadline = time.monotonic() + limit_s
        while not done(self.engine.stats()[name]) and busy():
            if time.monotonic() > deadline:
                sys.exit(f"{name} is still {self.engine.stats()[name]} after {limit_s} s")
            time.sleep(0.01)

    def encoder_lost(self, request_id, lost):
        """Nothing of a lost request is delivered once its slot is back; a
        new encoder (its address on stdin) redoes it."""
        print(f"{request_id}: encoder lost: {lost}", flush=True)
        self.wait_stat("pool_bytes_granted", lambda v: v == 0, RECLAIM_WAIT_S)
        try:
            self.receive(request_id, timeout=0.5).release()
            print(f"{request_id}: had landed before the encoder was lost", flush=True)
            redone = False
        except ferry.Error as e:
            if e.code != ferry.ETIMEDOUT:
                raise
            print(f"LOST {request_id}: {e}; its slot is back (pool_bytes_granted 0)", flush=True)
            redone = True
        print("NEED ENCODER", flush=True)
        self.args.encoder = sys.stdin.readline().strip()
        self.call = CLIENTS[self.args.plane](self.args.encoder)
        if redone:
            self.handoff(request_id)
        return redone

    def run_requests(self):
        for i in range(self.args.first, self.args.first + self.args.count):
            request_id = f"{self.args.plane}-req-{i}"
            try:
                self.handoff(request_id)
            except EncoderLost as lost:
                if not self.args.replace_lost_encoder:
                    raise
                if self.encoder_lost(request_id, lost):
                    return
        print(f"verified {self.args.count}")

    def fill_pool(self):
        """Holds messages until the pool is full, then shows both answers to
        a full pool: nowait refuses at once, a waiting send goes through on a
        release."""
        held = []
        for i in range(self.args.count):
            request_id = f"{self.args.plane}-req-{i}"
            reply = self.ask(request_id, nowait=True)
            if not reply.get("ok"):
                break
            held.append(self.receive(request_id))
        if not held or reply.get("code") != ferry.EBUSY:
            sys.exit(f"{request_id}: wanted EBUSY after {len(held)} held messages, got {reply}")
        print(f"{request_id}: pool full with {len(held)} held: {reply['error']}", flush=True)
        replies = []
        asking = threading.Thread(target=lambda: replies.append(self.ask(request_id)))
        asking.start()
        self.wait_stat("pool_senders_waiting", lambda v: v >= 1, WAIT_GAUGE_S, asking.is_alive)
        if replies:
            sys.exit(f"{request_id}: the encoder answered {replies[0]} without waiting for room")
        print(f"{request_id}: the encoder waits for room; releasing {held[0].tag.decode()}", flush=True)
        held.pop(0).release()
        asking.join()
        if not replies or not replies[0].get("ok"):
            sys.exit(f"{request_id}: the waiting send failed: {replies}")
        held.append(self.receive(request_id))
        for msg in held:
            msg.release()
        print(f"verified {i + 1}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--plane", choices=sorted(CLIENTS), required=True)
    ap.add_argument("--encoder", required=True)
    ap.add_argument("--count", type=int, default=3, help="requests (at most, with a fault)")
    ap.add_argument("--min-tokens", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=4096)
    ap.add_argument("--port", type=int, default=0, help="ferry port (a restart keeps its name)")
    ap.add_argument("--first", type=int, default=0, help="number of the first request id")
    ap.add_argument("--pool-mb", type=int, default=80, help="pool size (MiB)")
    fault = ap.add_mutually_exclusive_group()
    fault.add_argument("--fill-pool", action="store_true")
    fault.add_argument("--replace-lost-encoder", action="store_true")
    args = ap.parse_args()
    with ferry.Engine("127.0.0.1", port=args.port) as engine, engine.create_pool(POOL, args.pool_mb << 20) as pool:
        if engine.metrics_port:
            print(f"METRICS {engine.metrics_port}", flush=True)
        prefill = Prefill(args, engine, pool)
        prefill.fill_pool() if args.fill_pool else prefill.run_requests()


if __name__ == "__main__":
    main()
