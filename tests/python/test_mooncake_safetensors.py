"""test_mooncake_safetensors.py - save_tensor_to_safetensor and
load_tensor_from_safetensor of mooncake.store.MooncakeDistributedStore, and
the safetensors format under them (mooncake/_safetensors.py): a file laid
out here byte by byte as the format's documentation gives it is read, a
written file is parsed here field by field, dtypes and shapes go through a
store and back, and malformed files are refused with their cause, storing
nothing."""

import json
import logging
import struct

import pytest

torch = pytest.importorskip("torch")

from test_mooncake_store import client, master  # noqa: E402,F401  (the fixture)
from test_mooncake_store_tensor import as_bytes, sample, same  # noqa: E402

from mooncake import _safetensors  # noqa: E402


def file_of(header, data):
    """A safetensors file: the header's length (u64, little-endian), the
    JSON header, the bytes."""
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


def test_a_file_laid_out_by_hand_is_read(tmp_path):
    x = struct.pack("<3f", 1.5, -2.0, 4.25)
    y = struct.pack("<2h", 7, -9)
    path = tmp_path / "hand.safetensors"
    path.write_bytes(file_of({"__metadata__": {"format": "pt"},
                              "y": {"dtype": "I16", "shape": [2, 1], "data_offsets": [12, 16]},
                              "x": {"dtype": "F32", "shape": [3], "data_offsets": [0, 12]}},
                             x + y))
    got = _safetensors.load(str(path))
    assert list(got) == ["x", "y"]
    assert got["x"].tolist() == [1.5, -2.0, 4.25] and got["x"].dtype == torch.float32
    assert got["y"].tolist() == [[7], [-9]] and got["y"].dtype == torch.int16


def test_a_tensor_at_an_unaligned_offset_is_read(tmp_path):
    """The format does not require alignment: an F32 after one byte."""
    path = tmp_path / "odd.safetensors"
    path.write_bytes(file_of({"b": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
                              "f": {"dtype": "F32", "shape": [2], "data_offsets": [1, 9]}},
                             b"\x07" + struct.pack("<2f", 0.5, -3.0)))
    got = _safetensors.load(str(path))
    assert got["b"].tolist() == [7] and got["f"].tolist() == [0.5, -3.0]


def test_a_written_file_parses_field_by_field(tmp_path):
    a, b = sample(torch.bfloat16, (2, 3), 1), sample(torch.bool, (4,), 2)
    path = tmp_path / "w.safetensors"
    _safetensors.save({"b": b, "a": a}, str(path))
    raw = path.read_bytes()
    (length,) = struct.unpack_from("<Q", raw)
    assert (8 + length) % 8 == 0
    header = json.loads(raw[8:8 + length])
    data = raw[8 + length:]
    assert header == {"a": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 12]},
                      "b": {"dtype": "BOOL", "shape": [4], "data_offsets": [12, 16]}}
    assert data == as_bytes(a) + as_bytes(b)
    _safetensors.save({"a": sample(torch.bool, (3,), 3), "z": sample(torch.float32, (1,), 4)},
                      str(path))  # the larger element first: z stays aligned
    raw = path.read_bytes()
    (length,) = struct.unpack_from("<Q", raw)
    offsets = {k: v["data_offsets"] for k, v in json.loads(raw[8:8 + length]).items()}
    assert offsets == {"z": [0, 4], "a": [4, 7]}


@pytest.mark.parametrize("dtype,shape", [(torch.float32, (5,)), (torch.float64, (2, 2)),
                                         (torch.int8, (3, 1, 2)), (torch.uint8, ()),
                                         (torch.int32, (0, 4)), (torch.int64, (2,)),
                                         (torch.float16, (3, 3)), (torch.bfloat16, (4,)),
                                         (torch.bool, (6,))])
def test_a_tensor_goes_to_a_file_and_back_through_the_store(master, tmp_path, dtype, shape):
    s = client(master)
    try:
        tensor = sample(dtype, shape, 3)
        assert s.put_tensor("st", tensor) == 0
        path = str(tmp_path / "st.safetensors")
        assert s.save_tensor_to_safetensor("st", path) == 0
        assert list(_safetensors.load(path)) == ["st"]
        same(s.load_tensor_from_safetensor("back", path), tensor)
        same(s.get_tensor("back"), tensor)
    finally:
        assert s.close() == 0


def test_names_and_failures(master, tmp_path, monkeypatch, caplog):
    """The key names the file when no file is given; a file without the key
    stores its first tensor under the key, None stores under the file's
    name; a missing key is -1100, an unwritable file -600."""
    s = client(master)
    monkeypatch.chdir(tmp_path)
    try:
        one, two = sample(torch.float32, (2,), 4), sample(torch.int64, (3,), 5)
        assert s.put_tensor("one", one) == 0
        assert s.save_tensor_to_safetensor("one") == 0
        assert list(_safetensors.load("one")) == ["one"]
        _safetensors.save({"b2": two, "a1": one}, "pair.safetensors")
        with caplog.at_level(logging.WARNING, logger="mooncake.store"):
            same(s.load_tensor_from_safetensor("other", "pair.safetensors"), one)
        assert "has no tensor 'other'" in caplog.text
        same(s.get_tensor("other"), one)
        same(s.load_tensor_from_safetensor("b2", "pair.safetensors"), two)
        same(s.load_tensor_from_safetensor(None, "pair.safetensors"), one)
        same(s.get_tensor("pair.safetensors"), one)
        assert s.save_tensor_to_safetensor("absent", "x.safetensors") == -1100
        assert s.save_tensor_to_safetensor("one", str(tmp_path / "no" / "dir")) == -600
        assert s.load_tensor_from_safetensor("k", "missing.safetensors") is None
    finally:
        assert s.close() == 0


BAD = [
    (b"\x01\x00", "too short for a header length"),
    (struct.pack("<Q", 1000) + b"{}", "a header of 1000 bytes"),
    (struct.pack("<Q", 3) + b"{x}", "not JSON"),
    (struct.pack("<Q", 2) + b"[]", "not a JSON object"),
    (file_of({"t": {"dtype": "Q9", "shape": [1], "data_offsets": [0, 1]}}, b"\0"),
     "no known dtype"),
    (file_of({"t": {"dtype": "U8", "shape": [-1], "data_offsets": [0, 1]}}, b"\0"),
     "bad shape"),
    (file_of({"t": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}}, b"\0\0"),
     "outside the file's 2"),
    (file_of({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 8),
     "needs 8 bytes, the header gives 4"),
]


@pytest.mark.parametrize("raw,says", BAD, ids=[says for _, says in BAD])
def test_a_malformed_file_is_refused_with_its_cause(master, tmp_path, caplog, raw, says):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(raw)
    with pytest.raises(_safetensors.SafetensorsError, match=says):
        _safetensors.load(str(path))
    s = client(master)
    try:
        with caplog.at_level(logging.WARNING, logger="mooncake.store"):
            assert s.load_tensor_from_safetensor("bad", str(path)) is None
        assert says in caplog.text
        assert s.is_exist("bad") == 0
    finally:
        assert s.close() == 0
