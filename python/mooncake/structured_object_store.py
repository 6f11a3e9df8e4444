"""mooncake.structured_object_store - how a batch of structured rows (dicts,
lists, tensors, strings, numbers) is cut into columns, the first step of
Mooncake's structured object store.

``infer_structure(path, rows, leaves, nodes)`` walks the rows together: a
position whose non-null values are all dicts becomes a dict *node* (its
children the keys seen, in first-seen order, and ``row_mask`` saying which
rows had a dict there), one whose values are lists holding containers a
list *node* (a child per position, ``lengths`` per row), and anything else
a *leaf*: one column of ``values``, one per row, with the codec
``_choose_leaf_codec`` picks for it. A row without a key has ``MISSING``
there; a null row or an explicit ``None`` has ``None``. Paths name the
leaves: ``root.key`` and ``root[0]``, with ``.``, ``[`` and ``\\`` in keys
escaped by a backslash.

Codecs: ``ragged_tensor`` (tensors of one dtype, any shapes),
``typed_ragged`` (sequences of numbers), ``ndarray`` (numbers),
``bytes_ragged``, ``utf8_ragged``, and ``msgpack_ragged`` (whatever msgpack
can encode: dicts, lists, mixed kinds). ``accepted`` is False when the
column has no value at all, or when the codec cannot hold every value (a
tensor of another dtype, an object msgpack cannot encode): those are the
columns that would be stored another way.

Not here yet: writing and reading structured objects themselves (the
module's store calls); docs/store.md, "What is not here yet".
"""

import numbers

__all__ = ["MISSING", "LeafDecision", "Leaf", "Node", "infer_structure"]

MAX_DEPTH = 32  # nesting past this is refused (ValueError), not recursed into


class _Missing:
    """A key a row did not have (unlike an explicit None)."""

    _instance = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self):
        return "MISSING"

    def __bool__(self):
        return False


MISSING = _Missing()


class LeafDecision:
    """The codec of one column, and whether it holds every value."""

    __slots__ = ("codec", "accepted", "reason")

    def __init__(self, codec, accepted, reason=""):
        self.codec, self.accepted, self.reason = codec, accepted, reason

    def __repr__(self):
        return "LeafDecision(%r, accepted=%r%s)" % (
            self.codec, self.accepted, ", %r" % self.reason if self.reason else "")


class Leaf:
    """One column: its path, a value per row, its codec."""

    __slots__ = ("path", "values", "decision")

    def __init__(self, path, values, decision):
        self.path, self.values, self.decision = path, values, decision


class Node:
    """A container position: "dict" (children: its keys) or "list"
    (children: positions, lengths: each row's length); row_mask says which
    rows hold the container there (None: all of them)."""

    __slots__ = ("path", "node_type", "children", "lengths", "row_mask")

    def __init__(self, path, node_type, children, lengths=None, row_mask=None):
        self.path, self.node_type, self.children = path, node_type, children
        self.lengths, self.row_mask = lengths, row_mask


def _escape_key(key):
    """A dict key as a path part: backslash, dot and "[" escaped."""
    return str(key).replace("\\", "\\\\").replace(".", "\\.").replace("[", "\\[")


def _absent(value):
    return value is None or value is MISSING


def _is_tensor(value):
    return type(value).__module__.split(".")[0] == "torch" and hasattr(value, "dtype") \
        and hasattr(value, "shape")


def _is_number(value):
    return isinstance(value, numbers.Number) and not isinstance(value, complex)


def _is_number_sequence(value):
    return isinstance(value, (list, tuple)) and all(_is_number(v) for v in value)


def _unpackable(value, depth=0):
    """What in value msgpack could not encode (a type it lacks, or nesting
    past MAX_DEPTH), or None when it could encode all of it."""
    if depth > MAX_DEPTH:
        return value
    if value is None or isinstance(value, (bool, int, float, str, bytes, bytearray)):
        return None
    if isinstance(value, dict):
        parts = [p for kv in value.items() for p in kv]
    elif isinstance(value, (list, tuple)):
        parts = value
    else:
        return value
    return next((bad for bad in (_unpackable(p, depth + 1) for p in parts) if bad is not None),
                None)


# (codec, test of one present value), in the order they are tried.
_KINDS = [
    ("ragged_tensor", _is_tensor),
    ("ndarray", _is_number),
    ("bytes_ragged", lambda v: isinstance(v, (bytes, bytearray))),
    ("utf8_ragged", lambda v: isinstance(v, str)),
    ("typed_ragged", _is_number_sequence),
]


def _choose_leaf_codec(values):
    """The LeafDecision for a column of values (None and MISSING are nulls)."""
    present = [v for v in values if not _absent(v)]
    if not present:
        return LeafDecision("msgpack_ragged", False, "no value to store")
    for codec, fits in _KINDS:
        if all(fits(v) for v in present):
            if codec == "ragged_tensor" and len({str(v.dtype) for v in present}) > 1:
                return LeafDecision(codec, False, "tensors of several dtypes")
            return LeafDecision(codec, True)
    bad = next((b for b in map(_unpackable, present) if b is not None), None)
    if bad is not None:
        return LeafDecision("msgpack_ragged", False,
                            "msgpack cannot encode a %s" % type(bad).__name__)
    return LeafDecision("msgpack_ragged", True)


def _is_container_list(value):
    """A list holding a dict or a list: a node, not a column."""
    return isinstance(value, (list, tuple)) and any(isinstance(v, (dict, list, tuple))
                                                    for v in value)


def _mask(values, kind):
    """Which rows hold a kind there; None when every row does."""
    mask = [isinstance(v, kind) for v in values]
    return None if all(mask) else mask


def _child(parent, pick):
    """A row's value below its parent's: the parent's null passes down."""
    return parent if _absent(parent) else pick(parent)


def infer_structure(path, values, leaves, nodes, depth=0):
    """Walks values (one per row) at path, appending a Leaf per column to
    leaves and a Node per container to nodes. ValueError past MAX_DEPTH."""
    if depth > MAX_DEPTH:
        raise ValueError("%s: nested deeper than %d levels" % (path, MAX_DEPTH))
    present = [v for v in values if not _absent(v)]
    if present and all(isinstance(v, dict) for v in present):
        keys = list(dict.fromkeys(k for v in present for k in v))
        nodes.append(Node(path, "dict", keys, row_mask=_mask(values, dict)))
        for key in keys:
            column = [_child(v, lambda d: d.get(key, MISSING)) for v in values]
            infer_structure("%s.%s" % (path, _escape_key(key)), column, leaves, nodes, depth + 1)
        return
    if present and all(isinstance(v, (list, tuple)) for v in present) \
            and any(_is_container_list(v) for v in present):
        lengths = [len(v) if isinstance(v, (list, tuple)) else 0 for v in values]
        width = max(lengths)
        nodes.append(Node(path, "list", list(range(width)), lengths=lengths,
                          row_mask=_mask(values, (list, tuple))))
        for i in range(width):
            column = [_child(v, lambda s: s[i] if i < len(s) else MISSING) for v in values]
            infer_structure("%s[%d]" % (path, i), column, leaves, nodes, depth + 1)
        return
    leaves.append(Leaf(path, list(values), _choose_leaf_codec(values)))
