"""common.py - what the encoder and the prefill of the EPD example share:
the embedding a request id stands for, and the three control planes.

The control plane carries only {"request_id", "prefill"} (the prefill's
ferry engine name), and "nowait" when the prefill wants a full pool
reported at once; the embedding itself goes through ferry into the
prefill's receive pool, tagged with the request id. A client call returns
the encoder's JSON reply, or raises EncoderLost when the encoder is gone."""

import hashlib
import json

import numpy as np

HIDDEN = 4096
POOL = "embeddings"


def embedding(request_id, max_tokens=4096, min_tokens=256):
    """The float16 embedding of a request: min_tokens..max_tokens tokens x
    4096, random but fixed by the request id, so the prefill can check every
    byte. Random bits with the exponent's top bit cleared: finite values in
    (-2, 2), and cheap to make (the tests make hundreds of MiB of them)."""
    seed = int.from_bytes(hashlib.sha256(request_id.encode()).digest()[:8], "little")
    tokens = min_tokens + seed % (max_tokens - min_tokens + 1)
    bits = np.frombuffer(np.random.default_rng(seed).bytes(tokens * HIDDEN * 2), dtype=np.uint16)
    return (bits & 0xBFFF).view(np.float16).reshape(tokens, HIDDEN)


def encode_request(request_id, prefill, nowait=False):
    return json.dumps({"request_id": request_id, "prefill": prefill, "nowait": nowait}).encode()


def decode_request(body):
    req = json.loads(body)
    return req["request_id"], req["prefill"], req.get("nowait", False)


class EncoderLost(Exception):
    """The control plane lost the encoder (it died or went away) mid-call."""


# ---- the control planes: serve(handler) on the encoder, a client on the prefill


def serve_http(handler):
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            status, reply = handler(body)
            self.send_response(status)
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server.server_address[1]


def http_client(address):
    import urllib.error
    import urllib.request

    def call(body):
        req = urllib.request.Request(f"http://{address}/encode", data=body, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.read()
        except urllib.error.HTTPError as e:  # the encoder's reason, in its body
            return e.read()
        except (urllib.error.URLError, ConnectionError) as e:
            raise EncoderLost(f"http {address}: {e}") from e

    return call


GRPC_METHOD = "/epd.Encoder/Encode"


def serve_grpc(handler):
    """A one-method service with grpc's generic handlers: no generated code."""
    from concurrent import futures

    import grpc

    def encode(body, context):
        status, reply = handler(body)
        if status != 200:
            context.abort(grpc.StatusCode.INTERNAL, reply.decode())
        return reply

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    rpc = grpc.unary_unary_rpc_method_handler(encode)  # bytes in, bytes out
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("epd.Encoder", {"Encode": rpc}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    serve_grpc.server = server  # kept alive with the process
    return port


def grpc_client(address):
    import grpc

    channel = grpc.insecure_channel(address)
    stub = channel.unary_unary(GRPC_METHOD)

    def call(body):
        try:
            return stub(body, timeout=60)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.INTERNAL:  # the encoder's reason
                return e.details().encode()
            raise EncoderLost(f"grpc {address}: {e.code().name}: {e.details()}") from e

    return call


def serve_zmq(handler):
    import threading

    import zmq

    sock = zmq.Context.instance().socket(zmq.REP)
    port = sock.bind_to_random_port("tcp://127.0.0.1")

    def loop():
        while True:
            sock.send(handler(sock.recv())[1])

    threading.Thread(target=loop, daemon=True).start()
    return port


def zmq_client(address):
    import zmq

    sock = zmq.Context.instance().socket(zmq.REQ)
    sock.connect(f"tcp://{address}")
    sock.setsockopt(zmq.RCVTIMEO, 60000)

    def call(body):
        sock.send(body)
        try:
            return sock.recv()
        except zmq.Again as e:  # REQ sees no peer death, only the silence
            raise EncoderLost(f"zmq {address}: no reply in 60 s") from e

    return call


SERVERS = {"http": serve_http, "grpc": serve_grpc, "zmq": serve_zmq}
CLIENTS = {"http": http_client, "grpc": grpc_client, "zmq": zmq_client}
