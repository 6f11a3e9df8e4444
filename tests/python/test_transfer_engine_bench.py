"""test_transfer_engine_bench.py - `transfer_engine_bench`, Mooncake's transfer
engine benchmark on ferry, as operators run it: a `--mode=target` process and
a `--mode=initiator` one, started through the console command's function
(ferry.__main__.transfer_engine_bench), over tcp on 127.0.0.1, found by
P2PHANDSHAKE address and through the HTTP metadata server. The initiator's
result line is Mooncake's, and what it counts is what the target served (its
Prometheus counters, by operation). Bad flags and an unknown segment fail
with the flag or the segment named. Only 127.0.0.1 is used.
"""

import logging
import os
import re
import subprocess
import sys
import urllib.request

import pytest

import ferry
from conftest import ROOT, LineReader, ferry_tool

PYTHON_DIR = os.path.join(ROOT, "python")
RESULT = re.compile(r"^Test completed: duration (\d+\.\d\d), batch count (\d+), "
                    r"throughput (\d+\.\d+) (\w+)/s$", re.M)
# A short run: 2 threads of 4 entries of 64 KiB in a 4 MiB buffer.
RUN = ["--protocol=tcp", "--duration=1", "--threads=2", "--batch_size=4", "--block_size=65536",
       "--buffer_size=4M"]
BLOCK_BYTES = 4 * 65536


def bench_argv(*flags):
    code = ("import sys; from ferry.__main__ import transfer_engine_bench; "
            "sys.exit(transfer_engine_bench())")
    return [sys.executable, "-c", code] + list(flags)


def bench_env(**extra):
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR, FERRY_LOG="warn")
    env.update(extra)
    return env


def initiator(*flags, **env):
    return subprocess.run(bench_argv("--mode=initiator", *flags), env=bench_env(**env),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)


class BenchTarget:
    """A `transfer_engine_bench --mode=target` process serving its metrics."""

    def __init__(self, *flags, **env):
        self.proc = subprocess.Popen(
            bench_argv("--mode=target", "--protocol=tcp", "--buffer_size=4M", *flags),
            env=bench_env(FERRY_LOG="info", FERRY_METRICS_PORT="0", **env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.err, self.said = LineReader(self.proc.stderr), []
        try:
            self._wait_ready()
        except BaseException:
            print(self.stop())
            raise

    def _wait_ready(self):
        """The ready line, then the metrics endpoint's INFO line."""
        ready = LineReader(self.proc.stdout).get(30) or ""
        m = re.match(r"ready segment_id=(\S+) buffer_size=4194304( vram)?$", ready)
        assert m, ready
        self.segment, self.vram = m.group(1), bool(m.group(2))
        self.metrics = None
        while self.metrics is None:
            line = self.err.get(30)
            assert line is not None, "the target named no metrics endpoint"
            self.said.append(line)
            found = re.search(r"serves metrics on (http://\S+/metrics)", line)
            self.metrics = found and found.group(1)

    def served(self, metric="ferry_served_bytes_total"):
        """Bytes the target served (or staged: ferry_staged_bytes_total), by
        operation."""
        with urllib.request.urlopen(self.metrics, timeout=10) as resp:
            text = resp.read().decode()
        out = {"read": 0, "write": 0}
        for op, n in re.findall(r'^%s\{op="(\w+)"[^}]*\} (\d+)$' % metric, text, re.M):
            out[op] += int(n)
        return out

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            rc = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait(timeout=10)
        lines = self.said
        while lines[-1:] != [None]:
            lines.append(self.err.get(10))
        return rc, "".join(lines[:-1])


@pytest.fixture(scope="module")
def metadata_url():
    proc = subprocess.Popen([sys.executable, "-m", "mooncake.http_metadata_server", "--port", "0"],
                            env=bench_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    line = LineReader(proc.stdout).get(30) or ""
    m = re.search(r"url=(\S+)", line)
    try:
        assert m, line
        yield m.group(1)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.mark.timeout_s(60)
@pytest.mark.parametrize("metadata", ["P2PHANDSHAKE", "http"])
def test_initiator_reports_what_the_target_served(metadata, request):
    if metadata == "P2PHANDSHAKE":
        target = BenchTarget("--metadata_server=P2PHANDSHAKE")
        lookup = ["--metadata_server=P2PHANDSHAKE", "--segment_id=" + target.segment]
    else:
        url = request.getfixturevalue("metadata_url")
        # The name is the segment's and the host's (it must resolve).
        target = BenchTarget("--metadata_server=" + url, "--local_server_name=localhost")
        lookup = ["--metadata_server=" + url, "--segment_id=localhost",
                  "--local_server_name=127.0.0.1"]
    try:
        if metadata == "http":
            assert target.segment == "localhost"
        before = target.served()
        for op in ("read", "write"):
            done = initiator("--operation=" + op, *(RUN + lookup))
            assert done.returncode == 0, done.stderr
            m = RESULT.search(done.stdout)
            assert m, done.stdout
            seconds, batches, rate, unit = float(m[1]), int(m[2]), float(m[3]), m[4]
            assert unit == "GB" and batches > 0 and rate > 0 and 1 <= seconds < 10
            # duration is printed rounded to 0.01 s
            assert rate == pytest.approx(batches * BLOCK_BYTES / seconds / 1e9, rel=0.01, abs=0.006)
            after = target.served()
            other = "write" if op == "read" else "read"
            assert after[op] - before[op] == batches * BLOCK_BYTES, (before, after)
            assert after[other] == before[other], (op, before, after)
            before = after
    finally:
        rc, err = target.stop()
    assert rc == 0, err


def test_report_unit_and_precision_in_any_gflags_spelling():
    target = BenchTarget()
    try:
        # gflags' spellings: -flag value, --flag value, --noflag
        done = initiator("--segment_id=" + target.segment, *RUN + ["-report_unit", "MiB",
                         "--report_precision", "4", "--noinit_mem"])
    finally:
        target.stop()
    assert done.returncode == 0, done.stderr
    assert re.search(r"throughput \d+\.\d{4} MiB/s$", done.stdout, re.M), done.stdout


@pytest.mark.parametrize("flags, said", [
    (["--segment_id=x", "--frobnicate=1"], "unknown flag --frobnicate"),
    (["--segment_id=x", "--threads=0"],
     'invalid value "0" for --threads: expected a whole number, 1 to 1024'),
    (["--segment_id=x", "--block_size=1X"], 'invalid value "1X" for --block_size'),
    (["--segment_id=x", "--operation=copy"], 'invalid value "copy" for --operation'),
    (["--segment_id=x", "--report_unit=TB"], 'invalid value "TB" for --report_unit'),
    (["--segment_id=x", "--block_size=1M", "--batch_size=8", "--threads=2",
      "--buffer_size=8M"], "1048576 * 8 * 2 bytes is more than --buffer_size=8388608"),
    (["--segment_id=x", "--block_size=16000000T", "--batch_size=1048576", "--threads=1024"],
     "bytes is more than --buffer_size"),  # a product past 2^64 does not wrap into a fit
    (["--segment_id=x", "--gpu_id=-1"], "--gpu_id=-1"),
    (["--segment_id=x", "--protocol=hccl"], "--protocol=hccl"),
    (["--segment_id=x", "--use_vram=maybe"], '--use_vram takes true or false, not "maybe"'),
    (["--segment_id=x", "--backend=fast"], 'invalid value "fast" for --backend'),
    (["--segment_id=x", "--local_server_name=[::1"], "for --local_server_name"),
    (["--segment_id=x", "--local_server_name=h:99999"], "for --local_server_name"),
    (["--segment_id=x", "--duration=0"], 'invalid value "0" for --duration'),
    (["--segment_id=x", "--batch_size=-5"], 'invalid value "-5" for --batch_size'),
    (["--segment_id=n", "--local_server_name=n", "--metadata_server=http://127.0.0.1:1/m"],
     "would publish over the target's segment"),
    ([], "needs --segment_id"),
])
def test_bad_flags_are_named(flags, said):
    done = initiator(*flags)
    assert done.returncode == 2, done.stderr
    assert said in done.stderr, done.stderr
    assert "Test completed" not in done.stdout


def test_use_vram_is_the_default_where_cuda_finds_a_device():
    """With the CUDA driver's test double (device memory the CPU cannot
    touch), both sides allocate on the device unasked and their transfers
    go through ferry's staging; --use_vram=false keeps host memory."""
    fake = os.path.join(os.path.dirname(ferry_tool() or ""), "tests", "fake_cuda")
    if not os.path.isfile(os.path.join(fake, "libcuda.so.1")):
        pytest.skip("no fake CUDA driver built (build/tests/fake_cuda)")
    target = BenchTarget(LD_LIBRARY_PATH=fake)
    try:
        assert target.vram
        for vram in ("true", "false"):
            before = target.served("ferry_staged_bytes_total")
            done = initiator("--segment_id=" + target.segment, "--use_vram=" + vram, *RUN,
                             LD_LIBRARY_PATH=fake)
            assert done.returncode == 0, done.stderr
            batches = int(RESULT.search(done.stdout)[2])
            after = target.served("ferry_staged_bytes_total")
            # The target stages every byte it serves from device memory.
            assert after["read"] - before["read"] == batches * BLOCK_BYTES, (before, after)
    finally:
        rc, err = target.stop()
    assert rc == 0, err


def test_use_vram_without_a_cuda_device_is_refused():
    if ferry.cuda_available()[0]:
        pytest.skip("this host has a CUDA device")
    done = initiator("--segment_id=x", "--use_vram=true", *RUN)
    assert done.returncode == 2
    assert "--use_vram=true needs a CUDA device, and ferry found none" in done.stderr


def test_unknown_segment_names_it_and_the_cause(metadata_url):
    done = initiator("--metadata_server=" + metadata_url, "--segment_id=no-such-segment", *RUN)
    assert done.returncode == 1, done.stderr
    assert 'cannot open segment "no-such-segment" (--segment_id)' in done.stderr, done.stderr
    assert "ferry_status -" in done.stderr and "Test completed" not in done.stdout


def test_a_target_that_is_gone_fails_the_run():
    done = initiator("--segment_id=127.0.0.1:1", *RUN)
    assert done.returncode == 1
    assert "Connection refused" in done.stderr and "127.0.0.1:1" in done.stderr, done.stderr


def test_harmless_flags_are_accepted_with_a_note():
    target = BenchTarget("--auto_discovery", "--backend=tent")
    try:
        done = initiator("--segment_id=" + target.segment, "--nic_priority_matrix=m.json",
                         "--logtostderr", "--noauto_discovery", *RUN)
    finally:
        _, err = target.stop()
    assert done.returncode == 0, done.stderr
    assert "--nic_priority_matrix=m.json changes nothing" in done.stderr
    assert "--logtostderr is glog's" in done.stderr
    assert "auto_discovery" not in done.stderr  # =false is Mooncake's default: nothing to say
    assert "--auto_discovery changes nothing" in err and "--backend=tent" in err, err


@pytest.mark.timeout_s(60)
def test_a_target_killed_mid_run_fails_the_run_with_ferrys_error():
    target = BenchTarget()
    flags = [f for f in RUN if not f.startswith("--duration")] + ["--duration=30"]
    bench = subprocess.Popen(bench_argv("--mode=initiator", "--segment_id=" + target.segment,
                                        *flags), env=bench_env(), stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        while target.served()["read"] == 0:  # the run is under way once bytes moved
            assert bench.poll() is None, bench.communicate()
        target.proc.kill()
        out, err = bench.communicate(timeout=20)  # well before --duration ends
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.communicate()
        target.stop()
    assert bench.returncode == 1, (out, err)
    assert "Test completed" not in out
    assert re.search(r"thread \d: transfer with %s failed: .* \(ferry_status -\d+\): \S"
                     % re.escape(target.segment), err), err


def test_rdma_without_a_device_falls_back_with_the_drop_ins_warning(caplog):
    """--protocol=rdma (Mooncake's default) on a host without an RDMA device:
    tcp/shm, with the warning the Python drop-in logs, word for word."""
    rdma = os.path.isdir("/sys/class/infiniband") and os.listdir("/sys/class/infiniband")
    if os.environ.get("FERRY_FABRIC_PROVIDER") or rdma:
        pytest.skip("an RDMA device or a forced fabric provider: nothing falls back")
    from mooncake.engine import TransferEngine
    caplog.set_level(logging.WARNING, logger="mooncake.engine")
    te = TransferEngine()
    try:
        assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "rdma", "") == 0
    finally:
        te.close()
    drop_in = [r.getMessage() for r in caplog.records if "no RDMA device here" in r.getMessage()]
    assert len(drop_in) == 1, caplog.records
    target = BenchTarget("--protocol=rdma")
    try:
        done = initiator("--segment_id=" + target.segment,
                         *[f for f in RUN if f != "--protocol=tcp"])
    finally:
        _, err = target.stop()
    assert done.returncode == 0, done.stderr
    for said in (done.stderr, err):
        assert "transfer_engine_bench: WARNING: " + drop_in[0] + "\n" in said, said
