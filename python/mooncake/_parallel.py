"""_parallel.py - Mooncake's unified parallel tensor layouts (its
ParallelAxis, TensorParallelism, ReadTarget and writer partitions): where a
shard is stored (its key), which piece of a tensor a write stores, and which
keys and byte ranges rebuild the whole tensor. The shard's identity travels
in its header (_tensor.py: global and local shape, one layout axis per
parallel axis), so a reader needs no other record. Beside the shards a write
stores Mooncake's manifest (its WriterShardManifest): the whole tensor's dtype
and shape and its cut, under key__writer_manifest for a writer partition and
key__parallelism_manifest for a layout with a TP axis; a "full" read takes the
shard count and split_dim from it when it is there, and a "shard" read of
another TP count is cut from the stored shards, as Mooncake's reads do. The
store's calls are in store.py; this module does no I/O."""

import struct

from mooncake import _tensor
from mooncake._tensor import TensorFormatError

# Mooncake's LayoutAxisKind numbers, and the order its canonical keys list axes in.
KINDS = {"dp": 0, "tp": 1, "ep": 2, "pp": 3}
_NAMES = {v: k for k, v in KINDS.items()}
MODES = ("as_stored", "shard", "full")


class ParallelAxis:
    """One axis of a shard's identity: kind ("tp", "dp", "ep", "pp"), rank of
    size, split_dim (the dimension a layout axis such as TP cuts),
    expert_id (EP), stage_id (PP)."""

    def __init__(self, kind="tp", rank=0, size=1, split_dim=None, expert_id=None,
                 stage_id=None):
        self.kind, self.rank, self.size = kind, rank, size
        self.split_dim, self.expert_id, self.stage_id = split_dim, expert_id, stage_id

    def __repr__(self):
        return "ParallelAxis(%s %d of %d, split_dim=%s)" % (self.kind, self.rank, self.size,
                                                            self.split_dim)


class TensorParallelism:
    """An ordered list of ParallelAxis naming a shard."""

    def __init__(self, axes=None):
        self.axes = list(axes or [])


class ReadTarget:
    """What a read returns: mode "as_stored" (the object under the key, or
    under parallelism's shard key), "shard" (the shard parallelism names) or
    "full" (the whole tensor rebuilt from its shards)."""

    def __init__(self, mode="as_stored", parallelism=None):
        self.mode, self.parallelism = mode, parallelism


class _Axis:
    """A checked axis: kind number, rank, size, split_dim (-1: none), reserved0
    (expert or stage id, as the header carries it) and its key suffix."""

    def __init__(self, axis):
        get = (axis.get if isinstance(axis, dict) else lambda n, d=None: getattr(axis, n, d))
        name = str(get("kind", "")).lower()
        if name not in KINDS:
            raise TensorFormatError("parallel axis kind %r is not one of tp, dp, ep, pp"
                                    % (get("kind"),))
        self.kind, self.name = KINDS[name], name
        try:
            self.rank, self.size = int(get("rank")), int(get("size"))
            split, eid, sid = get("split_dim"), get("expert_id"), get("stage_id")
            self.split = -1 if split is None else int(split)
            self.eid = None if eid is None else int(eid)
            self.sid = None if sid is None else int(sid)
        except (TypeError, ValueError):
            raise TensorFormatError("parallel axis %s: rank, size, split_dim, expert_id and "
                                    "stage_id must be integers" % name) from None
        if not 0 <= self.rank < self.size:
            raise TensorFormatError("parallel axis %s: rank %d is not in 0..size-1 (size %d)"
                                    % (name, self.rank, self.size))
        if split is not None and self.split < 0:
            raise TensorFormatError("parallel axis %s: split_dim %d is negative"
                                    % (name, self.split))
        self.reserved0 = (self.eid if self.kind == KINDS["ep"] and self.eid is not None else
                          self.sid if self.kind == KINDS["pp"] and self.sid is not None else 0)

    def at(self, rank):
        """This axis with another rank."""
        other = _Axis.__new__(_Axis)
        other.__dict__.update(self.__dict__, rank=rank)
        return other

    def suffix(self):
        s = "%s_%dof%d" % (self.name, self.rank, self.size)
        if self.split >= 0:
            s += "_sd%d" % self.split
        if self.eid is not None:
            s += "_eid%d" % self.eid
        if self.sid is not None:
            s += "_sid%d" % self.sid
        return s


def axes_of(parallelism):
    """The checked axes of a TensorParallelism (or a list of axes) in
    canonical order (DP, TP, EP, PP); TensorFormatError naming the fault."""
    axes = getattr(parallelism, "axes", parallelism)
    if not isinstance(axes, (list, tuple)) or not axes:
        raise TensorFormatError("a TensorParallelism needs a non-empty list of axes, not %r"
                                % (parallelism,))
    if len(axes) > _tensor.MAX_AXES:
        raise TensorFormatError("%d parallel axes; the tensor header carries at most %d"
                                % (len(axes), _tensor.MAX_AXES))
    checked = sorted((_Axis(a) for a in axes), key=lambda a: a.kind)
    if len({a.kind for a in checked}) != len(checked):
        raise TensorFormatError("a parallel axis kind appears twice in %s"
                                % [a.name for a in checked])
    if sum(a.split >= 0 for a in checked) > 1:
        raise TensorFormatError("more than one parallel axis has a split_dim; a shard is cut "
                                "along one dimension")
    return checked


def split_axis(axes):
    """The axis that cuts the tensor (TP, else the one with a split_dim), or None."""
    tp = [a for a in axes if a.kind == KINDS["tp"]]
    if tp and tp[0].split < 0:
        raise TensorFormatError("the tp axis needs a split_dim")
    cut = [a for a in axes if a.split >= 0]
    return cut[0] if cut else None


def shard_key(key, axes):
    """Where the shard named by axes is stored: key_tp_<rank> for a lone TP
    axis (the legacy TP calls' key), else key__<axis>... per axis in
    canonical order (tp_1of4_sd0, ep_2of8_eid5, pp_0of2_sid0, dp_1of2)."""
    if len(axes) == 1 and axes[0].kind == KINDS["tp"]:
        return "%s_tp_%d" % (key, axes[0].rank)
    return key + "".join("__" + a.suffix() for a in axes)


def writer_partition(wp):
    """(rank, size, split_dim) of a writer partition: a 3-tuple, a dict or an
    object with those attributes."""
    if isinstance(wp, dict):
        wp = (wp.get("rank"), wp.get("size"), wp.get("split_dim"))
    elif not isinstance(wp, (list, tuple)):
        wp = (getattr(wp, "rank", None), getattr(wp, "size", None), getattr(wp, "split_dim", 0))
    if len(wp) != 3:
        raise TensorFormatError("a writer partition is (rank, size, split_dim), not %r" % (wp,))
    axis = _Axis({"kind": "tp", "rank": wp[0], "size": wp[1], "split_dim": wp[2]})
    return axis


def writer_key(key, axis):
    """Where a writer partition's shard is stored."""
    return "%s__writer_%dof%d_sd%d" % (key, axis.rank, axis.size, axis.split)


def lone_tp_writer_key(key, axes):
    """For a lone TP axis, the writer partition key of the same shard (a
    shard read falls back to it, as Mooncake's does); else None."""
    if axes is not None and len(axes) == 1 and axes[0].kind == KINDS["tp"]:
        return writer_key(key, axes[0])
    return None


# Mooncake's manifest: magic, version, header size (the whole 96), dtype, ndim,
# split_dim, shard count, a reserved 0, 4 bytes of padding, then the global
# shape's 8 dimensions (-1 past ndim).
MANIFEST_MAGIC, MANIFEST_VERSION = 0x574D414E, 1
_MANIFEST = struct.Struct("<IHHiiiii4x%dq" % _tensor.MAX_DIMS)
MANIFEST_SIZE = _MANIFEST.size
assert MANIFEST_SIZE == 96


def writer_manifest_key(key):
    return key + "__writer_manifest"


def parallelism_manifest_key(key):
    return key + "__parallelism_manifest"


def encode_manifest(code, global_shape, split_dim, count):
    """The manifest of a tensor of dtype code and global_shape cut into count
    shards along split_dim."""
    dims = list(global_shape) + [-1] * (_tensor.MAX_DIMS - len(global_shape))
    return _MANIFEST.pack(MANIFEST_MAGIC, MANIFEST_VERSION, MANIFEST_SIZE, code,
                          len(global_shape), split_dim, count, 0, *dims)


def decode_manifest(data):
    """(dtype code, global shape, split_dim, shard count) of a manifest;
    TensorFormatError when it is not one (Mooncake's checks)."""
    if len(data) < MANIFEST_SIZE:
        raise TensorFormatError("a manifest is %d bytes, not %d" % (MANIFEST_SIZE, len(data)))
    magic, version, size, code, ndim, split, count, _, *dims = _MANIFEST.unpack_from(data)
    if (magic, version, size) != (MANIFEST_MAGIC, MANIFEST_VERSION, MANIFEST_SIZE):
        raise TensorFormatError("not a manifest (magic 0x%x, version %d, size %d)"
                                % (magic, version, size))
    if not 0 <= ndim <= _tensor.MAX_DIMS or count <= 0 or not 0 <= split < ndim:
        raise TensorFormatError("manifest of %d dimensions, %d shards along dimension %d"
                                % (ndim, count, split))
    if any(d < 0 for d in dims[:ndim]):
        raise TensorFormatError("manifest shape %s" % (dims[:ndim],))
    return code, tuple(dims[:ndim]), split, count


def _header(code, global_shape, piece, axes):
    return _tensor.encode(code, global_shape, tuple(piece.shape),
                          piece.numel() * piece.element_size(),
                          axes=[(a.kind, a.rank, a.size, a.split, a.reserved0) for a in axes])


def _cut(tensor, axis, name):
    """Rank's equal piece of a whole tensor along the axis's split_dim."""
    shape = tuple(tensor.shape)
    if axis.split >= len(shape):
        raise TensorFormatError("%s: split_dim %d is not a dimension of shape %s"
                                % (name, axis.split, shape))
    if shape[axis.split] % axis.size:
        raise TensorFormatError("%s: dimension %d (%d) does not split into %d equal shards"
                                % (name, axis.split, shape[axis.split], axis.size))
    start, length = _tensor.shard_range(shape[axis.split], axis.rank, axis.size)
    return tensor.narrow(axis.split, start, length).contiguous()


def write_parts(key, tensor, code, name, parallelism=None, partition=None):
    """([(store key, contiguous tensor, header)] one write stores, and the
    manifest (key, bytes) written once they are, or None): the whole tensor
    (neither given); a writer partition's piece of a whole tensor; for a
    TensorParallelism with TP among several axes, the TP piece of a whole
    tensor; otherwise (a lone TP axis, or axes that do not include TP) the
    tensor as given, a shard along the axis with a split_dim if one has it.
    A manifest goes with a writer partition and with a TP axis, as
    Mooncake writes them."""
    if parallelism is not None and partition is not None:
        raise TensorFormatError("parallelism and writer_partition are mutually exclusive")
    if partition is not None:
        axis = writer_partition(partition)
        piece = _cut(tensor, axis, name)
        whole = tuple(tensor.shape)
        return ([(writer_key(key, axis), piece, _header(code, whole, piece, [axis]))],
                (writer_manifest_key(key), encode_manifest(code, whole, axis.split, axis.size)))
    if parallelism is None:
        return [(key, tensor, _tensor.header_of(tensor, code))], None
    axes = axes_of(parallelism)
    cut = split_axis(axes)
    shape = list(tensor.shape)
    if cut is not None and cut.kind == KINDS["tp"] and len(axes) > 1:
        piece = _cut(tensor, cut, name)  # full input: this rank's uniform TP shard
    else:
        piece = tensor
        if cut is not None:
            if cut.split >= len(shape):
                raise TensorFormatError("%s: split_dim %d is not a dimension of shape %s"
                                        % (name, cut.split, tuple(shape)))
            shape[cut.split] *= cut.size  # shard input: the whole is size such pieces
    manifest = None
    if cut is not None and cut.kind == KINDS["tp"]:
        manifest = (parallelism_manifest_key(key),
                    encode_manifest(code, tuple(shape), cut.split, cut.size))
    return [(shard_key(key, axes), piece, _header(code, tuple(shape), piece, axes))], manifest


def read_request(target):
    """(mode, axes or None) of a ReadTarget (None: as_stored, whole key)."""
    if target is None:
        return "as_stored", None
    mode = getattr(target, "mode", None)
    if mode not in MODES:
        raise TensorFormatError("ReadTarget mode %r is not one of %s" % (mode, ", ".join(MODES)))
    parallelism = getattr(target, "parallelism", None)
    if mode == "shard" and parallelism is None:
        raise TensorFormatError("ReadTarget mode 'shard' needs a parallelism")
    return mode, None if parallelism is None else axes_of(parallelism)


class Rebuild:
    """How the shards of one tensor rebuild it: their keys (rank order of the
    cutting axis; writers: a writer partition's keys, for a lone TP axis of
    the same rank count and split_dim); after check() with their headers, the whole tensor's
    header and the (key, source offset, destination offset, size) ranges that
    copy each shard's rows into place behind that header."""

    def __init__(self, key, axes, writers=False):
        cut = split_axis(axes)
        if cut is None:
            raise TensorFormatError("no axis of %s cuts the tensor (none has a split_dim): "
                                    "it is stored whole per shard; read it as_stored"
                                    % [a.suffix() for a in axes])
        if writers and len(axes) != 1:
            raise TensorFormatError("writer partitions are one axis, not %d" % len(axes))
        self.cut = cut
        self.keys = [writer_key(key, cut.at(r)) if writers else
                     shard_key(key, [a if a is not cut else a.at(r) for a in axes])
                     for r in range(cut.size)]

    def check(self, headers, window=None):
        """headers: each shard's first HEADER_SIZE bytes and value size, in
        key order. Returns (whole header, total bytes, ranges);
        TensorFormatError when the shards do not make one tensor. window:
        (rank, count, axes) for one shard of another cut (a TP rank of count
        equal pieces along the same dimension, axes its header's) instead
        of the whole: its header and the ranges of its rows only."""
        d, layouts = self.cut.split, []
        for key, (head, total) in zip(self.keys, headers):
            try:
                code, global_shape, local, axes = _tensor.layout(head, total)
            except TensorFormatError as e:
                raise TensorFormatError("shard %r: %s" % (key, e)) from None
            layouts.append((key, code, global_shape, local, axes))
        _, code, global_shape, _, _ = layouts[0]
        if d >= len(global_shape):
            raise TensorFormatError("split_dim %d is not a dimension of shape %s"
                                    % (d, global_shape))
        size = _tensor.element_size(code)
        inner = size
        for n in global_shape[d + 1:]:
            inner *= n
        outer = 1
        for n in global_shape[:d]:
            outer *= n
        whole = global_shape[d]
        if window is not None and whole % window[1]:
            raise TensorFormatError("dimension %d (%d) does not split into %d equal shards"
                                    % (d, whole, window[1]))
        lo, hi = (0, whole) if window is None else (window[0] * whole // window[1],
                                                     (window[0] + 1) * whole // window[1])
        ranges, at = [], 0
        for rank, (key, c, g, local, axes) in enumerate(layouts):
            mine = [a for a in axes if a[0] == self.cut.kind]
            want = list(global_shape)
            want[d] = local[d] if len(local) == len(global_shape) else -1
            if (c != code or g != global_shape or tuple(want) != local or not mine
                    or mine[0][1:4] != (rank, self.cut.size, d)):
                raise TensorFormatError(
                    "shard %r is not rank %d of %d along dimension %d of a %s tensor of shape "
                    "%s (its header: dtype %s, shape %s of %s, axes %s)"
                    % (key, rank, self.cut.size, d, _tensor.dtype_name(code), global_shape,
                       _tensor.dtype_name(c), local, g, axes))
            row = local[d] * inner
            start, end = max(lo * inner, at), min(hi * inner, at + row)  # its part of the window
            if end > start:
                for o in range(outer):
                    ranges.append((key, _tensor.HEADER_SIZE + o * row + start - at,
                                   _tensor.HEADER_SIZE + o * (hi - lo) * inner + start - lo * inner,
                                   end - start))
            at += row
        if at != whole * inner:
            raise TensorFormatError("the shards along dimension %d add up to %d, not %d"
                                    % (d, at // inner, whole))
        nbytes = outer * (hi - lo) * inner
        if window is None:
            head = _tensor.encode(code, global_shape, global_shape, nbytes)
        else:
            local = list(global_shape)
            local[d] = hi - lo
            head = _tensor.encode(code, global_shape, tuple(local), nbytes, axes=[
                (a.kind, a.rank, a.size, a.split, a.reserved0) for a in window[2]])
        return head, _tensor.HEADER_SIZE + nbytes, ranges
