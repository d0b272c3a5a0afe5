"""Finiteness checks and the error they raise, shared by policies, algorithms and callbacks."""

import math
from collections.abc import Container, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch as th


class NonFiniteError(FloatingPointError):
    """
    A tensor that must be finite holds NaN or inf.

    The message names the tensor, how many of its elements are NaN / inf, and, where known,
    the timestep, the training phase and the likely causes.
    """


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

    The max-abs is non-finite iff some element is NaN or inf, and unlike a sum or L2 norm it cannot
    overflow on large finite values.

    :param tensor: any tensor
    """
    if tensor.numel() == 0:
        return True
    return bool(th.isfinite(tensor.detach().abs().amax()))


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


def array_is_finite(array: np.ndarray) -> bool:
    """
    Whether every element of a numpy array is finite, cheap enough for every environment step.

    One dot product with zeros: ``0 * x`` is 0 for every finite ``x`` and NaN for NaN or inf, so the result is
    exact and, unlike a sum, cannot overflow on large finite values.

    :param array: any numpy array (integer arrays are always finite)
    """
    if array.dtype.kind == "f":
        flat = array.ravel()
        return math.isfinite(flat.dot(np.zeros_like(flat)))
    return array.dtype.kind != "c" or bool(np.isfinite(array).all())


class FlatCopy:
    """
    Copies of a fixed list of named floating-point tensors, packed into one flat buffer per dtype and device.

    :meth:`update` copies all live tensors with one fused ``_foreach_copy_`` per buffer and tests them with one
    reduction: this is the reduce-first finiteness check, and when it passes the copy is also a snapshot that
    :meth:`restore` writes back. Non-floating tensors (e.g. integer step counters) cannot hold NaN and are
    left out.

    :param named: (name, live tensor) pairs
    """

    def __init__(self, named: Sequence[tuple[str, th.Tensor]]) -> None:
        kept = [(name, tensor) for name, tensor in named if tensor.is_floating_point() and tensor.numel() > 0]
        self.names = [name for name, _ in kept]
        self.tensors = [tensor for _, tensor in kept]
        self.views: list[th.Tensor] = [th.empty(0)] * len(kept)
        by_kind: dict[tuple[th.dtype, th.device], list[int]] = {}
        for index, tensor in enumerate(self.tensors):
            by_kind.setdefault((tensor.dtype, tensor.device), []).append(index)
        # Per buffer: (flat copy, zeros of the same size, live tensors, their views in the flat copy)
        self._groups: list[tuple[th.Tensor, th.Tensor, list[th.Tensor], list[th.Tensor]]] = []
        for (dtype, device), indices in by_kind.items():
            flat = th.empty(sum(self.tensors[i].numel() for i in indices), dtype=dtype, device=device)
            offset = 0
            for i in indices:
                numel = self.tensors[i].numel()
                self.views[i] = flat[offset : offset + numel].view_as(self.tensors[i])
                offset += numel
            live = [self.tensors[i] for i in indices]
            self._groups.append((flat, th.zeros_like(flat), live, [self.views[i] for i in indices]))

    @th.no_grad()
    def update(self) -> bool:
        """
        Copy the live tensors into the buffers and test them.

        The test is ``dot(copy, zeros)``: ``0 * x`` is 0 for every finite ``x`` and NaN for NaN or inf, so one
        reduction is exact, with no overflow on large finite values.

        :return: whether every element is finite
        """
        for flat, zeros, live, views in self._groups:
            th._foreach_copy_(views, live)
            if not math.isfinite(th.dot(flat, zeros).item()):
                return False
        return True

    @th.no_grad()
    def restore(self) -> None:
        """
        Write the copies back into the live tensors.

        Writes through ``.data``, outside autograd's version counters: a restore may happen inside ``train()``
        between a forward pass and its backward (e.g. SAC computes the actor loss after the critic step), and
        that backward must still run; it then uses the restored values.
        """
        for _, _, live, views in self._groups:
            th._foreach_copy_([tensor.data for tensor in live], views)

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

    def get(self, name: str) -> th.Tensor | None:
        """
        The copy of the tensor called ``name``.

        :param name: a name given at construction
        """
        return self.views[self.names.index(name)] if name in self.names else None
