"""test_mooncake_structured.py - mooncake.structured_object_store's cut of
structured rows into columns (leaves) and containers (nodes), and each
column's codec: nulls against missing keys, list positions, escaped keys,
the depth bound, and the codecs that refuse a column."""

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

from mooncake.structured_object_store import (  # noqa: E402
    MAX_DEPTH, MISSING, _choose_leaf_codec, _escape_key, infer_structure)


def cut(rows):
    leaves, nodes = [], []
    infer_structure("r", rows, leaves, nodes)
    return {leaf.path: leaf for leaf in leaves}, nodes


def test_rows_of_dicts_keep_nulls_apart_from_missing_keys():
    leaves, nodes = cut([{"a": 1, "b": {"c": "x"}}, None, {"b": None}, {"a": 2.5, "b": {"c": "y"}}])
    assert [(n.path, n.node_type) for n in nodes] == [("r", "dict"), ("r.b", "dict")]
    assert nodes[0].children == ["a", "b"]
    assert nodes[0].row_mask == [True, False, True, True]
    assert nodes[1].row_mask == [True, False, False, True]
    assert leaves["r.a"].values == [1, None, MISSING, 2.5]
    assert leaves["r.a"].decision.codec == "ndarray"
    assert leaves["r.b.c"].values == ["x", None, None, "y"]
    assert leaves["r.b.c"].decision.codec == "utf8_ragged"


def test_lists_of_containers_are_cut_by_position():
    leaves, nodes = cut([[{"k": 1}, b"ab"], [{"k": 2}], None])
    assert nodes[0].node_type == "list" and nodes[0].lengths == [2, 1, 0]
    assert nodes[0].row_mask == [True, True, False]
    assert leaves["r[0].k"].values == [1, 2, None]
    assert leaves["r[1]"].values == [b"ab", MISSING, None]
    assert leaves["r[1]"].decision.codec == "bytes_ragged"


def test_numbers_in_lists_stay_one_column():
    leaves, nodes = cut([[1, 2, 3], [4.5], []])
    assert nodes == []
    assert leaves["r"].decision.codec == "typed_ragged" and leaves["r"].decision.accepted


def test_keys_are_escaped_in_paths():
    assert _escape_key("a.b[0]\\c") == "a\\.b\\[0]\\\\c"
    leaves, _ = cut([{"x.y": 1}])
    assert list(leaves) == ["r.x\\.y"]


def test_nesting_past_the_bound_is_refused():
    deep = 1
    for _ in range(MAX_DEPTH + 2):
        deep = {"a": deep}
    with pytest.raises(ValueError, match="deeper than"):
        cut([deep])
    shallow = 1
    for _ in range(MAX_DEPTH - 1):
        shallow = {"a": shallow}
    cut([shallow])


def test_codecs_refuse_what_they_cannot_hold():
    assert not _choose_leaf_codec([]).accepted
    assert not _choose_leaf_codec([None, MISSING]).accepted
    late = _choose_leaf_codec([{"ok": i} for i in range(300)] + [{"bad": object()}])
    assert late.codec == "msgpack_ragged" and not late.accepted and "object" in late.reason
    assert _choose_leaf_codec([1, "a", [2]]).codec == "msgpack_ragged"
    torch = pytest.importorskip("torch")
    assert _choose_leaf_codec([torch.zeros(2), torch.zeros(1, 3)]).accepted
    mixed = _choose_leaf_codec([torch.zeros(2), torch.zeros(2, dtype=torch.int64)])
    assert mixed.codec == "ragged_tensor" and not mixed.accepted
