"""_safetensors.py - the safetensors file format, for the store's
save_tensor_to_safetensor / load_tensor_from_safetensor. Mooncake's client
calls the `safetensors` package, which Debian does not ship; the format is
small and public (an 8-byte little-endian header length, a JSON header
naming each tensor's dtype, shape and byte range, then the bytes), so it is
written and read here, and files pass both ways between this and the
package. Reading checks every field against the file before trusting it."""

import json
import os
import struct

# The format's dtype names and torch's.
_DTYPES = {"BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "U16": "uint16",
           "I32": "int32", "U32": "uint32", "I64": "int64", "U64": "uint64",
           "F16": "float16", "BF16": "bfloat16", "F32": "float32", "F64": "float64",
           "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}
_NAMES = {torch_name: name for name, torch_name in _DTYPES.items()}
_HEADER_MAX = 100 * 1024 * 1024  # the package's own limit on the JSON header


class SafetensorsError(ValueError):
    """A file that is not a well-formed safetensors file, or a tensor that
    cannot be written to one; the message says what and where."""


def _torch():
    import torch
    return torch


def _raw(tensor):
    """A CPU tensor's bytes in C order (the format's: little-endian, as
    this machine)."""
    flat = tensor.detach().cpu().contiguous().reshape(-1)
    return flat.view(_torch().uint8).numpy().tobytes()


def save(tensors, path):
    """Writes {name: tensor} to path, the header padded with spaces to a
    multiple of 8 bytes and the tensors by element size, largest first,
    then by name (as the package writes them): every tensor's bytes start
    at a multiple of its element size."""
    header, blobs, at = {}, [], 0
    for name in sorted(tensors, key=lambda n: (-tensors[n].element_size(), n)):
        tensor = tensors[name]
        dtype = str(tensor.dtype).replace("torch.", "")
        if dtype not in _NAMES:
            raise SafetensorsError("tensor %r has dtype %s, which safetensors does not carry"
                                   % (name, tensor.dtype))
        blob = _raw(tensor)
        header[name] = {"dtype": _NAMES[dtype], "shape": list(tensor.shape),
                        "data_offsets": [at, at + len(blob)]}
        blobs.append(blob)
        at += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def _entry(path, name, entry, data_len):
    """(torch dtype name, shape, begin, end) of one header entry, checked
    against the data section's length."""
    if not isinstance(entry, dict) or entry.get("dtype") not in _DTYPES:
        raise SafetensorsError("%s: tensor %r has no known dtype" % (path, name))
    shape, offsets = entry.get("shape"), entry.get("data_offsets")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise SafetensorsError("%s: tensor %r has a bad shape %r" % (path, name, shape))
    if not (isinstance(offsets, list) and len(offsets) == 2 and
            all(isinstance(o, int) for o in offsets) and 0 <= offsets[0] <= offsets[1] <= data_len):
        raise SafetensorsError("%s: tensor %r has bytes %r outside the file's %d"
                               % (path, name, offsets, data_len))
    torch_name = _DTYPES[entry["dtype"]]
    if not hasattr(_torch(), torch_name):
        raise SafetensorsError("%s: tensor %r is %s, which this torch (%s) lacks"
                               % (path, name, entry["dtype"], _torch().__version__))
    count = 1
    for d in shape:
        count *= d
    size = count * _torch().empty((), dtype=getattr(_torch(), torch_name)).element_size()
    if offsets[1] - offsets[0] != size:
        raise SafetensorsError("%s: tensor %r of shape %s (%s) needs %d bytes, the header gives "
                               "%d" % (path, name, shape, entry["dtype"], size,
                                       offsets[1] - offsets[0]))
    return torch_name, shape, offsets[0], offsets[1]


def load(path):
    """{name: tensor} from path, in name order (the package's keys()): views
    of one buffer holding the file's data section, read once (no copy per
    tensor), which they keep alive."""
    torch = _torch()
    with open(path, "rb") as f:
        total = os.fstat(f.fileno()).st_size
        head = f.read(8)
        if len(head) != 8:
            raise SafetensorsError("%s: %d bytes, too short for a header length" % (path, total))
        (length,) = struct.unpack("<Q", head)
        if length > min(_HEADER_MAX, total - 8):
            raise SafetensorsError("%s: a header of %d bytes in a file of %d" %
                                   (path, length, total))
        try:
            header = json.loads(f.read(length))
        except ValueError as e:
            raise SafetensorsError("%s: the header is not JSON: %s" % (path, e)) from None
        if not isinstance(header, dict):
            raise SafetensorsError("%s: the header is not a JSON object" % path)
        data = bytearray(f.read())
    header.pop("__metadata__", None)
    out = {}
    for name in sorted(header):
        torch_name, shape, begin, end = _entry(path, name, header[name], len(data))
        dtype = getattr(torch, torch_name)
        if begin == end:
            out[name] = torch.empty(shape, dtype=dtype)
            continue
        raw = torch.frombuffer(data, dtype=torch.uint8, offset=begin, count=end - begin)
        out[name] = raw.view(dtype).reshape(shape)
    return out
