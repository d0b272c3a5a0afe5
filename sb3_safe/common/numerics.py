"""Finiteness checks and the error they raise, shared by policies, algorithms and callbacks."""

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
