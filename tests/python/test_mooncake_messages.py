"""test_mooncake_messages.py - what the mooncake.engine drop-in tells its
user: causes in the caller's terms (its buffer, its length, its batch id),
the WARNING of a protocol fallback (once, naming what was asked for; for
rdma/efa one line saying what libfabric found), last_error() of the last
call only, a closed engine named, the
refusal of Ascend NPUs and of read-only buffers as regions, and a
device_name that names no device."""

import ctypes
import logging
import os
import re

import pytest

import ferry
from conftest import make_engine
from mooncake import engine as mc
from mooncake.engine import TransferEngine


def warnings_of(caplog):
    return [r.getMessage() for r in caplog.records
            if r.name == "mooncake.engine" and r.levelno == logging.WARNING]


@pytest.fixture
def pair():
    """An initiator and a target drop-in engine, with 4 KiB registered at the target."""
    a, b = make_engine(), make_engine()
    peer = b.allocate_managed_buffer(4096)
    assert peer, b.last_error()
    yield a, b, "127.0.0.1:%d" % b.get_rpc_port(), peer
    a.close()
    b.close()


def test_unregistered_local_buffer_in_user_terms(pair):
    a, _, target, peer = pair
    buf = ctypes.create_string_buffer(4096)
    addr = ctypes.addressof(buf)
    assert a.transfer_sync_write(target, addr, peer, 4096) == -3
    assert ("local buffer %#x (4096 bytes) is not registered with this engine: call "
            "register_memory first" % addr) in a.last_error()
    assert "docs/errors.md" in a.last_error()
    assert "(nil)" not in a.last_error() and "op 1" not in a.last_error()
    assert a.batch_transfer_sync_write(target, [0], [peer], [4096]) == -1
    assert "local buffer address is 0 (NULL)" in a.last_error()


def test_unregistered_peer_buffer_in_user_terms(pair):
    a, _, target, peer = pair
    addr = a.allocate_managed_buffer(4096)
    assert a.transfer_sync_read(target, addr, peer + (1 << 30), 4096) == -3
    assert ("peer buffer %#x (4096 bytes) is not registered at %s"
            % (peer + (1 << 30), target)) in a.last_error()


def test_unknown_batch_id_is_not_a_metadata_error(engine):
    assert engine.get_batch_transfer_status([424242]) == -1
    assert "batch id 424242 not found" in engine.last_error()
    assert engine.last_error_code() == -1
    assert engine.transfer_check_status(424242) == -1
    assert "batch id 424242 not found" in engine.last_error()


def test_bytes_refused_as_region(engine):
    blob = bytes(4096)
    assert engine.register_memory(blob, len(blob)) == -1
    assert "read-only bytes object cannot be registered" in engine.last_error()
    assert engine.register_memory(bytearray(4096), 4096) == 0


@pytest.mark.parametrize("protocol,hostname", [("ascend", "127.0.0.1"),
                                               ("ascend", "127.0.0.1:15000:npu_3"),
                                               ("rdma", "127.0.0.1:15000:npu_0")])
def test_ascend_refused_by_name(caplog, protocol, hostname):
    te = TransferEngine()
    assert te.initialize(hostname, "P2PHANDSHAKE", protocol, "") == -303
    assert "Ascend NPUs are not supported by ferry" in te.last_error()
    assert te.get_engine() is None
    assert not any("resolve" in m or "host name" in m for m in warnings_of(caplog))


@pytest.mark.parametrize("protocol,device", [("rdma", "RDMA"), ("efa", "EFA")])
def test_fabric_fallback_is_one_clear_line(caplog, protocol, device):
    if os.environ.get("FERRY_FABRIC_PROVIDER"):
        pytest.skip("a forced fabric provider serves %s: nothing falls back" % protocol)
    caplog.set_level(logging.INFO)
    te = TransferEngine()
    try:
        assert te.initialize("127.0.0.1", "P2PHANDSHAKE", protocol, "") == 0
        assert te.initialize("127.0.0.1", "P2PHANDSHAKE", protocol, "") == -1  # refused
    finally:
        te.close()
    ferry.flush_log()
    about = [r for r in caplog.records
             if re.search(r"device|fabric|fi_getinfo", r.getMessage(), re.I)]
    assert len(about) == 1, [r.getMessage() for r in about]
    line = about[0].getMessage()
    assert about[0].levelno == logging.WARNING and about[0].name == "mooncake.engine", line
    assert line.startswith("protocol %r: no %s device here (" % (protocol, device)), line
    assert "); using tcp/shm; pass protocol 'tcp' to choose this" in line, line
    assert "engine start failed" not in line, line


@pytest.mark.parametrize("protocol,named", [("nvlink", "NVLink"), ("hip", "AMD HIP IPC")])
def test_fallback_warns_once_naming_the_protocol(caplog, protocol, named):
    te = TransferEngine()
    try:
        assert te.initialize("127.0.0.1", "P2PHANDSHAKE", protocol, "") == 0
    finally:
        te.close()
    fallbacks = [m for m in warnings_of(caplog) if "which ferry does not provide" in m]
    assert len(fallbacks) == 1, fallbacks
    assert named in fallbacks[0] and "orders of magnitude" in fallbacks[0]


def test_rdma_alone_without_a_device_fails(monkeypatch):
    """FERRY_TRANSPORTS=fabric leaves nothing to fall back to: initialize
    fails, naming libfabric's answer, instead of taking tcp or shm."""
    if os.environ.get("FERRY_FABRIC_PROVIDER"):
        pytest.skip("a forced fabric provider serves rdma: nothing falls back")
    monkeypatch.setenv("FERRY_TRANSPORTS", "fabric")
    te = TransferEngine()
    try:
        assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "rdma", "") == -201, te.last_error()
        assert "fabric provider verbs;ofi_rxm cannot start" in te.last_error(), te.last_error()
    finally:
        te.close()


def test_rdma_left_out_by_ferry_transports_says_so(caplog, monkeypatch):
    monkeypatch.setenv("FERRY_TRANSPORTS", "tcp,shm")
    te = TransferEngine()
    try:
        assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "rdma", "mlx5_0") == 0
    finally:
        te.close()
    lines = warnings_of(caplog)
    assert any("FERRY_TRANSPORTS leaves ferry's fabric transport out" in m for m in lines), lines
    assert any("not used: FERRY_TRANSPORTS=tcp,shm leaves the fabric transport out" in m
               for m in lines), lines
    assert not [m for m in lines if "does not provide" in m or "uses no RDMA" in m], lines


def test_last_error_is_cleared_by_a_successful_call(pair):
    a, _, target, peer = pair
    assert a.transfer_sync_write(target, 0, peer, 16) < 0
    assert a.last_error() and a.last_error_code() < 0
    assert a.send_probe(target) == 0
    assert a.last_error() is None and a.last_error_code() == 0


def test_a_call_on_a_closed_engine_names_it():
    te = make_engine()
    name = te.get_engine().name
    te.close()
    assert te.send_probe("127.0.0.1:1") < 0
    assert "TransferEngine %s is closed" % name in te.last_error(), te.last_error()


def test_tcp_does_not_warn(caplog):
    te = make_engine(protocol="tcp")
    te.close()
    assert not [m for m in warnings_of(caplog) if "does not provide" in m]


def test_bogus_device_name_warns_with_devices(caplog, tmp_path, monkeypatch):
    (tmp_path / "mlx5_0").mkdir()
    (tmp_path / "mlx5_1").mkdir()
    monkeypatch.setattr(mc, "_RDMA_SYSFS", str(tmp_path))
    for device_name, warned in (("mlx5_9", True), ("mlx5_0,mlx5_1", False),
                                ('{"0": "mlx5_0", "1": "mlx5_7"}', True)):
        caplog.clear()
        te = TransferEngine()
        assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", device_name) == 0
        te.close()
        msgs = [m for m in warnings_of(caplog) if "device_name" in m]
        assert bool(msgs) == warned, (device_name, msgs)
        if warned:
            assert "devices here: mlx5_0, mlx5_1" in msgs[0]
            assert "not used: it picks the fabric transport's NIC for protocol 'rdma' or " \
                   "'efa' only, not 'tcp'" in msgs[0], msgs[0]
