"""The reduce-first finiteness checks and flat copies the guard is built on."""

import math

import numpy as np
import pytest
import torch as th
from conftest import DEVICES
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from sb3_safe.common.numerics import (
    ArrayFiniteCheck,
    DerivedOnChange,
    FlatCopy,
    GradientNorm,
    TensorFiniteCheck,
    find_nonfinite,
    note_restore,
)

EXTREMES = st.sampled_from([0.0, -0.0, 1e-45, 1e30, -1e30, 3.4e38, -3.4e38, 1.7e308, math.inf, -math.inf, math.nan])


def float_arrays(dtype: type) -> st.SearchStrategy[np.ndarray]:
    finite_max = float(np.finfo(dtype).max)
    extremes = EXTREMES.filter(lambda x: not abs(x) > finite_max or math.isinf(x))
    values = st.one_of(st.floats(-finite_max, finite_max, width=np.finfo(dtype).bits), extremes)
    return hnp.arrays(dtype, hnp.array_shapes(min_dims=0, max_dims=3, max_side=5), elements=values)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(float_arrays(np.float32), float_arrays(np.float64)), min_size=1, max_size=4))
def test_array_check_agrees_with_isfinite(arrays: list[np.ndarray]) -> None:
    check = ArrayFiniteCheck()
    expected = all(bool(np.isfinite(array).all()) for array in arrays)
    with np.errstate(invalid="ignore"):
        # Twice: the second call reuses the cached zeros
        assert check(*arrays) is expected
        assert check(*arrays) is expected


def test_array_check_skips_integers_and_tests_complex() -> None:
    check = ArrayFiniteCheck()
    assert check(np.arange(5), np.array([True, False]), np.zeros((2, 2), np.uint8))
    assert not check(np.array([1 + 1j, complex(math.nan, 0)]))
    with np.errstate(invalid="ignore"):
        # A finite array of one size, then a non-finite one of another: the zeros cache is per size
        assert check(np.ones(3, np.float32)) and not check(np.array([1.0, math.inf], np.float32))


def named_tensors(device: str = "cpu") -> list[tuple[str, th.Tensor]]:
    return [
        ("weight", th.randn(4, 3, device=device)),
        ("bias", th.randn(4, device=device)),
        ("step", th.tensor(7, dtype=th.int64, device=device)),
        ("scalar", th.tensor(0.5, dtype=th.float64, device=device)),
        ("empty", th.empty(0, device=device)),
    ]


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=100, deadline=None)
@given(index=st.sampled_from([0, 1, 3]), position=st.integers(0, 11), bad=EXTREMES.filter(lambda x: not math.isfinite(x)))
def test_flat_copy_detects_any_bad_element_and_names_it(device: str, index: int, position: int, bad: float) -> None:
    named = named_tensors(device)
    copy = FlatCopy(named)
    assert copy.update()
    tensor = named[index][1]
    tensor.view(-1)[position % tensor.numel()] = bad
    with np.errstate(invalid="ignore"):
        assert not copy.update()
    found = copy.find_nonfinite()
    assert [entry.name for entry in found] == [named[index][0]]
    assert (found[0].n_nan, found[0].n_inf) == ((1, 0) if math.isnan(bad) else (0, 1))


def test_flat_copy_restores_every_tensor_including_integer_ones(device: str) -> None:
    named = named_tensors(device)
    copy = FlatCopy(named)
    saved = [tensor.clone() for _, tensor in named]
    assert copy.update()
    for _, tensor in named:
        tensor.fill_(3)
    copy.restore()
    for (_, tensor), before in zip(named, saved, strict=True):
        assert th.equal(tensor, before)


def test_flat_copy_follows_a_tensor_given_new_storage(device: str) -> None:
    param = th.nn.Parameter(th.ones(5, device=device))
    copy = FlatCopy([("param", param)])
    assert copy.update()
    param.data = th.ones(5, device=device)  # new storage: the old alias would still read ones
    param.data[2] = math.nan
    assert not copy.update()
    assert copy.find_nonfinite()[0].n_nan == 1


def test_flat_copy_of_non_contiguous_tensors(device: str) -> None:
    base = th.randn(4, 6, device=device)
    transposed = base.t()
    copy = FlatCopy([("transposed", transposed)])
    assert copy.update() and th.equal(copy.get("transposed"), transposed)
    base[1, 2] = math.inf
    with np.errstate(invalid="ignore"):
        assert not copy.update()


@pytest.mark.parametrize("with_missing_grad", [False, True])
def test_gradient_norm_equals_torch_total_norm(with_missing_grad: bool, device: str) -> None:
    th.manual_seed(0)
    net = th.nn.Sequential(th.nn.Linear(3, 8), th.nn.Tanh(), th.nn.Linear(8, 2)).to(device)
    extra = th.nn.Parameter(th.ones(4, device=device))
    params = [*net.parameters(), extra]
    norm = GradientNorm(params)
    assert norm() is None
    loss = net(th.randn(16, 3, device=device)).square().sum() + (0.0 if with_missing_grad else extra.sum() * 1e3)
    loss.backward()
    expected = th.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None]).item()
    assert norm() == pytest.approx(expected, rel=1e-5)


def test_find_nonfinite_counts_and_skips_integer_data() -> None:
    data = np.array([[1.0, math.nan], [math.inf, -math.inf]])
    found = find_nonfinite([("array", data), ("ints", np.arange(3)), ("tensor", th.tensor([math.nan, 1.0]))])
    assert [str(entry) for entry in found] == ["array: 1 NaN, 2 inf of 4", "tensor: 1 NaN, 0 inf of 2"]


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.one_of(float_arrays(np.float32), float_arrays(np.float64)), min_size=1, max_size=4),
    st.booleans(),
)
def test_tensor_check_agrees_with_isfinite(device: str, arrays: list[np.ndarray], contiguous: bool) -> None:
    # Values up to the float maximum: their squares overflow, which must not count as non-finite
    tensors = [th.from_numpy(np.array(array, ndmin=1)).to(device) for array in arrays]
    if not contiguous:  # the torch path (as on a GPU)
        tensors = [th.stack([t, t], dim=-1)[..., 0] for t in tensors]
    check = TensorFiniteCheck(tensors)
    assert check() is all(bool(th.isfinite(t).all()) for t in tensors)


def test_tensor_check_follows_a_tensor_given_new_storage(device: str) -> None:
    param = th.nn.Parameter(th.ones(5, device=device))
    check = TensorFiniteCheck([param, th.arange(3, device=device)])
    assert check()
    param.data = th.ones(5, device=device)
    param.data[2] = math.inf
    assert not check()


def test_tensor_check_of_mixed_dtypes_on_the_torch_path(device: str) -> None:
    transposed = th.randn(3, 4, device=device).t()  # not contiguous: the torch path
    check = TensorFiniteCheck([transposed, th.ones(2, dtype=th.float64, device=device)])
    assert check()
    transposed[1, 1] = math.nan
    assert not check()


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=60, deadline=None)
@given(
    shapes=st.lists(st.tuples(st.integers(0, 5), st.integers(1, 4)), min_size=1, max_size=8),
    dtypes=st.lists(st.sampled_from([th.float32, th.float64, th.int64]), min_size=8, max_size=8),
    compared=st.lists(st.booleans(), min_size=8, max_size=8),
    changed=st.integers(0, 7),
)
def test_flat_copy_equal_to_compares_exactly_the_named_tensors(
    device: str, shapes: list[tuple[int, int]], dtypes: list[th.dtype], compared: list[bool], changed: int
) -> None:
    """The stall watch's "parameters unchanged": runs of the named tensors in each buffer, mixed dtypes, empty ones."""
    dtypes = dtypes[: len(shapes)]
    tensors = [
        th.arange(rows * cols, dtype=dtype, device=device).reshape(rows, cols)
        for (rows, cols), dtype in zip(shapes, dtypes, strict=False)
    ]
    named = [(f"t{i}", tensor) for i, tensor in enumerate(tensors)]
    names = {name for (name, _), keep in zip(named, compared, strict=False) if keep}
    first, second = FlatCopy(named), FlatCopy(named)
    first.update()
    second.update()
    assert first.equal_to(second, names) and first.equal_to(second, names)  # the second call reads the cached runs
    changed %= len(tensors)
    if tensors[changed].numel():
        tensors[changed].view(-1)[-1] += 1
        second.update()
        assert first.equal_to(second, names) == (f"t{changed}" not in names)
        assert first.equal_to(second, {f"t{changed}"}) is False


# ----- values derived once per change of their sources -----


class CountingSum:
    """A derivation that counts its calls: the sum of its tensors, as a float64 tensor on their device."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, *sources: th.Tensor) -> th.Tensor:
        self.calls += 1
        return sum(source.double().sum() for source in sources)


def test_a_derived_value_is_derived_once_while_its_sources_are_not_written() -> None:
    mean, var = th.zeros(3, dtype=th.float64), th.ones(3, dtype=th.float64)
    derive = CountingSum()
    derived = DerivedOnChange(derive)
    assert derived.get(mean, var).item() == 3.0 and derive.calls == 1
    for _ in range(5):
        assert derived.get(mean, var).item() == 3.0
    # reads (a forward pass, a snapshot's copy, a state dict) are not writes
    mean.clone(), var.sum(), {"var": var.detach()}
    assert derived.get(mean, var).item() == 3.0 and derive.calls == 1


@pytest.mark.parametrize("device", DEVICES)
def test_a_derived_value_follows_every_kind_of_change_of_its_sources(device: str) -> None:
    mean, var = th.zeros(3, dtype=th.float64, device=device), th.ones(3, dtype=th.float64, device=device)
    derive = CountingSum()
    derived = DerivedOnChange(derive)
    derived.get(mean, var)
    # in place, as an optimizer or merge_moments_into writes
    mean.add_(1.0)
    assert derived.get(mean, var).item() == 6.0 and derive.calls == 2
    # through .data, outside autograd's version counters: a rollback's FlatCopy.restore says so (note_restore)
    copy = FlatCopy([("var", var)])
    assert copy.update()  # keeps var = 1
    var.data.fill_(2.0)
    note_restore()
    assert derived.get(mean, var).item() == 9.0 and derive.calls == 3
    version = var._version
    copy.restore()
    assert var._version == version
    assert derived.get(mean, var).item() == 6.0 and derive.calls == 4
    var.data.fill_(2.0)
    note_restore()
    assert derived.get(mean, var).item() == 9.0 and derive.calls == 5
    # one element of the second source only
    var[2] = 3.0
    assert derived.get(mean, var).item() == 10.0 and derive.calls == 6
    # the same values in another dtype (a module's .float()): derived again, in the new dtype's terms
    assert derived.get(mean.float(), var).item() == 10.0 and derive.calls == 7
    assert derived.get(mean, var).item() == 10.0 and derive.calls == 8
    # the same values on the CPU where they were on an accelerator (a module's .to(device))
    if device != "cpu":
        assert derived.get(mean.cpu(), var.cpu()).device.type == "cpu" and derive.calls == 9
