"""Differential tensors: rows compared by their bits, a delta patched back exactly."""

import pytest
import torch

from recovery.errors import FormatError
from recovery.format import delta


@pytest.mark.parametrize(
    ("shape", "dtype", "min_bytes", "expected"),
    [
        ((100, 8), torch.float32, 1024, True),
        ((100, 8), torch.float32, 3201, False),  # 3200 bytes: below the threshold
        ((1, 1000), torch.float32, 0, False),  # one row: nothing to pick
        ((1000,), torch.float32, 0, True),  # rows of one element (a bias table)
        ((), torch.float32, 0, False),
        ((100, 8), torch.bfloat16, 0, True),
        ((100, 8), torch.complex128, 0, False),  # 16-byte elements: no integer view
    ],
)
def test_is_table(shape, dtype, min_bytes, expected):
    assert delta.is_table(torch.zeros(shape, dtype=dtype), min_bytes) is expected


@pytest.mark.parametrize(
    ("changed", "rows", "row_bytes", "expected"),
    [
        (0, 100, 32, True),
        (79, 100, 32, True),  # 79 * 40 = 3160 < 3200
        (80, 100, 32, False),  # 80 * 40 = 3200: not smaller
        (100, 100, 32, False),
        (1, 100, 4, True),
        (67, 100, 4, False),  # a 4-byte row's index costs twice the row
    ],
)
def test_pays(changed, rows, row_bytes, expected):
    assert delta.pays(changed, rows, row_bytes) is expected


def test_changed_rows_compares_bits_not_values():
    base = torch.zeros(5, 3)
    base[1, 0] = float("nan")
    now = base.clone()
    now[2, 1] = -0.0  # equal to 0.0 as a value, other bits
    now[4, 2] = 1.0
    assert delta.changed_rows(now, base).tolist() == [2, 4]  # the NaN row is unchanged


def test_diff_then_patch_is_the_full_tensors_bit_for_bit():
    torch.manual_seed(0)
    base = {"table": torch.randn(1000, 4), "small": torch.randn(3), "moment": torch.randn(1000)}
    now = {k: v.clone() for k, v in base.items()}
    now["table"][[3, 10, 999]] += 1
    now["moment"][7] = float("inf")
    now["small"] += 1
    now["new"] = torch.randn(1000, 4)  # not in the base: written whole
    stored, tables = delta.diff(now, base, 0)
    assert tables == {
        "table": {"changed": 3, "rows": 1000},
        "moment": {"changed": 1, "rows": 1000},
    }
    assert stored[delta.ROWS + "table"].tolist() == [3, 10, 999]
    assert {"small", "new"} <= stored.keys() and "table" not in stored
    full = delta.patch(stored, base, tables, where="x")
    assert full.keys() == now.keys()
    for key, t in now.items():
        assert torch.equal(full[key].view(torch.int32), t.view(torch.int32)), key
    assert torch.equal(base["table"][3], base["table"][3])  # the base is not modified


def test_a_table_that_changed_everywhere_is_written_whole():
    base = {"t": torch.zeros(100, 4)}
    stored, tables = delta.diff({"t": torch.ones(100, 4)}, base, 0)
    assert tables == {} and torch.equal(stored["t"], torch.ones(100, 4))


def test_a_shape_change_is_written_whole():
    stored, tables = delta.diff({"t": torch.zeros(200, 4)}, {"t": torch.zeros(100, 4)}, 0)
    assert tables == {} and stored["t"].shape == (200, 4)


def test_keys_that_look_like_ours_keep_the_component_whole():
    now = {delta.ROWS + "x": torch.zeros(100), "t": torch.zeros(100, 4)}
    stored, tables = delta.diff(now, {"t": torch.ones(100, 4)}, 0)
    assert tables == {} and stored.keys() == now.keys()
    assert delta.patch(stored, {}, {}, where="x").keys() == now.keys()


def _stored(rows, values):
    return {delta.ROWS + "t": rows, delta.VALUES + "t": values}


@pytest.mark.parametrize(
    ("stored", "words"),
    [
        ({delta.ROWS + "t": torch.tensor([1])}, "no stored rows or values"),
        (_stored(torch.tensor([1], dtype=torch.int32), torch.zeros(1, 4)), "1-D int64"),
        (_stored(torch.tensor([10]), torch.zeros(1, 4)), "rows outside 0..9"),
        (_stored(torch.tensor([-1]), torch.zeros(1, 4)), "rows outside 0..9"),
        (_stored(torch.tensor([3, 3]), torch.zeros(2, 4)), "not ascending and unique"),
        (_stored(torch.tensor([4, 3]), torch.zeros(2, 4)), "not ascending and unique"),
        (_stored(torch.tensor([3]), torch.zeros(2, 4)), "expected torch.float32 [1, 4]"),
        (_stored(torch.tensor([3]), torch.zeros(1, 4, dtype=torch.float64)), "float64"),
    ],
)
def test_patch_refuses_rows_that_do_not_fit_the_base(stored, words):
    with pytest.raises(FormatError, match="t.safetensors: patched table 't'") as err:
        delta.patch(stored, {"t": torch.zeros(10, 4)}, {"t": {}}, where="t.safetensors")
    assert words in str(err.value)


def test_patch_refuses_a_table_the_base_lacks_and_rows_state_json_does_not_list():
    stored = _stored(torch.tensor([1]), torch.zeros(1, 4))
    with pytest.raises(FormatError, match="not in the base checkpoint"):
        delta.patch(stored, {}, {"t": {}}, where="w")
    listed = {delta.ROWS + "u": torch.tensor([0]), delta.VALUES + "u": torch.zeros(1, 4)}
    base = {"t": torch.zeros(4, 4), "u": torch.zeros(4, 4)}
    with pytest.raises(FormatError, match="delta rows of 't', which state.json does not list"):
        delta.patch({**stored, **listed}, base, {"u": {}}, where="w")
