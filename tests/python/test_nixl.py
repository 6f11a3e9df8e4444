"""test_nixl.py - the nixl package (NIXL's Python API on ferry).

The agent under test runs in this process; its peer is tests/python/
nixl_peer.py in another process (the prefill side of vLLM's NixlConnector
with host KV buffers). Every byte moved is compared. Covered: config,
plugins and memory types; registration forms; metadata that opens no
connection; WRITE/READ by initialize_xfer and by prepared lists with numpy
indices; notifications after the data; a faithful replay of vLLM's
NixlConnector flow (per-region block lists, READ by index with
b"<request>:<tp>", the prefill freeing blocks on the notification,
heterogeneous block counts, blocks reused); a peer killed mid-transfer
reading "ERR" with its cause; the metadata listener (fetch, send,
invalidate, and what it refuses).
"""

import base64
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import numpy as np
import pytest

import ferry
from conftest import LineReader, free_port
from nixl import nixl_agent, nixl_agent_config
from nixl import _bindings as nb
from nixl._utils import encode_metadata
from nixl_peer import kv_block
from stores import Store, need

HERE = os.path.dirname(os.path.abspath(__file__))
PEER = os.path.join(HERE, "nixl_peer.py")


class Peer:
    """A nixl_peer.py process; .info is its first line."""

    def __init__(self, *args):
        env = dict(os.environ, MC_TCP_BIND_ADDRESS="127.0.0.1")
        env.setdefault("FERRY_LOG", "warn")
        self.proc = subprocess.Popen([sys.executable, PEER] + [str(a) for a in args],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=env)
        self.out = LineReader(self.proc.stdout)
        self.err = LineReader(self.proc.stderr)
        line = self.out.get(60)
        if line is None:
            raise RuntimeError("nixl peer did not start: %s" % self._stderr())
        self.info = json.loads(line)
        self.name = self.info["agent"]
        self.metadata = base64.b64decode(self.info["metadata"])

    def _stderr(self):
        lines = []
        while (line := self.err.get(0.2)):
            lines.append(line)
        return "".join(lines)

    def cmd(self, **kw):
        self.proc.stdin.write(json.dumps(kw) + "\n")
        self.proc.stdin.flush()
        line = self.out.get(60)
        if line is None:
            raise RuntimeError("nixl peer gave no answer to %r: %s" % (kw, self._stderr()))
        return json.loads(line)

    def block(self, region, block):
        return np.frombuffer(base64.b64decode(self.cmd(cmd="dump", region=region,
                                                       block=block)["data"]), dtype=np.uint8)

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        for s in (self.proc.stdout, self.proc.stderr):
            s.close()


@pytest.fixture
def loopback(monkeypatch):
    monkeypatch.setenv("MC_TCP_BIND_ADDRESS", "127.0.0.1")


@pytest.fixture
def agents(loopback):
    """agents(name="decode", **config) -> an agent on loopback, closed at the end."""
    with contextlib.ExitStack() as stack:
        yield lambda name="decode", **conf: stack.enter_context(
            contextlib.closing(nixl_agent(name, nixl_agent_config(**conf))))


@pytest.fixture
def peers():
    """peers(*args) -> a started Peer, stopped at the end of the test."""
    with contextlib.ExitStack() as stack:
        yield lambda *args: stack.enter_context(contextlib.closing(Peer(*args)))


def wait_state(agent, handle, bound_s=60):
    """The state once it is no longer PROC (or PROC at the bound)."""
    deadline = time.monotonic() + bound_s
    state = agent.check_xfer_state(handle)
    while state == "PROC" and time.monotonic() < deadline:
        time.sleep(0.002)
        state = agent.check_xfer_state(handle)
    return state


def poll_until_freed(peer, reqs, bound_s=30):
    freed, deadline = set(), time.monotonic() + bound_s
    while not reqs <= freed and time.monotonic() < deadline:
        freed |= set(peer.cmd(cmd="poll")["freed"])
    return freed


# ---- agent, plugins, memory types -------------------------------------------

def test_config_plugins_and_memory_types(agents):
    with pytest.raises(nb.nixlInvalidParamError, match="non-empty"):
        nixl_agent("")
    with pytest.raises(nb.nixlNotFoundError, match="no such plugin"):
        agents("x", backends=["NOPE"])
    with pytest.raises(nb.nixlNotSupportedError, match="GPUDirect Storage"):
        agents("y", backends=["GDS"])
    bare = agents("bare", backends=[])
    assert bare.backends == {}
    buf = np.zeros(64, dtype=np.uint8)
    with pytest.raises(nb.nixlNotFoundError, match="no backend"):
        bare.register_memory([(buf.ctypes.data, 64, 0, "")], "DRAM")
    a = agents("decode")
    assert a.get_plugin_list() == ["UCX", "LIBFABRIC", "Mooncake", "POSIX"]
    cuda, _ = ferry.cuda_available()
    assert a.get_plugin_mem_types("UCX") == (["DRAM", "VRAM"] if cuda else ["DRAM"])
    assert a.get_backend_mem_types("UCX") == a.get_plugin_mem_types("UCX")
    assert a.get_backend_params("UCX")["ferry_engine"].startswith("127.0.0.1:")
    # as NIXL's: empty answers for a name that is no plugin or no backend here
    assert a.get_plugin_mem_types("UVX") == [] and a.get_plugin_params("UVX") == {}
    assert a.get_backend_params("LIBFABRIC") == {} and a.get_backend_mem_types("UVX") == []
    a.create_backend("LIBFABRIC")  # shares the agent's engine
    assert a.get_backend_params("LIBFABRIC")["ferry_engine"] == a.get_backend_params("UCX")[
        "ferry_engine"]


def test_vram_refused_with_the_reason(agents):
    cuda, why = ferry.cuda_available()
    if cuda:
        pytest.skip("a CUDA device is present: VRAM registers (staged over tcp)")
    a = agents()
    buf = np.zeros(4096, dtype=np.uint8)
    with pytest.raises(nb.nixlNotSupportedError) as e:
        a.register_memory([(buf.ctypes.data, buf.nbytes, 0, "")], "VRAM")
    assert "ferry found none" in str(e.value) and why in str(e.value)
    with pytest.raises(nb.nixlNotSupportedError, match="needs the POSIX backend"):
        a.register_memory([(buf.ctypes.data, buf.nbytes, 0, "")], "FILE")


def descs_refused(caplog, call, reason):
    """NIXL's get_*_descs answer None for what they cannot make; ferry's
    logs the reason as an ERROR."""
    caplog.clear()
    with caplog.at_level("ERROR", logger="nixl"):
        assert call() is None
    assert any(reason in r.getMessage() for r in caplog.records), caplog.text


def test_registration_forms(agents, caplog):
    a = agents()
    bufs = [np.zeros(8192, dtype=np.uint8) for _ in range(4)]
    rows = [(b.ctypes.data, b.nbytes, 0, f"r{i}") for i, b in enumerate(bufs)]
    reg = a.register_memory(rows[:2], "DRAM")
    assert isinstance(reg, nb.nixlRegDList) and len(reg) == 2 and reg[1] == rows[1]
    arr = np.array([r[:3] for r in rows[2:]], dtype=np.uint64)
    reg2 = a.register_memory(arr, "cpu")
    meta = a.get_agent_metadata()
    for b in bufs:
        assert str(b.ctypes.data).encode() in meta
    a.deregister_memory(reg)
    a.deregister_memory(reg2)
    with pytest.raises(nb.nixlNotFoundError, match="not registered"):
        a.deregister_memory(reg)
    descs_refused(caplog, lambda: a.get_reg_descs(rows), "need mem_type")
    descs_refused(caplog, lambda: a.get_xfer_descs(np.zeros((2, 2), dtype=np.uint64), "DRAM"),
                  "N x 3")
    descs_refused(caplog, lambda: a.get_xfer_descs(rows, "DRAM"), "tuple of 3")
    with pytest.raises(KeyError, match="unknown memory type"):
        a.get_xfer_descs(rows, "V-RAM")
    with pytest.raises(nb.nixlInvalidParamError, match="None: the get_reg_descs"):
        a.register_memory(a.get_reg_descs(rows))
    # a failure part way registers nothing: the second range overlaps the first
    with pytest.raises(nb.nixlBackendError, match="descriptor 1"):
        a.register_memory([rows[0], (rows[0][0] + 4096, 8192, 0, "")], "DRAM")
    assert str(rows[0][0]).encode() not in a.get_agent_metadata()


def test_torch_tensors(agents, caplog):
    torch = pytest.importorskip("torch")
    a = agents()
    t = torch.zeros(16, 256, dtype=torch.float16)
    reg = a.register_memory(t)
    assert reg[0][:3] == (t.data_ptr(), t.numel() * 2, 0)
    descs_refused(caplog, lambda: a.get_reg_descs(t.t()), "not contiguous")
    xfer = a.get_xfer_descs([t[0], t[1]])
    assert xfer.descCount() == 2 and xfer.getType() == nb.DRAM_SEG


# ---- metadata and errors ---------------------------------------------------

def test_metadata_opens_no_connection_and_a_dead_peer_is_err(agents):
    gone = agents("gone")
    buf = np.zeros(4096, dtype=np.uint8)
    gone.register_memory([(buf.ctypes.data, 4096, 0, "")], "DRAM")
    md = gone.get_agent_metadata()
    gone.close()  # its port refuses from now on
    a = agents()
    assert a.add_remote_agent(md) == b"gone"  # loads without connecting; bytes, as NIXL
    mine = np.zeros(4096, dtype=np.uint8)
    a.register_memory([(mine.ctypes.data, 4096, 0, "")], "DRAM")
    h = a.initialize_xfer("READ", a.get_xfer_descs([(mine.ctypes.data, 4096, 0)], "DRAM"),
                          a.get_xfer_descs([(buf.ctypes.data, 4096, 0)], "DRAM"), "gone")
    assert a.transfer(h) == "ERR"
    err = a.get_xfer_error(h)
    assert err.cause[0] in (ferry.ESOCKET, ferry.ECLOSED, ferry.EHANDSHAKE), err
    assert "gone" in str(err)
    a.release_xfer_handle(h)
    a.remove_remote_agent("gone")
    with pytest.raises(nb.nixlNotFoundError, match="unknown agent"):
        a.prep_xfer_dlist("gone", [(buf.ctypes.data, 4096, 0)], "DRAM")
    with pytest.raises(nb.nixlInvalidParamError, match="not an agent's metadata"):
        a.add_remote_agent(b"garbage")


def test_serialized_descs(agents):
    """Descriptor lists cross as bytes (NIXL pickles them; ferry's nixl never
    unpickles a peer's bytes: a pickle is refused like any other garbage)."""
    a = agents()
    x = a.get_xfer_descs([(4096, 64, 0), (1 << 63, 8, 1)], "DRAM")
    r = a.get_reg_descs([(4096, 64, 0, "meta")], "DRAM")
    for d in (x, r):
        back = a.deserialize_descs(a.get_serialized_descs(d))
        assert type(back) is type(d) and list(back) == list(d) and back.getType() == d.getType()
    import pickle
    for bad in (pickle.dumps(x.descs), b"", a.get_serialized_descs(x)[:-1]):
        with pytest.raises(nb.nixlInvalidParamError, match="deserialize_descs"):
            a.deserialize_descs(bad)
    with pytest.raises(nb.nixlInvalidParamError, match="get_serialized_descs"):
        a.get_serialized_descs([(1, 2, 3)])

# ---- two processes ---------------------------------------------------------

def test_write_read_initialize_xfer(agents, peers):
    peer = peers("--layers", 1, "--blocks", 8, "--block-bytes", 65536)
    a = agents()
    assert a.add_remote_agent(peer.metadata) == peer.name.encode()
    base = peer.info["regions"][0]
    src = np.random.default_rng(3).integers(0, 256, 8 * 65536, dtype=np.uint8)
    back = np.zeros_like(src)
    a.register_memory([(src.ctypes.data, src.nbytes, 0, ""),
                       (back.ctypes.data, back.nbytes, 0, "")], "DRAM")
    peer.cmd(cmd="prefill", req=1, blocks=8)  # the prefill holds every block for request 1
    # WRITE the whole region in 8 descriptors, notifying "1:1": the prefill frees request 1
    local = [(src.ctypes.data + i * 65536, 65536, 0) for i in range(8)]
    remote = [(base + i * 65536, 65536, 0) for i in range(8)]
    h = a.initialize_xfer("WRITE", a.get_xfer_descs(local, "DRAM"),
                          a.get_xfer_descs(remote, "DRAM"), peer.name, b"1:1")
    assert a.transfer(h) in ("PROC", "DONE")
    assert wait_state(a, h) == "DONE"
    a.release_xfer_handle(h)
    for i in range(8):
        assert np.array_equal(peer.block(0, i), src[i * 65536:(i + 1) * 65536])
    h = a.initialize_xfer("READ", a.get_xfer_descs([(back.ctypes.data, back.nbytes, 0)], "DRAM"),
                          a.get_xfer_descs([(base, back.nbytes, 0)], "DRAM"), peer.name)
    assert a.transfer(h) in ("PROC", "DONE") and wait_state(a, h) == "DONE"
    assert np.array_equal(back, src)
    assert poll_until_freed(peer, {1}) == {1}  # the WRITE's notification, after its data


def test_prepped_lists_numpy_indices_and_notifs(agents, peers):
    peer = peers("--layers", 1, "--blocks", 32, "--block-bytes", 4096)
    a = agents(capture_telemetry=True)
    a.add_remote_agent(peer.metadata)
    ids = peer.cmd(cmd="prefill", req=5, blocks=32)["block_ids"]
    base = peer.info["regions"][0]
    dst = np.zeros(32 * 4096, dtype=np.uint8)
    a.register_memory([(dst.ctypes.data, dst.nbytes, 0, "")], "DRAM")
    lh = a.prep_xfer_dlist("NIXL_INIT_AGENT",
                           [(dst.ctypes.data + i * 4096, 4096, 0) for i in range(32)], "DRAM")
    rh = a.prep_xfer_dlist(peer.name, np.array([(base + i * 4096, 4096, 0) for i in range(32)],
                                               dtype=np.uint64), "DRAM")
    # request 5's j-th block sits in prefill block ids[j]: read it into local block 31 - j
    for li, ri in [(np.arange(16)[::-1] + 16, np.array(ids[:16], dtype=np.int32)),
                   (list(range(15, -1, -1)), ids[16:])]:
        h = a.make_prepped_xfer("READ", lh, li, rh, ri, b"")
        assert a.transfer(h) in ("PROC", "DONE") and wait_state(a, h) == "DONE"
        t = a.get_xfer_telemetry(h)
        assert (t.totalBytes, t.descCount) == (16 * 4096, 16)
        a.release_xfer_handle(h)
    for j in range(32):
        got = dst[(31 - j) * 4096:(32 - j) * 4096]
        assert np.array_equal(got, kv_block(5, 0, j, 4096)), j
    # a handle posts again once DONE; the notification arrives after the data
    h = a.make_prepped_xfer("READ", lh, [0], rh, [ids[0]], b"5:2")
    for _ in range(2):
        assert a.transfer(h) in ("PROC", "DONE") and wait_state(a, h) == "DONE"
    assert poll_until_freed(peer, {5}) == {5}
    with pytest.raises(nb.nixlInvalidParamError, match=r"remote_indices\[0\] = 32"):
        a.make_prepped_xfer("READ", lh, [0], rh, [32])
    with pytest.raises(nb.nixlInvalidParamError, match="local list where a remote"):
        a.make_prepped_xfer("READ", lh, [0], lh, [0])
    with pytest.raises(KeyError, match="READ"):  # as NIXL's lookup of the name
        a.make_prepped_xfer("COPY", lh, [0], rh, [0])
    with pytest.raises(nb.nixlNotFoundError, match="not inside agent prefill"):
        a.prep_xfer_dlist(peer.name, [(base + 32 * 4096, 4096, 0)], "DRAM")
    with pytest.raises(nb.nixlNotFoundError, match="registered memory"):
        a.prep_xfer_dlist("", [(base, 4096, 0)], "DRAM")
    # standalone notifications both ways
    peer.cmd(cmd="add_remote", metadata=base64.b64encode(a.get_agent_metadata()).decode())
    peer.cmd(cmd="send_notif", agent="decode", msg="hello")
    deadline, got = time.monotonic() + 30, {}
    while not got and time.monotonic() < deadline:
        got = a.get_new_notifs()
    assert got == {"prefill": [b"hello"]}
    peer.cmd(cmd="send_notif", agent="decode", msg="req-9 done")
    deadline = time.monotonic() + 30
    while not a.check_remote_xfer_done("prefill", b"req-9") and time.monotonic() < deadline:
        pass
    assert a.notifs.get("prefill") == []
    a.release_dlist_handle(lh)
    a.release_dlist_handle(rh)


def test_vllm_nixl_connector_replay(agents, peers):
    """vLLM's NixlConnector, kv_buffer_device="cpu": both sides register one
    descriptor per KV region; the decode prepares one descriptor per (region,
    block) on each side (index region * num_blocks + block, each side with its
    own num_blocks), READs each request's blocks by index with notif
    b"<req>:<tp>", and the prefill frees (and overwrites) the blocks when the
    notification arrives; freed blocks serve later requests."""
    layers, bb, p_blocks, d_blocks, tp = 4, 2048, 48, 112, 1
    peer = peers("--layers", layers, "--blocks", p_blocks, "--block-bytes", bb)
    regions = 2 * layers
    decode = agents("decode")
    kv = [np.zeros(d_blocks * bb, dtype=np.uint8) for _ in range(regions)]
    decode.register_memory(decode.get_reg_descs([(t.ctypes.data, t.nbytes, 0, "") for t in kv],
                                                "DRAM"))
    remote_name = decode.add_remote_agent(peer.metadata)  # from vLLM's side channel
    local_descs = [(t.ctypes.data + b * bb, bb, 0) for t in kv for b in range(d_blocks)]
    remote_descs = [(base + b * bb, bb, 0) for base in peer.info["regions"]
                    for b in range(p_blocks)]
    src_h = decode.prep_xfer_dlist("NIXL_INIT_AGENT", decode.get_xfer_descs(local_descs, "DRAM"))
    dst_h = decode.prep_xfer_dlist(remote_name, decode.get_xfer_descs(remote_descs, "DRAM"))

    def desc_ids(block_ids, num_blocks):
        ids = np.asarray(block_ids, dtype=np.int64)
        return (np.arange(regions, dtype=np.int64)[:, None] * num_blocks + ids[None, :]).ravel()

    d_free = list(np.random.default_rng(11).permutation(d_blocks))
    expected = {}  # decode block -> (req, j)
    # 99 blocks in all: the decode (112) keeps each request's; the prefill (48) serves
    # each round from blocks the previous rounds' notifications freed
    rounds = [[(10, 5), (11, 17), (12, 1)], [(13, 20), (14, 9)], [(15, 24), (16, 23)]]
    for reqs in rounds:
        handles = {}
        for req, n in reqs:
            remote_ids = peer.cmd(cmd="prefill", req=req, blocks=n)["block_ids"]
            local_ids, d_free[:] = d_free[:n], d_free[n:]
            h = decode.make_prepped_xfer("READ", src_h, desc_ids(local_ids, d_blocks), dst_h,
                                         desc_ids(remote_ids, p_blocks),
                                         notif_msg=f"{req}:{tp}".encode())
            assert decode.transfer(h) in ("PROC", "DONE")
            handles[req] = (h, local_ids)
        for req, (h, local_ids) in handles.items():
            assert wait_state(decode, h) == "DONE", decode.get_xfer_error(h)
            decode.release_xfer_handle(h)
            for j, b in enumerate(local_ids):
                expected[int(b)] = (req, j)
        assert poll_until_freed(peer, set(handles)) == set(handles)
        for r in range(regions):  # every byte of every block, received or not
            for b in range(d_blocks):
                got = kv[r][b * bb:(b + 1) * bb]
                if b in expected:
                    req, j = expected[b]
                    assert np.array_equal(got, kv_block(req, r, j, bb))
                else:
                    assert not got.any()
    assert peer.cmd(cmd="free_count")["free"] == p_blocks  # every prefill block came back
    decode.release_dlist_handle(src_h)
    decode.release_dlist_handle(dst_h)


def test_peer_killed_mid_transfer_is_err(agents, peers):
    """The prefill is stopped (SIGSTOP) so a READ is surely in progress, then
    killed: the handle reads ERR within ferry's bound, with the cause."""
    peer = peers("--layers", 1, "--blocks", 64, "--block-bytes", 1 << 20, "--transports", "tcp")
    a = agents()
    a.add_remote_agent(peer.metadata)
    dst = np.zeros(64 << 20, dtype=np.uint8)
    a.register_memory([(dst.ctypes.data, dst.nbytes, 0, "")], "DRAM")
    base = peer.info["regions"][0]
    lh = a.prep_xfer_dlist("", [(dst.ctypes.data, dst.nbytes, 0)], "DRAM")
    rh = a.prep_xfer_dlist(peer.name, [(base, dst.nbytes, 0)], "DRAM")
    h = a.make_prepped_xfer("READ", lh, [0], rh, [0])
    assert a.transfer(h) in ("PROC", "DONE") and wait_state(a, h) == "DONE"  # connected
    os.kill(peer.info["pid"], signal.SIGSTOP)
    assert a.transfer(h) == "PROC"  # a stopped target cannot answer
    assert a.check_xfer_state(h) == "PROC"
    os.kill(peer.info["pid"], signal.SIGKILL)
    peer.proc.wait(timeout=30)
    assert wait_state(a, h, bound_s=90) == "ERR"
    err = a.get_xfer_error(h)
    assert err is not None and "prefill" in str(err) and err.cause[0] < 0
    a.release_xfer_handle(h)


def test_prefill_restarted_mid_session(agents, peers):
    """vLLM's decode outlives a prefill restart: a READ toward the killed
    prefill reads ERR, its old descriptor lists keep naming the dead engine
    (ERR, never the new process's memory), and once the new incarnation's
    metadata is added (same agent name, another engine) fresh lists READ
    its blocks byte-exact and its notifications free them."""
    bb, blocks = 4096, 8
    decode = agents("decode")
    kv = [np.zeros(blocks * bb, dtype=np.uint8) for _ in range(2)]
    decode.register_memory([(t.ctypes.data, t.nbytes, 0, "") for t in kv], "DRAM")

    def prep(peer):
        assert decode.add_remote_agent(peer.metadata) == b"prefill"
        local = decode.prep_xfer_dlist("", [(t.ctypes.data + b * bb, bb, 0) for t in kv
                                            for b in range(blocks)], "DRAM")
        remote = decode.prep_xfer_dlist("prefill", [(base + b * bb, bb, 0)
                                                    for base in peer.info["regions"]
                                                    for b in range(blocks)], "DRAM")
        return local, remote

    def read(peer, lists, req):
        ids = peer.cmd(cmd="prefill", req=req, blocks=2)["block_ids"]
        idx = [r * blocks + b for r in range(2) for b in ids]
        h = decode.make_prepped_xfer("READ", lists[0], idx, lists[1], idx, f"{req}:1".encode())
        assert decode.transfer(h) in ("PROC", "DONE")
        return h, ids

    first = peers("--layers", 1, "--blocks", blocks, "--block-bytes", bb, "--transports", "tcp")
    old = prep(first)
    h, _ = read(first, old, 1)
    assert wait_state(decode, h) == "DONE"
    decode.release_xfer_handle(h)
    assert poll_until_freed(first, {1}) == {1}
    os.kill(first.info["pid"], signal.SIGKILL)
    first.proc.wait(timeout=30)

    second = peers("--layers", 1, "--blocks", blocks, "--block-bytes", bb, "--transports", "tcp")
    stale = decode.make_prepped_xfer("READ", old[0], [0], old[1], [0])
    assert decode.transfer(stale) in ("PROC", "ERR")
    assert wait_state(decode, stale, bound_s=90) == "ERR"  # the dead engine, not the new one
    decode.release_xfer_handle(stale)
    new = prep(second)
    h, ids = read(second, new, 2)
    assert wait_state(decode, h) == "DONE", decode.get_xfer_error(h)
    decode.release_xfer_handle(h)
    for r in range(2):
        for j, b in enumerate(ids):
            assert np.array_equal(kv[r][b * bb:(b + 1) * bb], kv_block(2, r, j, bb))
    assert poll_until_freed(second, {2}) == {2}


class CancelSeen:
    """Stands in for an _Xfer's ferry batch to tell the test when
    release_xfer_handle has cancelled it (a barrier, not a sleep)."""

    def __init__(self, batch):
        self.batch, self.result, self.done = batch, None, threading.Event()

    def cancel(self):
        self.result = self.batch.cancel()
        self.done.set()
        return self.result

    def __getattr__(self, name):
        return getattr(self.batch, name)


def test_release_in_flight_cancels(agents, peers):
    """release_xfer_handle on a WRITE in progress (its target stopped)
    cancels it: once the target resumes, what had not started never runs
    and the notification is never delivered, while a later transfer with
    its own notification goes through."""
    peer = peers("--layers", 1, "--blocks", 64, "--block-bytes", 1 << 20, "--transports", "tcp")
    for req in (7, 8):
        peer.cmd(cmd="prefill", req=req, blocks=1)
    a = agents()
    a.add_remote_agent(peer.metadata)
    src = np.full(64 << 20, 0x5A, dtype=np.uint8)
    a.register_memory([(src.ctypes.data, src.nbytes, 0, "")], "DRAM")
    base = peer.info["regions"][0]
    lh = a.prep_xfer_dlist("", [(src.ctypes.data + i * (1 << 20), 1 << 20, 0)
                                for i in range(64)], "DRAM")
    rh = a.prep_xfer_dlist(peer.name, [(base + i * (1 << 20), 1 << 20, 0) for i in range(64)],
                           "DRAM")
    first = a.make_prepped_xfer("WRITE", lh, [0], rh, [0])
    assert a.transfer(first) in ("PROC", "DONE") and wait_state(a, first) == "DONE"  # connected
    a.release_xfer_handle(first)
    h = a.make_prepped_xfer("WRITE", lh, list(range(64)), rh, list(range(64)), b"7:1")
    os.kill(peer.info["pid"], signal.SIGSTOP)
    try:
        assert a.transfer(h) == "PROC"  # a stopped target cannot take 64 MiB
        seen = a._xfers[h].batch = CancelSeen(a._xfers[h].batch)
        releaser = threading.Thread(target=a.release_xfer_handle, args=(h,))
        releaser.start()
        assert seen.done.wait(60) and seen.result is True  # cancelled while still pending
    finally:
        os.kill(peer.info["pid"], signal.SIGCONT)
    releaser.join(120)
    assert not releaser.is_alive()  # the parts in flight ended once the target resumed
    with pytest.raises(nb.nixlNotFoundError):
        a.check_xfer_state(h)
    later = a.make_prepped_xfer("WRITE", lh, [63], rh, [63], b"8:1")
    assert a.transfer(later) in ("PROC", "DONE") and wait_state(a, later) == "DONE"
    a.release_xfer_handle(later)
    notifs = []
    deadline = time.monotonic() + 30
    while "8:1" not in notifs and time.monotonic() < deadline:
        notifs += [m for ms in peer.cmd(cmd="poll")["notifs"].values() for m in ms]
    assert "8:1" in notifs and "7:1" not in notifs, notifs


def test_readme_nixl_example_runs(loopback, tmp_path):
    from test_readme import python_blocks

    (block,) = python_blocks("NIXL API")
    calls = [ln for ln in block.splitlines() if ln and not ln.startswith(("import", "from"))]
    assert len(calls) <= 16, calls  # the call shape stays short
    script = tmp_path / "nixl_example.py"
    script.write_text(block)
    env = dict(os.environ, PYTHONPATH=os.path.join(HERE, "..", "..", "python"))
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


# ---- the metadata listener ---------------------------------------------------

def wait_until(check, bound_s=30):
    deadline = time.monotonic() + bound_s
    while not check() and time.monotonic() < deadline:
        time.sleep(0.01)
    return check()


def test_listener_fetch_send_and_invalidate(agents, peers):
    """Metadata moves between listeners with no side channel: the peer's
    listener thread answers a fetch while its process waits on stdin, the
    fetched metadata carries a READ, and send/invalidate load and drop
    this agent's at the peer."""
    peer_port = free_port()
    peer = peers("--layers", 1, "--blocks", 4, "--block-bytes", 4096, "--listen", peer_port)
    a = agents(enable_listen_thread=True, listen_port=free_port())
    assert not a.check_remote_metadata(peer.name)
    a.fetch_remote_metadata(peer.name, "127.0.0.1", peer_port)
    assert wait_until(lambda: a.check_remote_metadata(peer.name))
    peer.cmd(cmd="prefill", req=5, blocks=4)
    base = peer.info["regions"][0]
    back = np.zeros(4 * 4096, dtype=np.uint8)
    a.register_memory([(back.ctypes.data, back.nbytes, 0, "")], "DRAM")
    h = a.initialize_xfer("READ", a.get_xfer_descs([(back.ctypes.data, back.nbytes, 0)], "DRAM"),
                          a.get_xfer_descs([(base, back.nbytes, 0)], "DRAM"), peer.name)
    assert a.transfer(h) in ("PROC", "DONE") and wait_state(a, h) == "DONE"
    a.release_xfer_handle(h)
    assert np.array_equal(back, np.concatenate([peer.block(0, i) for i in range(4)]))

    assert peer.cmd(cmd="known", agent="decode") == {"known": False}
    a.send_local_metadata("127.0.0.1", peer_port)
    assert wait_until(lambda: peer.cmd(cmd="known", agent="decode")["known"])
    a.send_notif(peer.name, b"5:1")  # the peer's own add: its notification path works
    assert poll_until_freed(peer, {5}) == {5}
    a.invalidate_local_metadata("127.0.0.1", peer_port)
    assert wait_until(lambda: not peer.cmd(cmd="known", agent="decode")["known"])


def test_listener_refuses_what_it_must(agents, peers):
    """A listener takes metadata only from the engine it names and an
    invalidation only from the engine the agent is known at; a fetch of
    another name gets no answer; calls without a place to send name it."""
    port = free_port()
    a = agents("decode", enable_listen_thread=True, listen_port=port)
    b = agents("b", enable_listen_thread=True, listen_port=free_port())
    mallory = agents("mallory")  # no listener of its own
    buf = np.zeros(4096, dtype=np.uint8)
    b.register_memory([(buf.ctypes.data, buf.nbytes, 0, "")], "DRAM")
    b.send_local_metadata("127.0.0.1", port)
    assert wait_until(lambda: a.check_remote_metadata("b"))
    real = a.get_xfer_descs([(buf.ctypes.data, 4096, 0)], "DRAM")
    fake = a.get_xfer_descs([(0x10000, 4096, 0)], "DRAM")
    assert a.check_remote_metadata("b", real) and not a.check_remote_metadata("b", fake)
    # metadata of b at b's engine with other regions, sent by mallory's engine: dropped
    eng = mallory._eng("test")
    forged = encode_metadata("b", b._eng("test").name, [(0x10000, 4096, 0, "")])
    eng.send(f"127.0.0.1:{port}", "nixl.listener", b"metadata", forged)
    # an invalidation of b from mallory's engine: dropped
    eng.send(f"127.0.0.1:{port}", "nixl.listener", b"invalidate", b"b")
    eng.send(f"127.0.0.1:{port}", "nixl.listener", b"fetch", b"somebody-else")
    eng.send(f"127.0.0.1:{port}", "nixl.listener", b"bogus", b"\xff" * 100)
    # mallory's own metadata is taken (it names mallory's engine); a marker
    # that the listener got past the messages above
    mallory.send_local_metadata("127.0.0.1", port)
    assert wait_until(lambda: a.check_remote_metadata("mallory"))
    assert a.check_remote_metadata("b", real) and not a.check_remote_metadata("b", fake)
    b.invalidate_local_metadata("127.0.0.1", port)
    assert wait_until(lambda: not a.check_remote_metadata("b"))
    with pytest.raises(nb.nixlNotAllowedError, match="enable_listen_thread"):
        mallory.fetch_remote_metadata("decode", "127.0.0.1", port)
    with pytest.raises(nb.nixlInvalidParamError, match="no ip_addr"):
        a.send_local_metadata()
    with pytest.raises(nb.nixlBackendError, match="listener at 127.0.0.1"):
        a.send_local_metadata("127.0.0.1", free_port())  # nobody listens there
    with pytest.raises(nb.nixlInvalidParamError, match="listen_port"):
        nixl_agent("c", nixl_agent_config(backends=[], enable_listen_thread=True,
                                          listen_port=port + 1)).create_backend(
            "UCX", {"ferry_port": port + 2})


# ---- etcd (NIXL_ETCD_ENDPOINTS) ----------------------------------------------

@pytest.fixture
def etcd(monkeypatch):
    """A real etcd on loopback, named by NIXL_ETCD_ENDPOINTS for the test."""
    need("etcd")
    store = Store("etcd")
    monkeypatch.setenv("NIXL_ETCD_ENDPOINTS", "http://127.0.0.1:%d" % store.port)
    monkeypatch.setenv("NIXL_ETCD_NAMESPACE", "/ferry-test/agents/")
    yield store
    store.stop()


def etcd_put(store, key, value):
    body = json.dumps({"key": base64.b64encode(key.encode()).decode(),
                       "value": base64.b64encode(value).decode()}).encode()
    req = urllib.request.Request("http://127.0.0.1:%d/v3/kv/put" % store.port, data=body,
                                 method="POST")
    urllib.request.urlopen(req, timeout=10).read()


def test_etcd_publish_fetch_and_invalidate(agents, etcd):
    """Without ip_addr, metadata goes through etcd in NIXL's key layout: a
    fetch made before the peer publishes waits for it, the fetched metadata
    carries a READ, partial metadata goes under its label, and an agent
    that invalidates itself is forgotten by the agents that fetched it."""
    a, b = agents("prefill"), agents("decode")
    src = np.arange(8192, dtype=np.uint8) % 251
    a.register_memory([(src.ctypes.data, src.nbytes, 0, "")], "DRAM")
    b.fetch_remote_metadata("prefill")  # before a publishes: the fetch waits for the key
    a.send_local_metadata()
    assert etcd.has("/ferry-test/agents//prefill/metadata")
    assert wait_until(lambda: b.check_remote_metadata("prefill"))
    dst = np.zeros_like(src)
    b.register_memory([(dst.ctypes.data, dst.nbytes, 0, "")], "DRAM")
    h = b.initialize_xfer("READ", b.get_xfer_descs([(dst.ctypes.data, dst.nbytes, 0)], "DRAM"),
                          b.get_xfer_descs([(src.ctypes.data, src.nbytes, 0)], "DRAM"),
                          "prefill")
    assert b.transfer(h) in ("PROC", "DONE") and wait_state(b, h) == "DONE"
    b.release_xfer_handle(h)
    assert np.array_equal(src, dst)

    part = b.get_reg_descs([(dst.ctypes.data, dst.nbytes, 0, "")], "DRAM")
    with pytest.raises(nb.nixlInvalidParamError, match="needs a label"):
        b.send_partial_agent_metadata(part, True)
    b.send_partial_agent_metadata(part, True, label="kv")
    a.fetch_remote_metadata("decode", label="kv")
    descs = a.get_xfer_descs([(dst.ctypes.data, dst.nbytes, 0)], "DRAM")
    assert wait_until(lambda: a.check_remote_metadata("decode", descs))

    a.invalidate_local_metadata()
    assert not etcd.has("/ferry-test/agents//prefill/metadata")
    assert wait_until(lambda: not b.check_remote_metadata("prefill"))
    assert a.check_remote_metadata("decode")  # only the invalidated agent is forgotten


def test_etcd_watch_takes_the_endpoint_that_answers_and_outlives_a_restart(agents, etcd,
                                                                           monkeypatch):
    """A reader's watch opens on the first endpoint of NIXL_ETCD_ENDPOINTS
    that answers, not only the first listed; and when its etcd dies and
    comes back, the watch is made again, so an agent invalidated after the
    restart is still forgotten."""
    monkeypatch.setenv("NIXL_ETCD_ENDPOINTS", "http://127.0.0.1:%d,http://127.0.0.1:%d"
                       % (free_port(), etcd.port))
    a, b = agents("prefill"), agents("decode")
    a.send_local_metadata()
    b.fetch_remote_metadata("prefill")
    assert wait_until(lambda: b.check_remote_metadata("prefill"))
    a.invalidate_local_metadata()  # seen by the watch on the second endpoint
    assert wait_until(lambda: not b.check_remote_metadata("prefill"))

    a.send_local_metadata()
    b.fetch_remote_metadata("prefill")
    assert wait_until(lambda: b.check_remote_metadata("prefill"))
    etcd.restart()
    a.invalidate_local_metadata()
    assert wait_until(lambda: not b.check_remote_metadata("prefill"))


def test_etcd_refuses_what_it_must(agents, etcd, caplog, monkeypatch):
    """Metadata under one agent's key that names another is not loaded; an
    unreachable etcd is an error naming it."""
    a, b = agents("prefill"), agents("decode")
    etcd_put(etcd, "/ferry-test/agents//mallory/metadata", a.get_agent_metadata())
    b.fetch_remote_metadata("mallory")
    assert wait_until(lambda: any("names agent 'prefill'" in r.getMessage()
                                  for r in caplog.records if r.levelname == "ERROR")), caplog.text
    assert not b.check_remote_metadata("mallory") and not b.check_remote_metadata("prefill")
    b.fetch_remote_metadata("prefill")  # the worker goes on after a refused one
    a.send_local_metadata()
    assert wait_until(lambda: b.check_remote_metadata("prefill"))
    monkeypatch.setenv("NIXL_ETCD_ENDPOINTS", "http://127.0.0.1:%d" % free_port())
    c = agents("c")
    with pytest.raises(nb.nixlBackendError, match="no etcd endpoint answered"):
        c.send_local_metadata()
    monkeypatch.setenv("NIXL_ETCD_ENDPOINTS", "https://127.0.0.1:1")
    with pytest.raises(nb.nixlInvalidParamError, match="not http://host:port"):
        agents("d").send_local_metadata()

