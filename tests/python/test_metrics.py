"""test_metrics.py - ferry.Engine.stats(), the /metrics endpoint an engine
inside a Python process serves with FERRY_METRICS_PORT, the drop-in's
get_stats(), and `ferry serve --metrics-port` with its exit summary: counters
move by exactly the bytes moved."""

import re
import signal
import subprocess
import urllib.error
import urllib.request

import pytest

import ferry
from conftest import ferry_engine_pair, ferry_tool
from mooncake.engine import TransferEngine


@pytest.fixture
def pair(monkeypatch):
    monkeypatch.setenv("FERRY_METRICS_PORT", "0")  # any free port, on 127.0.0.1
    yield from ferry_engine_pair()


def scrape(engine):
    url = "http://127.0.0.1:%d/metrics" % engine.metrics_port
    with urllib.request.urlopen(url, timeout=10) as r:
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return r.read().decode()


def value(text, series):
    m = re.search(r"^%s (\S+)$" % re.escape(series), text, re.M)
    return int(m.group(1)) if m else 0


def test_stats_and_endpoint_move_by_the_bytes_moved(pair):
    a, b = pair
    src, dst = bytearray(300007), bytearray(300007)
    a.register(src)
    daddr = b.register(dst)
    before = a.stats()
    a.write(b.name, src, daddr)
    a.read(b.name, src, daddr, 4099)
    s = a.stats()
    assert s["bytes"]["write"] - before["bytes"]["write"] == 300007
    assert s["bytes"]["read"] - before["bytes"]["read"] == 4099
    assert s["ops"] == {"read": 1, "write": 1}
    (link,) = s["links"]
    assert (link["peer"], link["transport"]) == (b.name, "tcp")
    assert link["connections_opened"] >= 1
    assert s["sync_latency"]["count"] == 2
    assert sum(n for _, n in s["sync_latency"]["buckets"]) == 2
    assert s["batches_in_flight"] == 0 and s["errors"] == {}
    assert b.stats()["served_bytes"] == {"read": 4099, "write": 300007}
    accepted = b.stats()["connections_accepted"]
    assert accepted["tcp"] >= 1 and accepted["shm"] == accepted["fabric"] == 0, accepted
    assert b.stats()["registered_bytes"] == 300007

    text = scrape(a)
    peer = 'peer="%s",transport="tcp"' % b.name
    assert value(text, 'ferry_bytes_total{op="write",%s}' % peer) == 300007
    assert value(text, 'ferry_bytes_total{op="read",%s}' % peer) == 4099
    assert value(scrape(b), 'ferry_served_bytes_total{op="write",transport="tcp"}') == 300007
    assert "# TYPE ferry_bytes_total counter" in a.stats_text()

    with pytest.raises(ferry.Error) as e:
        a.write(b.name, src, daddr + len(dst), 16)
    assert e.value.code == ferry.ENOTREG
    assert a.stats()["errors"] == {ferry.ENOTREG: 1}


def test_endpoint_is_opt_in_and_answers_only_metrics(pair, monkeypatch):
    a, _ = pair
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen("http://127.0.0.1:%d/" % a.metrics_port, timeout=10)
    assert e.value.code == 404
    monkeypatch.delenv("FERRY_METRICS_PORT")
    with ferry.Engine("127.0.0.1", transports="tcp") as c:
        assert c.metrics_port == 0
    monkeypatch.setenv("FERRY_METRICS_PORT", "http")
    with pytest.raises(ferry.Error) as e:
        ferry.Engine("127.0.0.1", transports="tcp")
    assert e.value.code == ferry.EINVAL and 'FERRY_METRICS_PORT="http"' in e.value.detail


def test_drop_in_get_stats(pair):
    _, b = pair
    te = TransferEngine()
    assert te.get_stats() == {}
    assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    try:
        buf = te.allocate_managed_buffer(8192)
        daddr = b.alloc(8192)
        assert te.transfer_sync_write(b.name, buf, daddr, 8192) == 0
        s = te.get_stats()
        assert s["bytes"]["write"] == 8192 and s["ops"]["write"] == 1
    finally:
        te.close()


def test_serve_metrics_port_and_exit_summary(tmp_path):
    tool = ferry_tool()
    if not tool:
        pytest.skip("ferry tool not found (set FERRY_TOOL or build build/ferry)")
    err = open(tmp_path / "stderr", "w+")
    proc = subprocess.Popen([tool, "serve", "--size", "1M", "--protocol", "tcp,shm",
                             "--metrics-port", "0"], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        ready = proc.stdout.readline()
        m = re.search(r"target=(\S+) addr=0x([0-9a-f]+) .* metrics=(\d+)", ready)
        assert m, ready
        target, addr, port = m.group(1), int(m.group(2), 16), int(m.group(3))
        with ferry.Engine("127.0.0.1", transports="tcp") as e:
            src = bytearray(70001)
            e.register(src)
            e.write(target, src, addr)
            e.read(target, src, addr, 513)
        with ferry.Engine("127.0.0.1", transports="shm") as e:  # one-sided: not served
            src = bytearray(4096)
            e.register(src)
            e.write(target, src, addr)
            assert e.peer_transport(target) == ferry.TRANSPORT_SHM
        url = "http://127.0.0.1:%d/metrics" % port
        with urllib.request.urlopen(url, timeout=10) as r:
            text = r.read().decode()
        assert value(text, 'ferry_served_bytes_total{op="write",transport="tcp"}') == 70001
        assert value(text, 'ferry_served_bytes_total{op="read",transport="tcp"}') == 513
        assert value(text, 'ferry_connections_accepted_total{transport="shm"}') == 1
        assert value(text, 'ferry_connections_accepted_total{transport="tcp"}') >= 1
        assert "counted only by their initiators" in text
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    err.seek(0)
    summary = err.read()
    m = re.search(r"served 70001 bytes written in 1 requests, 513 bytes read in 1 requests "
                  r"over tcp; accepted ([1-9]\d*) tcp data connections, 1 shm links \(shm and "
                  r"fabric transfers are one-sided: only their initiators count them\); 0 errors",
                  summary)
    assert m, summary
