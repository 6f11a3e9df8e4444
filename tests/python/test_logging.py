"""test_logging.py - libferry's lines reach Python's `logging` (logger
"ferry") and nothing of them reaches fd 2 unless asked. Each case runs a
child interpreter so that fd 2 is its own and the logging setup is fresh."""

import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.join(HERE, "..", "..", "python")

CHILD = r"""
import json, logging, sys, threading
import ferry

records, seen = [], threading.Event()

class Keep(logging.Handler):
    def emit(self, record):
        records.append({"name": record.name, "level": record.levelname,
                        "msg": record.getMessage(),
                        "engine": getattr(record, "ferry_engine", None),
                        "thread": getattr(record, "ferry_thread", None)})
        if "listening on" in record.getMessage():
            seen.set()

logging.getLogger().addHandler(Keep())
logging.getLogger().setLevel(logging.DEBUG)
if sys.argv[1] == "stderr":
    ferry.log_to_stderr()
e = ferry.Engine("127.0.0.1")
name = e.name
if sys.argv[1] == "drain":
    # No flush: the package's drain thread hands the line over by itself.
    assert seen.wait(60), "no listening record within 60 s"
else:
    ferry.flush_log()
e.close()
print(json.dumps({"name": name, "records": records}))
"""


def run_child(mode):
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR)
    env.pop("FERRY_LOG", None)
    done = subprocess.run([sys.executable, "-c", CHILD, mode], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), done.stderr


def listening(out):
    return [r for r in out["records"] if "listening on" in r["msg"]]


def test_lines_go_to_logger_ferry_not_stderr():
    out, err = run_child("flush")
    lines = listening(out)
    assert len(lines) == 1, out
    rec = lines[0]
    assert rec["name"] == "ferry"
    assert rec["level"] == "INFO"
    assert rec["engine"] == out["name"]
    assert rec["msg"].startswith(out["name"] + ": engine ")
    assert isinstance(rec["thread"], int) and rec["thread"] > 0
    assert "listening" not in err and "ferry[" not in err, err


def test_drain_thread_delivers_without_flush():
    out, err = run_child("drain")
    assert len(listening(out)) == 1, out
    assert "ferry[" not in err, err


def test_stderr_when_asked():
    out, err = run_child("stderr")
    assert listening(out) == []
    assert " INFO ferry[" in err and "listening on" in err, err


FORK_CHILD = r"""
import logging, os, sys, threading
import ferry

got = threading.Event()

class Mark(logging.Handler):
    def emit(self, record):
        if "listening on" in record.getMessage():
            got.set()

logging.getLogger("ferry").addHandler(Mark())
logging.getLogger("ferry").setLevel(logging.INFO)
pid = os.fork()
if pid == 0:
    e = ferry.Engine("127.0.0.1")
    ok = got.wait(60)  # no flush: only a drain thread started in the child delivers it
    e.close()
    os._exit(0 if ok else 3)
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def test_forked_child_drains_its_lines():
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR)
    env.pop("FERRY_LOG", None)
    done = subprocess.run([sys.executable, "-c", FORK_CHILD], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, (done.returncode, done.stderr)
