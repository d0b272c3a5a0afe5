"""Finiteness checks and the error they raise, and running statistics, shared by policies, algorithms and callbacks."""

import math
from collections.abc import Callable, Container, Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np
import torch as th

Derived = TypeVar("Derived")


class NonFiniteError(FloatingPointError):
    """
    A tensor that must be finite holds NaN or inf.

    The message names the tensor, how many of its elements are NaN / inf, and, where known,
    the timestep, the training phase and the likely causes.
    """


class TrainingStalledError(NonFiniteError):
    """
    Training runs but no longer learns: every optimizer step of many updates in a row was skipped, a loss was
    non-finite at each of them, or they left the parameters unchanged (raised by
    :class:`~sb3_safe.NonFiniteGuardCallback` in ``"raise"`` mode). A :class:`NonFiniteError`, so that code catching
    those catches it too.
    """


@th.no_grad()
def merge_moments_into(
    moments: tuple[th.Tensor, th.Tensor, th.Tensor],
    other_mean: th.Tensor,
    other_var: th.Tensor,
    other_count: float,
) -> None:
    """
    Join a second set of samples into running moments, in place (the guard's snapshots copy and restore those very
    tensors): Chan et al.'s parallel update, no sum of squares, so no cancellation where the mean is far larger than
    the spread. Six tensor operations whatever the shapes: a statistics update runs once per rollout.

    :param moments: the buffers of the first set's mean, population variance and size (0-d; may be 0)
    :param other_mean: the second set's mean
    :param other_var: its population variance
    :param other_count: its size (> 0 unless the first set's is)
    """
    mean, var, count = moments
    first_count = count.item()
    if first_count == 0:  # nothing to merge with (a first rollout, empty pending statistics): three copies
        mean.copy_(other_mean)
        var.copy_(other_var)
        count.fill_(other_count)
        return
    total = first_count + other_count
    delta = other_mean - mean
    mean.add_(delta, alpha=other_count / total)
    var.mul_(first_count / total).add_(other_var, alpha=other_count / total)
    var.addcmul_(delta, delta, value=first_count * other_count / total**2)
    count.fill_(total)


#: Bumped by every write into tensors outside autograd's version counters (:meth:`FlatCopy.restore`): values derived
#: from tensors (:class:`DerivedOnChange`) are derived again after it
_restores = 0


def note_restore() -> None:
    """Say that tensors were written outside their version counters (through ``.data``): derived values go stale."""
    global _restores
    _restores += 1


class DerivedOnChange(Generic[Derived]):
    """
    A value derived from some tensors (a module's statistics), derived again only when they are written: forward passes
    that read it at every call pay a comparison of version counters, no tensor operation. A write is an in-place
    operation (which bumps the tensor's version counter: an optimizer, :func:`merge_moments_into`, ``load_state_dict``),
    a restore through ``.data`` (:meth:`FlatCopy.restore`, which calls :func:`note_restore`), or a move to another
    device or dtype (``.to()``, which replaces a module's buffers). A plain object, not buffers: a module's buffers are
    looked up by ``Module.__getattr__``, slow at every call.

    :param derive: computes the value from the tensors, in the order :meth:`get` receives them
    """

    def __init__(self, derive: Callable[..., Derived]) -> None:
        self.derive = derive
        #: what identifies the sources' contents when the value was derived, and the value
        self._stamp: tuple[object, ...] = ()
        self._value: Derived | None = None

    def get(self, *sources: th.Tensor) -> Derived:
        """
        :param sources: the tensors, current values
        :return: the value derived from them
        """
        stamp = (_restores, *((source._version, source.data_ptr(), source.dtype) for source in sources))
        if self._value is None or stamp != self._stamp:
            self._value = self.derive(*sources)
            self._stamp = stamp
        return self._value


def count_nonfinite(tensor: th.Tensor) -> tuple[int, int, int]:
    """
    Count the bad elements of a tensor.

    :param tensor: any tensor
    :return: (number of NaN, number of +-inf, number of elements)
    """
    detached = tensor.detach()
    return int(th.isnan(detached).sum()), int(th.isinf(detached).sum()), detached.numel()


def describe_nonfinite(name: str, tensor: th.Tensor) -> str:
    """
    One line naming a non-finite tensor, e.g. ``policy.log_std: 2 NaN, 0 inf of 4``.

    :param name: what the tensor is
    :param tensor: the tensor
    """
    n_nan, n_inf, numel = count_nonfinite(tensor)
    return f"{name}: {n_nan} NaN, {n_inf} inf of {numel}"


def is_finite(tensor: th.Tensor) -> bool:
    """
    Whether every element is finite, with one reduction and one host sync.

    ``0 * x`` is 0 for every finite ``x`` and NaN for NaN or inf, so the sum of ``0 * tensor`` is NaN iff some
    element is NaN or inf: exact, with no overflow on large finite values, and fewer operations than a
    max-abs or ``isfinite().all()`` (small tensors in a training step cost their dispatch, not their math).

    :param tensor: any real tensor
    """
    numel = tensor.numel()
    if numel == 1:
        return math.isfinite(tensor.item())
    if numel == 0:
        return True
    return math.isfinite(tensor.detach().mul(0).sum().item())


def check_finite(name: str, tensor: th.Tensor, hint: str = "") -> None:
    """
    Raise :class:`NonFiniteError` naming ``tensor`` if it holds NaN or inf.

    :param name: what the tensor is, used in the message
    :param tensor: the tensor to check
    :param hint: likely causes and fixes, appended to the message
    """
    if not is_finite(tensor):
        message = describe_nonfinite(name, tensor)
        raise NonFiniteError(f"{message}. {hint}".strip())


@dataclass(frozen=True)
class NonFiniteTensor:
    """
    A named tensor or array found to hold NaN or inf.

    :param name: what the tensor is, e.g. ``policy.log_std`` or ``reward of env 3``
    :param n_nan: number of NaN elements
    :param n_inf: number of +-inf elements
    :param numel: number of elements
    """

    name: str
    n_nan: int
    n_inf: int
    numel: int

    def __str__(self) -> str:
        return f"{self.name}: {self.n_nan} NaN, {self.n_inf} inf of {self.numel}"


def find_nonfinite(named: Iterable[tuple[str, th.Tensor | np.ndarray]]) -> list[NonFiniteTensor]:
    """
    Locate the non-finite tensors or arrays among ``named``, in order, with exact counts.

    This is the slow path, run only after a cheap reduction has failed.

    :param named: (name, tensor or array) pairs
    :return: one entry per tensor holding NaN or inf
    """
    found = []
    for name, value in named:
        if isinstance(value, th.Tensor):
            if not value.is_floating_point() or is_finite(value):
                continue
            n_nan, n_inf, numel = count_nonfinite(value)
        else:
            value = np.asarray(value)
            if value.dtype.kind not in "fc" or np.isfinite(value).all():
                continue
            n_nan, n_inf, numel = int(np.isnan(value).sum()), int(np.isinf(value).sum()), value.size
        found.append(NonFiniteTensor(name, n_nan, n_inf, numel))
    return found


#: Arrays at least this large are reduced where they are; smaller ones are packed into one buffer first: a numpy call
#: costs about as much as reducing a few thousand floats, and a training step's tensors are mostly small
_OWN_REDUCTION_SIZE = 8192


def _sum_of_squares_is_finite(flat: np.ndarray) -> bool:
    """
    Whether a 1-D float array is all finite: the sum of squares (one BLAS dot, which sets no floating-point flags) is
    NaN or inf when an element is; finite values beyond ~1e19 (float32) can overflow it, so a failed sum is confirmed
    element by element before it counts.
    """
    return math.isfinite(flat.dot(flat)) or bool(np.isfinite(flat).all())


def _packing_dtype(arrays: Iterable[np.ndarray]) -> np.dtype:
    """float32 or float64: numpy's own float16 dot warns on overflow, so half precision is packed as float32."""
    return np.result_type(np.float32, *(array.dtype for array in arrays))


class ArrayFiniteCheck:
    """
    Whether numpy arrays are all finite, cheap enough for every environment step: one reduction for all of them.

    The float arrays (env data is small) are packed into one by ``np.concatenate`` and reduced by
    :func:`_sum_of_squares_is_finite`. Integer arrays cannot be non-finite and are skipped.
    """

    def __call__(self, *arrays: np.ndarray) -> bool:
        """
        :param arrays: numpy arrays of any shape and dtype
        :return: whether every element of every array is finite
        """
        floats = []
        for array in arrays:
            kind = array.dtype.kind
            if kind == "f":
                floats.append(array.ravel())
            elif kind == "c" and not np.isfinite(array).all():
                return False
        if not floats:
            return True
        flat = floats[0] if len(floats) == 1 else np.concatenate(floats)
        if flat.dtype == np.float16:
            flat = flat.astype(np.float32)
        return _sum_of_squares_is_finite(flat)


class TensorFiniteCheck:
    """
    Whether a fixed list of tensors is all finite, read in place: the per-optimizer-step check.

    On CPU the tensors are read through numpy views of their memory: each large one is reduced where it is, the small
    ones are first packed into one buffer (one copy, one call), each by :func:`_sum_of_squares_is_finite`. Elsewhere
    (GPU) one fused max-abs per call, with one host sync.

    :param tensors: the tensors (e.g. the parameters one optimizer updates); integer ones are skipped
    """

    def __init__(self, tensors: Iterable[th.Tensor]) -> None:
        self.tensors = [t for t in tensors if t.is_floating_point() and t.numel() > 0]
        self._make_views()

    def _make_views(self) -> None:
        on_numpy = all(
            t.device.type == "cpu" and t.dtype in (th.float16, th.float32, th.float64) and t.is_contiguous()
            for t in self.tensors
        )
        self._storage = [t.data_ptr() for t in self.tensors]
        self._large: list[np.ndarray] | None = None
        if not on_numpy:
            return
        arrays = [t.detach().numpy().reshape(-1) for t in self.tensors]
        self._large = [a for a in arrays if a.size >= _OWN_REDUCTION_SIZE and a.dtype != np.float16]
        large_ids = {id(a) for a in self._large}
        self._small = [a for a in arrays if id(a) not in large_ids]
        self._packed = np.empty(sum(a.size for a in self._small), _packing_dtype(self._small))

    def __call__(self, check_storage: bool = True) -> bool:
        """
        :param check_storage: look for tensors given new storage since the last call (skip only where nothing but
            in-place updates can have happened in between)
        :return: whether every element of every tensor is finite
        """
        if not self.tensors:
            return True
        # A tensor given new storage (``param.data = ...``) would leave its numpy view reading the old one
        if check_storage and [t.data_ptr() for t in self.tensors] != self._storage:
            self._make_views()
        if self._large is None:
            if len({t.dtype for t in self.tensors}) > 1:
                return all(is_finite(t) for t in self.tensors)
            return math.isfinite(th.nn.utils.get_total_norm(self.tensors, norm_type=math.inf).item())
        if self._small:
            np.concatenate(self._small, out=self._packed)
            if not _sum_of_squares_is_finite(self._packed):
                return False
        return all(_sum_of_squares_is_finite(array) for array in self._large)


#: dtypes numpy reads in place (bfloat16 has no numpy counterpart)
_NUMPY_DTYPES = (th.float16, th.float32, th.float64, th.int32, th.int64, th.uint8, th.bool)


class _FlatBuffer:
    """
    One contiguous copy of live tensors of one dtype and device, and its finiteness test.

    The copy is one ``np.concatenate`` (CPU) or ``cat`` (elsewhere) into the buffer from flat aliases of the live
    tensors (they share storage, so they follow in-place updates such as optimizer steps; they are remade when a
    tensor gets new storage): numpy's, because a torch operation on many small tensors costs its dispatch several
    times over. The copy is tested by a :class:`TensorFiniteCheck` of the buffer.

    :param live: the tensors, all of one dtype and device
    """

    def __init__(self, live: list[th.Tensor]) -> None:
        self.live = live
        self.flat = th.empty(sum(t.numel() for t in live), dtype=live[0].dtype, device=live[0].device)
        self.views: list[th.Tensor] = []
        offset = 0
        for tensor in live:
            self.views.append(self.flat[offset : offset + tensor.numel()].view_as(tensor))
            offset += tensor.numel()
        self._on_numpy = self.flat.device.type == "cpu" and self.flat.dtype in _NUMPY_DTYPES
        self._flat_array = self.flat.numpy() if self._on_numpy else None
        self._make_aliases()
        self._check = TensorFiniteCheck([self.flat])  # skips integer buffers: they cannot hold NaN

    def _make_aliases(self) -> None:
        # Aliases need contiguous tensors; parameters and optimizer state are, anything else is copied one by one
        contiguous = all(t.is_contiguous() for t in self.live)
        self.aliases = [t.detach().view(-1) for t in self.live] if contiguous else None
        on_numpy = self.aliases is not None and self._on_numpy
        self._array_aliases = [a.numpy() for a in self.aliases] if self.aliases is not None and on_numpy else None
        self._storage = [t.data_ptr() for t in self.live]

    def range_equal(self, other: "_FlatBuffer", start: int, stop: int) -> bool:
        """Whether ``flat[start:stop]`` holds the same values here and in ``other`` (numpy's compare is the faster)."""
        if self._flat_array is not None and other._flat_array is not None:
            return bool(np.array_equal(self._flat_array[start:stop], other._flat_array[start:stop]))
        return th.equal(self.flat[start:stop], other.flat[start:stop])

    def update(self) -> bool:
        # A tensor given new storage (``param.data = ...``) would leave its alias reading the old one
        if self.aliases is not None and [t.data_ptr() for t in self.live] != self._storage:
            self._make_aliases()
        if self._array_aliases is not None:
            np.concatenate(self._array_aliases, out=self._flat_array)
        elif self.aliases is not None:
            th.cat(self.aliases, out=self.flat)
        else:
            th._foreach_copy_(self.views, [t.detach() for t in self.live])
        return self._check()


class FlatCopy:
    """
    Copies of a fixed list of named tensors, packed into one flat buffer per dtype and device.

    :meth:`update` copies all live tensors with one fused ``cat`` per buffer and tests them with one reduction:
    this is the reduce-first finiteness check, and when it passes the copy is also a snapshot that
    :meth:`restore` writes back. Non-floating tensors (e.g. integer step counters) are copied and restored but
    not tested: they cannot hold NaN.

    :param named: (name, live tensor) pairs
    """

    def __init__(self, named: Sequence[tuple[str, th.Tensor]]) -> None:
        kept = [(name, tensor) for name, tensor in named if tensor.numel() > 0]
        self.names = [name for name, _ in kept]
        self.tensors = [tensor for _, tensor in kept]
        self.views: list[th.Tensor] = [th.empty(0)] * len(kept)
        by_kind: dict[tuple[th.dtype, th.device], list[int]] = {}
        for index, tensor in enumerate(self.tensors):
            by_kind.setdefault((tensor.dtype, tensor.device), []).append(index)
        self._buffers: list[_FlatBuffer] = []
        #: per buffer, the indices of its tensors, in the buffer's order
        self._indices = list(by_kind.values())
        for indices in self._indices:
            buffer = _FlatBuffer([self.tensors[i] for i in indices])
            for i, view in zip(indices, buffer.views, strict=True):
                self.views[i] = view
            self._buffers.append(buffer)
        #: the names :meth:`equal_to` was last asked about and their runs per buffer
        self._runs: tuple[Container[str], list[list[tuple[int, int]]]] | None = None

    def update(self) -> bool:
        """
        Copy the live tensors into the buffers and test them, one reduction per buffer.

        :return: whether every element is finite
        """
        return all(buffer.update() for buffer in self._buffers)

    @th.no_grad()
    def restore(self) -> None:
        """
        Write the copies back into the live tensors.

        Writes through ``.data``, outside autograd's version counters: a restore may happen inside ``train()``
        between a forward pass and its backward (e.g. SAC computes the actor loss after the critic step), and
        that backward must still run; it then uses the restored values.
        """
        for buffer in self._buffers:
            th._foreach_copy_([tensor.data for tensor in buffer.live], buffer.views)
        note_restore()

    def find_nonfinite(self) -> list[NonFiniteTensor]:
        """Locate the non-finite tensors in the copies (the slow path)."""
        return find_nonfinite(zip(self.names, self.views, strict=True))

    def largest(self, names: Container[str] | None = None) -> tuple[str, float] | None:
        """
        The copied tensor with the largest absolute value.

        :param names: consider only these tensors (e.g. parameters, not optimizer state); None for all
        :return: (name, max-abs), or None if no tensor is considered
        """
        best: tuple[str, float] | None = None
        for name, view in zip(self.names, self.views, strict=True):
            if names is None or name in names:
                value = view.abs().amax().item()
                if best is None or not value <= best[1]:
                    best = (name, value)
        return best

    def equal_to(self, other: "FlatCopy", names: Container[str]) -> bool:
        """
        Whether the tensors called ``names`` hold the same values here and in ``other`` (a copy of the same model).

        :param other: another copy
        :param names: the tensors to compare (e.g. the parameters)
        """
        if other.names == self.names and [b.flat.numel() for b in other._buffers] == [b.flat.numel() for b in self._buffers]:
            # The same layout (two copies of one model): compare the named tensors' contiguous runs of each buffer
            return all(
                mine.range_equal(theirs, start, stop)
                for mine, theirs, runs in zip(self._buffers, other._buffers, self._runs_of(names), strict=True)
                for start, stop in runs
            )
        theirs = dict(zip(other.names, other.views, strict=True))
        for name, view in zip(self.names, self.views, strict=True):
            if name in names:
                other_view = theirs.get(name)
                if other_view is None or not th.equal(view, other_view):
                    return False
        return True

    def _runs_of(self, names: Container[str]) -> list[list[tuple[int, int]]]:
        """Per buffer, the (start, stop) ranges of the flat buffer that the tensors called ``names`` fill, merged."""
        if self._runs is not None and self._runs[0] is names:
            return self._runs[1]
        runs: list[list[tuple[int, int]]] = []
        for indices in self._indices:
            merged: list[tuple[int, int]] = []
            start = 0
            for index in indices:
                stop = start + int(self.tensors[index].numel())
                if self.names[index] in names:
                    if merged and merged[-1][1] == start:
                        merged[-1] = (merged[-1][0], stop)
                    else:
                        merged.append((start, stop))
                start = stop
            runs.append(merged)
        self._runs = (names, runs)
        return runs

    def get(self, name: str) -> th.Tensor | None:
        """
        The copy of the tensor called ``name``.

        :param name: a name given at construction
        """
        return self.views[self.names.index(name)] if name in self.names else None


class GradientNorm:
    """
    The global L2 norm of the gradients of fixed parameters, as ``clip_grad_norm_`` computes it.

    When every parameter has a gradient and all share a dtype and device, the gradients are packed with one
    fused copy into a buffer allocated once: several times faster than per-tensor norms for the many small
    tensors of an RL policy.

    :param parameters: the parameters whose ``.grad`` to measure
    """

    def __init__(self, parameters: Iterable[th.Tensor]) -> None:
        self.parameters = list(parameters)
        self._buffer: _FlatBuffer | None = None
        if self.parameters and len({(p.dtype, p.device) for p in self.parameters}) == 1:
            self._buffer = _FlatBuffer(self.parameters)

    def __call__(self) -> float | None:
        """:return: the norm, or None if no parameter has a gradient"""
        grads = [p.grad for p in self.parameters]
        present = [g for g in grads if g is not None]
        if not present:
            return None
        if self._buffer is None or len(present) < len(grads):
            return th.nn.utils.get_total_norm(present).item()
        # one multi-tensor copy into the flat buffer (torch has no public counterpart of _foreach_copy_)
        th._foreach_copy_(self._buffer.views, present)
        return th.linalg.vector_norm(self._buffer.flat).item()
