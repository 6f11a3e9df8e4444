"""_tensor.py - Mooncake's stored-tensor format: a 304-byte header (dtype,
shape, layout) then the tensor's bytes, laid out byte for byte as Mooncake's
store client writes it (its TensorMetadata: a TensorObjectHeader then a
TensorLayoutMetadata, native little-endian), so that a tensor put by either
client is read by the other. Encoding, checked decoding into a torch tensor,
and the tensor-parallel shard layout. The store's methods are in store.py;
torch is imported only when a tensor call runs."""

import struct

MAGIC = 0x4D4F4F4E  # "NOOM" in memory
VERSION = 1
MAX_DIMS = 8
MAX_AXES = 4
LAYOUT_FULL, LAYOUT_SHARD = 0, 1
AXIS_TP = 1  # LayoutAxisKind: DP 0, TP 1, EP 2, PP 3, RESERVED 4
_AXIS_KINDS = 5

# magic, version, header_size, dtype, ndim, layout_kind, reserved_flags,
# data_offset, data_bytes; then global and local shape (8 dims each, -1 past
# ndim), axis_count, reserved, and 4 axes of (kind, axis_index, shard_rank,
# shard_count, split_dim, reserved0, reserved1 int64).
_HEAD = struct.Struct("<IHHiiIIQQ")
_SHAPES = struct.Struct("<%dq%dqII" % (MAX_DIMS, MAX_DIMS))
_AXIS = struct.Struct("<iiiiiiq")
HEADER_SIZE = _HEAD.size + _SHAPES.size + MAX_AXES * _AXIS.size
assert HEADER_SIZE == 304

# Mooncake's TensorDtype numbers: (torch attribute name, element size).
_DTYPES = {0: ("float32", 4), 1: ("float64", 8), 2: ("int8", 1), 3: ("uint8", 1),
           4: ("int16", 2), 5: ("uint16", 2), 6: ("int32", 4), 7: ("uint32", 4),
           8: ("int64", 8), 9: ("uint64", 8), 10: ("bool", 1), 11: ("float16", 2),
           12: ("bfloat16", 2), 13: ("float8_e4m3fn", 1), 14: ("float8_e5m2", 1)}
_CODES = {name: code for code, (name, _) in _DTYPES.items()}


class TensorFormatError(ValueError):
    """A value that is not a tensor in Mooncake's format, or a tensor that
    cannot be stored in it; the message says which field and why."""


def _torch():
    try:
        import torch
    except ImportError as e:
        raise TensorFormatError("the tensor calls need torch: %s" % e) from None
    return torch


def encode(dtype_code, global_shape, local_shape, data_bytes, axes=()):
    """The header of a tensor of local_shape (a shard of global_shape when
    axes, each (kind, shard_rank, shard_count, split_dim[, reserved0]), are
    given)."""
    kind = LAYOUT_SHARD if axes else LAYOUT_FULL
    head = _HEAD.pack(MAGIC, VERSION, HEADER_SIZE, dtype_code, len(global_shape), kind, 0,
                      HEADER_SIZE, data_bytes)

    def dims(shape):
        return list(shape) + [-1] * (MAX_DIMS - len(shape))

    shapes = _SHAPES.pack(*dims(global_shape), *dims(local_shape), len(axes), 0)
    # an axis: (kind, rank, count, split_dim[, reserved0: EP's expert or PP's
    # stage id]); reserved1 is the shard's extent on split_dim (0: none)
    packed = [_AXIS.pack(axis[0], i, axis[1], axis[2], axis[3],
                         axis[4] if len(axis) > 4 else 0,
                         local_shape[axis[3]] if axis[3] >= 0 else 0)
              for i, axis in enumerate(axes)]
    packed += [bytes(_AXIS.size)] * (MAX_AXES - len(axes))
    return head + shapes + b"".join(packed)


def inspect(tensor, name="tensor"):
    """(contiguous CPU tensor, dtype code): the tensor a put stores (a
    non-contiguous one is made contiguous, as Mooncake's put does), or
    TensorFormatError saying why it cannot be stored."""
    torch = _torch()
    if not isinstance(tensor, torch.Tensor):
        raise TensorFormatError("%s is a %s, not a torch.Tensor" % (name, type(tensor).__name__))
    dtype = str(tensor.dtype).replace("torch.", "")
    if dtype not in _CODES:
        raise TensorFormatError("%s has dtype %s, which Mooncake's tensor format does not carry"
                                % (name, tensor.dtype))
    if tensor.dim() > MAX_DIMS:
        raise TensorFormatError("%s has %d dimensions; the format carries at most %d"
                                % (name, tensor.dim(), MAX_DIMS))
    if tensor.device.type != "cpu":
        raise TensorFormatError("%s is on %s; the tensor calls take CPU tensors (use "
                                "put_from/get_into with registered device memory)"
                                % (name, tensor.device))
    return tensor.contiguous(), _CODES[dtype]


def header_of(tensor, code):
    """The header of a whole (contiguous) tensor."""
    shape = tuple(tensor.shape)
    return encode(code, shape, shape, tensor.numel() * tensor.element_size())


def shard_range(dim_size, rank, count):
    """(start, length) of shard rank of count along a dimension of dim_size."""
    start = dim_size * rank // count
    return start, dim_size * (rank + 1) // count - start


def shards(tensor, code, tp_size, split_dim, name="tensor"):
    """[(shard tensor, header)] for ranks 0..tp_size-1: the tensor cut into
    tp_size equal contiguous pieces along split_dim (Mooncake's legacy TP
    layout, stored under key_tp_<rank>)."""
    shape = tuple(tensor.shape)
    if not 0 <= split_dim < len(shape):
        raise TensorFormatError("%s: split_dim %d is not a dimension of shape %s"
                                % (name, split_dim, shape))
    if shape[split_dim] % tp_size:
        raise TensorFormatError("%s: dimension %d (%d) does not split into %d equal shards"
                                % (name, split_dim, shape[split_dim], tp_size))
    out = []
    for rank in range(tp_size):
        start, length = shard_range(shape[split_dim], rank, tp_size)
        piece = tensor.narrow(split_dim, start, length).contiguous()
        head = encode(code, shape, tuple(piece.shape), piece.numel() * piece.element_size(),
                      axes=[(AXIS_TP, rank, tp_size, split_dim)])
        out.append((piece, head))
    return out


def check(header, total):
    """The parsed header of a value of total bytes, or TensorFormatError."""
    if total < HEADER_SIZE:
        raise TensorFormatError("the value has %d bytes, fewer than a tensor header's %d"
                                % (total, HEADER_SIZE))
    (magic, version, size, code, ndim, kind, _, offset,
     nbytes) = _HEAD.unpack_from(header, 0)
    if magic != MAGIC:
        raise TensorFormatError("not a Mooncake tensor: magic 0x%08x, not 0x%08x" % (magic, MAGIC))
    if version != VERSION or size != HEADER_SIZE:
        raise TensorFormatError("tensor header version %d of %d bytes; this client reads "
                                "version %d of %d" % (version, size, VERSION, HEADER_SIZE))
    if code not in _DTYPES:
        raise TensorFormatError("unknown dtype number %d" % code)
    if not 0 <= ndim <= MAX_DIMS or kind > LAYOUT_SHARD:
        raise TensorFormatError("ndim %d or layout kind %d out of range" % (ndim, kind))
    fields = _SHAPES.unpack_from(header, _HEAD.size)
    global_shape, local = fields[:MAX_DIMS], fields[MAX_DIMS:2 * MAX_DIMS]
    axis_count = fields[2 * MAX_DIMS]
    if axis_count > MAX_AXES:
        raise TensorFormatError("%d layout axes, more than %d" % (axis_count, MAX_AXES))
    if not HEADER_SIZE <= offset <= total or nbytes != total - offset:
        raise TensorFormatError("data at offset %d, %d bytes, in a value of %d bytes"
                                % (offset, nbytes, total))
    if any(d < 0 for d in global_shape[:ndim] + local[:ndim]) or \
            any(d != -1 for d in global_shape[ndim:] + local[ndim:]):
        raise TensorFormatError("bad shape %s / %s for ndim %d" % (global_shape, local, ndim))
    count = 1
    for d in local[:ndim]:
        count *= d
    if count * _DTYPES[code][1] != nbytes:
        raise TensorFormatError("shape %s of %s holds %d bytes, the header says %d"
                                % (local[:ndim], _DTYPES[code][0], count * _DTYPES[code][1],
                                   nbytes))
    for i in range(axis_count):
        k, _, rank, shard_count, split, _, _ = _AXIS.unpack_from(
            header, _HEAD.size + _SHAPES.size + i * _AXIS.size)
        if not (0 <= k < _AXIS_KINDS and 0 <= rank < shard_count and -1 <= split < ndim):
            raise TensorFormatError("bad layout axis %d: kind %d, rank %d of %d, split_dim %d"
                                    % (i, k, rank, shard_count, split))
    return code, tuple(local[:ndim]), offset, nbytes


def layout(header, total):
    """(dtype code, global shape, local shape, axes) of a value of total bytes
    whose header is given, each axis (kind, rank, count, split_dim,
    reserved0); TensorFormatError when it is not a tensor."""
    code, local, _, _ = check(header, total)
    ndim = len(local)
    fields = _SHAPES.unpack_from(header, _HEAD.size)
    axes = [_AXIS.unpack_from(header, _HEAD.size + _SHAPES.size + i * _AXIS.size)
            for i in range(fields[2 * MAX_DIMS])]
    return (code, tuple(fields[:ndim]), local,
            [(k, rank, count, split, r0) for k, _, rank, count, split, r0, _ in axes])


def declared_size(header):
    """The value size a header declares (data offset + data bytes); 0 when
    too short to say."""
    if len(header) < _HEAD.size:
        return 0
    fields = _HEAD.unpack_from(header, 0)
    return fields[7] + fields[8]


def element_size(code):
    return _DTYPES[code][1]


def dtype_name(code):
    return _DTYPES[code][0] if code in _DTYPES else "dtype %d" % code


def decode(buffer):
    """The tensor in a writable buffer object holding a whole value, sharing
    the buffer's memory (and keeping it alive); TensorFormatError when the
    value is not one."""
    torch = _torch()
    total = memoryview(buffer).nbytes
    if total < HEADER_SIZE:
        check(b"", total)  # raises: too short for a header
    raw = torch.frombuffer(buffer, dtype=torch.uint8)
    code, shape, offset, nbytes = check(raw[:HEADER_SIZE].numpy().tobytes(), total)
    dtype = getattr(torch, _DTYPES[code][0], None)
    if dtype is None:
        raise TensorFormatError("dtype %s is not in this torch (%s)"
                                % (_DTYPES[code][0], torch.__version__))
    data = raw[offset:offset + nbytes]
    if offset % _DTYPES[code][1]:  # a foreign header's odd offset: realign by a copy
        data = data.clone()
    return data.view(dtype).reshape(shape)
