"""test_device_arrays.py - array objects as ferry's local memory, and the
drop-in's stream-ordered calls (issue 30 §3):

  * torch CPU tensors (their __dlpack__): registered, written from and read
    into; a non-contiguous one is refused naming why;
  * with the test double of the CUDA driver (fake_cuda_cases.py, each case
    in a process whose libcuda.so.1 is build/tests/fake_cuda's): objects
    with __cuda_array_interface__ or __dlpack__ of device memory, the
    location they imply checked against the driver; Mooncake's *_on_cuda
    calls in stream order, and their refusals; ferry.Engine.submit_on_stream
    releasing the stream when the transfer fails; a receive pool over
    device memory (its messages give .addr, and no CPU view).

The fake tests ferry's logic around device memory, not the GPU path
(tests/gpu/test_gpu_torch.py does, with torch.cuda).
"""

import os
import subprocess
import sys

import pytest

import ferry

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
FAKE = os.path.join(ROOT, os.environ.get("FERRY_BUILD", "build"), "tests", "fake_cuda")


@pytest.mark.parametrize("case", ["cuda_array_interface", "dlpack_device", "non_contiguous",
                                  "mooncake_on_cuda", "mooncake_on_cuda_errors",
                                  "ferry_submit_on_stream_failure", "gpu_pool"])
def test_with_fake_driver(case):
    if not os.path.exists(os.path.join(FAKE, "libcuda.so.1")):
        pytest.skip("no fake CUDA driver: build it (make build) into %s" % FAKE)
    env = dict(os.environ, LD_LIBRARY_PATH=FAKE)
    p = subprocess.run([sys.executable, os.path.join(HERE, "fake_cuda_cases.py"), case],
                       env=env, capture_output=True, text=True, timeout=90)
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), p.stdout + p.stderr


torch = pytest.importorskip("torch")


def test_torch_cpu_tensors(pair):
    a, b = pair
    src = torch.arange(4096, dtype=torch.int32)
    dst = torch.zeros(4096, dtype=torch.int32)
    assert a.register(src) == src.data_ptr()
    assert b.register(dst, location="cpu:0") == dst.data_ptr()
    a.write(b.name, src, dst.data_ptr())
    assert torch.equal(dst, src)
    back = torch.zeros(2048, dtype=torch.int32)
    a.register(back)
    a.read(b.name, back, dst.data_ptr() + 4 * 1024)  # bytes 4096.. of dst
    assert torch.equal(back, src[1024:3072])
    view = src[10:20]  # a view at an offset: its own address
    a.write(b.name, view, dst.data_ptr())
    assert torch.equal(dst[:10], src[10:20])


def test_torch_non_contiguous_refused(pair):
    a, _ = pair
    t = torch.zeros(64, 64)
    with pytest.raises(ferry.Error) as e:
        a.register(t[:, ::2])
    assert e.value.code == ferry.EINVAL
    assert "not contiguous" in str(e.value) and "__dlpack__" in str(e.value)
    a.register(t[:1].t())  # a row, transposed: contiguous (a 1-wide dimension's stride is moot)


def test_not_an_array(pair):
    a, _ = pair
    with pytest.raises(TypeError) as e:
        a.register(object())
    assert "__cuda_array_interface__ or __dlpack__" in str(e.value)


def test_send_torch_tensor(pair):
    a, b = pair
    pool = b.create_pool("emb", 1 << 20)
    t = torch.arange(1000, dtype=torch.float32)
    a.send(b.name, "emb", b"req-1", t)
    with b.recv(pool, b"req-1", timeout=30) as m:
        assert bytes(m) == t.numpy().tobytes()
    pool.close()
