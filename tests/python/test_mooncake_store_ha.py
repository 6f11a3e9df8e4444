"""test_mooncake_store_ha.py - `mooncake_master --enable_ha` (docs/store.md,
"High availability"): two masters elect a leader through a real etcd on
loopback, a MooncakeDistributedStore given master_server_addr="etcd://..."
puts and gets in a loop while the leader is killed (SIGKILL), finds the
standby by itself, and every later put and get works byte-exact; what was
committed before the kill reads back byte-exact too (the leaders' journal)."""

import os
import re
import subprocess
import sys
import time

from conftest import ferry_tool
from stores import Store, need
from test_mooncake_store import client, page_bytes, tool_or_skip

HERE = os.path.dirname(os.path.abspath(__file__))
FAILOVER_S = 30  # generous: the leaders' 2 s lease runs out well before


def start_ha_master(etcd, cluster):
    """`mooncake_master --enable_ha ...` as the console command runs it; its
    address and role from its ready line."""
    env = dict(os.environ, FERRY_TOOL=tool_or_skip(),
               PYTHONPATH=os.path.join(HERE, "..", "..", "python"))
    code = "import sys; from ferry.__main__ import mooncake_master; sys.exit(mooncake_master())"
    members = etcd.url[len("etcd://"):]
    proc = subprocess.Popen([sys.executable, "-c", code, "--port=0", "--enable_ha",
                             "--ha_backend_type=etcd", "--ha_backend_connstring=" + members,
                             "--ha_lease_ttl=2", "--cluster_id=" + cluster],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True, env=env)
    m = re.match(r"ready master=(\S+) (leader|standby)", proc.stdout.readline())
    assert m, "mooncake_master --enable_ha did not start"
    return proc, m.group(1), m.group(2)


def test_a_client_follows_the_leader_across_a_kill(monkeypatch):
    need("etcd")
    assert ferry_tool()
    monkeypatch.setenv("MC_STORE_CLUSTER_ID", "py-ha")
    etcd = Store("etcd")
    procs, store = [], None
    try:
        a, a_addr, a_role = start_ha_master(etcd, "py-ha")
        procs.append(a)
        b, b_addr, b_role = start_ha_master(etcd, "py-ha")
        procs.append(b)
        assert (a_role, b_role) == ("leader", "standby")
        store = client(etcd.url)
        for i in range(10):
            assert store.put("k%d" % i, page_bytes(i)) == 0
            assert store.get("k%d" % i) == page_bytes(i)
        a.kill()
        a.wait(timeout=30)
        killed, failed = time.monotonic(), 0
        for i in range(10, 30):
            while store.put("k%d" % i, page_bytes(i)) != 0:  # only until a leader serves
                failed += 1
                assert time.monotonic() < killed + FAILOVER_S, "no put after the leader's kill"
                time.sleep(0.02)  # each failed call is one connect; nothing to wait on
            assert store.get("k%d" % i) == page_bytes(i)
        assert failed > 0
        assert etcd.has("mooncake-store/py-ha/master_view")
        for i in range(30):  # the first 10 were committed at the dead leader
            assert store.get("k%d" % i) == page_bytes(i)
    finally:
        if store is not None:
            assert store.close() == 0
        for p in procs:
            if p.poll() is None:
                p.terminate()
                p.wait(timeout=30)
        etcd.stop()


def test_ha_flags_are_checked():
    """--enable_ha needs its etcd; another backend type is refused by name;
    an etcd that does not answer stops the master at start (exit 1)."""
    tool = tool_or_skip()
    from conftest import free_port
    dead = "127.0.0.1:%d" % free_port()
    cases = [(["--enable_ha"], 2, "--ha_backend_connstring"),
             (["--enable_ha", "--ha_backend_type=redis", "--ha_backend_connstring=" + dead], 2,
              "etcd only"),
             (["--enable_ha", "--ha_backend_connstring=" + dead], 1, dead)]
    for flags, code, text in cases:
        done = subprocess.run([tool, "store-master", "--port=0"] + flags, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == code, (flags, done.stderr)
        assert text in done.stderr, (flags, done.stderr)
