import numpy as np
import pytest
import torch

from polyrl.batch import Batch


def _part(ids, width, pad=-1):
    rows = [row + [pad] * (width - len(row)) for row in ids]
    return Batch(
        {
            "input_ids": torch.tensor(rows),
            "attention_mask": torch.tensor([[int(t != pad) for t in row] for row in rows]),
        },
        {"uid": [f"u{i}" for i in range(len(ids))]},
        {"source": "first"},
    )


def test_concat_pads_each_key_with_its_value():
    a = _part([[1, 2, 3]], 3)
    b = _part([[4]], 1)
    b.meta = {"source": "second"}
    out = Batch.concat([a, b], pad_values={"input_ids": 99})
    assert out["input_ids"].tolist() == [[1, 2, 3], [4, 99, 99]]
    assert out["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]  # default pad value 0
    assert list(out["uid"]) == ["u0", "u0"]
    assert out.meta == {"source": "first"}


def test_concat_default_pad_is_zero_and_keeps_dtypes():
    a = Batch({"mask": torch.ones(1, 3, dtype=torch.bool), "lp": torch.ones(1, 3)})
    b = Batch({"mask": torch.ones(2, 2, dtype=torch.bool), "lp": torch.ones(2, 2)})
    out = Batch.concat([a, b])
    assert out["mask"].dtype == torch.bool
    assert out["mask"].tolist() == [[True] * 3, [True, True, False], [True, True, False]]
    assert out["lp"][1:, 2].tolist() == [0.0, 0.0]


def test_concat_in_order_and_skips_empty_parts():
    parts = [Batch({"x": torch.tensor([i, i])}, {"n": [i, i]}) for i in range(3)]
    out = Batch.concat([Batch(), parts[0], parts[1].slice(0, 0), parts[1], parts[2]])
    assert out["x"].tolist() == [0, 0, 1, 1, 2, 2]
    assert list(out["n"]) == [0, 0, 1, 1, 2, 2]
    assert len(Batch.concat([])) == 0


def test_concat_refuses_parts_with_different_keys():
    a = Batch({"x": torch.zeros(1), "y": torch.zeros(1)}, {"uid": ["a"]})
    b = Batch({"x": torch.zeros(1), "z": torch.zeros(1)}, {"uid": ["b"]})
    with pytest.raises(ValueError, match=r"part 1 lacks \['y'\], has extra \['z'\]") as info:
        Batch.concat([a, b])
    assert "part 0 has tensors ['x', 'y'] and non-tensors ['uid']" in str(info.value)


def test_concat_names_the_part_by_its_position_among_all_parts():
    a = Batch({"x": torch.zeros(1)})
    c = Batch({"x": torch.zeros(1)}, {"extra": np.array(["e"], dtype=object)})
    with pytest.raises(ValueError, match=r"part 2 has extra \['extra'\]"):
        Batch.concat([a, Batch(), c])


def test_concat_refuses_a_key_that_is_a_tensor_in_one_part_only():
    a = Batch({"x": torch.zeros(1)})
    b = Batch(non_tensors={"x": ["a"]})
    with pytest.raises(ValueError, match="tensor in one part and non-tensor"):
        Batch.concat([a, b])
