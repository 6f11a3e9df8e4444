"""test_mooncake_metadata.py - the mooncake.engine drop-in against real redis
and etcd stores (Debian's redis-server and etcd), started by the test on
loopback ports it picks, with data under a temporary folder, and killed at
the end even when the test fails.

Two processes exchange data through a segment name with each store form
Mooncake accepts (redis://, etcd://, bare host:port, MC_REDIS_PASSWORD); a
target killed with SIGKILL and restarted under the same name is reached
again every time; a killed target's keys disappear within the lease."""

import time

import pytest

from conftest import free_port, make_engine
from stores import Store, need

TTL_ENV = {"FERRY_METADATA_TTL_MS": "3000", "MC_TCP_BIND_ADDRESS": "127.0.0.1"}


@pytest.fixture(params=["redis", "etcd"])
def store(request):
    need("redis-server" if request.param == "redis" else "etcd")
    s = Store(request.param)
    yield s
    s.stop()


def wait_until(pred, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)  # the store expires keys on its own clock
    return False


def exchange(te, name, tgt, seed):
    data = bytes((seed + i) % 251 for i in range(4096))
    addr = te.allocate_managed_buffer(4096)
    te.write_bytes_to_buffer(addr, data, len(data))
    assert te.transfer_sync_write(name, addr, tgt.addr, len(data)) == 0, te.last_error()
    assert tgt.dump(0, len(data)) == data
    te.free_managed_buffer(addr, 4096)


@pytest.mark.timeout_s(120)
def test_segment_name_exchange_and_restarts(store, start_target, monkeypatch):
    for k, v in TTL_ENV.items():
        monkeypatch.setenv(k, v)
    te = make_engine(hostname="py-initiator", server=store.url)
    try:
        for i in range(5):
            tgt = start_target("--metadata", store.url, "--name", "py-target", "--size", 1 << 16,
                               env=TTL_ENV)
            assert tgt.session == "py-target"
            exchange(te, "py-target", tgt, i)
            tgt.kill()  # SIGKILL: its keys stay until the lease runs out
        limit = 3.0 + 10  # the ttl, and generous on a busy host
        assert wait_until(lambda: not store.has("mooncake/rpc_meta/py-target"), limit)
    finally:
        te.close()
    assert not store.has("mooncake/rpc_meta/py-initiator")  # unpublished at close


@pytest.mark.timeout_s(60)
def test_bare_host_port_is_etcd(start_target, monkeypatch):
    need("etcd")
    s = Store("etcd")
    try:
        bare = "127.0.0.1:%d" % s.port
        monkeypatch.setenv("MC_TCP_BIND_ADDRESS", "127.0.0.1")
        tgt = start_target("--metadata", bare, "--name", "bare-target", "--size", 1 << 16,
                           env=TTL_ENV)
        te = make_engine(hostname="bare-initiator", server=bare)
        try:
            exchange(te, "bare-target", tgt, 3)
        finally:
            te.close()
    finally:
        s.stop()


@pytest.mark.timeout_s(60)
def test_redis_password_from_environment(monkeypatch, caplog):
    need("redis-server")
    from mooncake.engine import TransferEngine
    s = Store("redis", password="pw-right")
    try:
        monkeypatch.setenv("MC_TCP_BIND_ADDRESS", "127.0.0.1")
        te = TransferEngine()
        assert te.initialize("pw-engine", s.url, "tcp", "") < 0
        assert "requires authentication" in te.last_error()
        monkeypatch.setenv("MC_REDIS_PASSWORD", "pw-wrong")
        te = TransferEngine()
        assert te.initialize("pw-engine", s.url, "tcp", "") < 0
        assert "refused the credentials" in te.last_error()
        monkeypatch.setenv("MC_REDIS_PASSWORD", "pw-right")
        te = make_engine(hostname="pw-engine", server=s.url)
        assert s.has("mooncake/rpc_meta/pw-engine")  # published with the password
        te.close()
    finally:
        s.stop()


@pytest.mark.parametrize("form", ["redis://127.0.0.1:%d", "etcd://127.0.0.1:%d", "127.0.0.1:%d"])
def test_unreachable_store_fails_initialize(form):
    from mooncake.engine import TransferEngine
    server = form % free_port()
    te = TransferEngine()
    assert te.initialize("127.0.0.1", server, "tcp", "") < 0
    assert server.split("//")[-1] in te.last_error()
    assert te.get_engine() is None
    assert te.get_rpc_port() == -1
