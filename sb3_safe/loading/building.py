"""
Building the model a file describes, as SB3's ``load`` builds it: one function (:func:`build_model`) for
:func:`sb3_safe.load` and ``sb3-safe doctor``, so that a file read in full from which SB3 cannot build the model is
refused by both, for the same cause, and a file doctor calls healthy loads.

SB3's ``load`` builds what the file's ``data`` describes: the spaces, the policy with its ``policy_kwargs``, the rollout
or replay buffer. Their sizes are the file's to choose, whatever its tensors hold (``net_arch=[10**6, 10**6]`` in a
file of 40 KiB), so while SB3 builds, after the file was read (:func:`bounded_building`):

- each tensor torch's constructors make is sized on the ``meta`` device first and charged before it is allocated: no
  more than twice the file's size and :data:`BUILD_SLACK` in all, nor than the file's budget. SB3 stores a model's
  parameters uncompressed in its file, so a model that loads allocates about its file's size (ARS twice: its weights
  and their flat copy; besides, a few small tensors: recurrent states, gSDE's noise); a model beyond that cannot
  load the file's tensors, and building it would cost memory, and initializing it time, the file does not pay for;
- the arrays numpy fills while building (the action masks of MaskablePPO's buffers, one value per action and step)
  are charged to the file's budget before they are made; the other buffers are zeros numpy only reserves, which
  take no memory until training writes them;
- the spaces must hold numbers, as gymnasium's spaces do (a replay buffer fills an array of objects).

A build beyond a limit is refused with one line naming it, before the allocation.
"""

import contextlib
import contextvars
import functools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common import base_class
from stable_baselines3.common.base_class import BaseAlgorithm
from torch.overrides import TorchFunctionMode

from sb3_safe.doctor.archive import first_line
from sb3_safe.doctor.budget import MIB, BudgetExceeded, size_text
from sb3_safe.doctor.scan import printable
from sb3_safe.loading.readers import RefusedFileError, SecureReading

SelfAlgorithm = TypeVar("SelfAlgorithm", bound=BaseAlgorithm)

#: How a refusal names a file read in full from which SB3 cannot build the model
BUILD_REFUSAL = "read, but SB3 cannot build the model it describes"
#: Tensors a model may make besides twice its file's size: recurrent states, gSDE's noise, scalars
BUILD_SLACK = 4 * MIB
#: torch's constructors of new tensors (each sized on ``meta`` before it runs)
_CONSTRUCTORS = frozenset(
    {
        th.empty,
        th.empty_strided,
        th.zeros,
        th.ones,
        th.full,
        th.eye,
        th.arange,
        th.linspace,
        th.logspace,
        th.rand,
        th.randn,
        th.randint,
        th.randperm,
        th.tensor,
        th.as_tensor,
        th.asarray,
    }
)


@dataclass
class _Build:
    """
    What building the model of a file has allocated so far, against its limits.

    :param reading: the reading of the file (its limits; its size, once read)
    """

    reading: SecureReading
    tensors: int = 0
    arrays: int = 0

    def charge_tensor(self, size: int) -> None:
        """
        Charge a tensor of ``size`` bytes, before torch allocates it.

        :raises BudgetExceeded: beyond twice the file's size and :data:`BUILD_SLACK`, or beyond the file's budget
        """
        self.tensors += size
        total = self.reading.limits.total
        allowed = 2 * self.reading.size + BUILD_SLACK
        if self.tensors > min(allowed, total):
            if allowed < total:
                raise BudgetExceeded(
                    f"read, but the model it describes would have tensors of more than {size_text(allowed)}, twice the "
                    f"file's {size_text(self.reading.size)} and {size_text(BUILD_SLACK)}: its spaces or policy_kwargs "
                    "describe a larger model than its tensors"
                )
            raise BudgetExceeded(
                f"read, but the model it describes would have tensors of more than the file's budget of "
                f"{size_text(total)} (--max-total-mb raises it)"
            )

    def charge_array(self, size: int) -> None:
        """
        Charge an array of ``size`` bytes numpy fills, before it is made.

        :raises BudgetExceeded: beyond the file's budget
        """
        self.arrays += size
        if self.arrays > self.reading.limits.total:
            raise BudgetExceeded(
                f"read, but the model it describes would fill buffers of more than the file's budget of "
                f"{size_text(self.reading.limits.total)} (--max-total-mb raises it)"
            )


_BUILDING: contextvars.ContextVar[_Build | None] = contextvars.ContextVar("sb3_safe_building", default=None)


class _ChargedTensors(TorchFunctionMode):
    """Charges each tensor torch's constructors make, once the file is read, before it is allocated."""

    def __init__(self, build: _Build) -> None:
        super().__init__()
        self.build = build

    def __torch_function__(
        self, func: Callable[..., Any], types: Sequence[type], args: Sequence[Any] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        if func in _CONSTRUCTORS and self.build.reading.read:
            try:
                planned = func(*args, **{**kwargs, "device": "meta"})
            except Exception:  # a call meta cannot plan (into out=) allocates nothing or fails as itself below
                planned = None
            if isinstance(planned, th.Tensor):
                self.build.charge_tensor(planned.numel() * planned.element_size())
        return func(*args, **kwargs)


def _check_space(build: _Build, space: Any) -> None:
    """Refuse a space of values that are not numbers: gymnasium's spaces hold numbers, SB3's buffers fill objects."""
    pending = [space]
    while pending:
        item = pending.pop()
        if isinstance(item, spaces.Dict | spaces.Tuple):
            pending.extend(item.spaces.values() if isinstance(item, spaces.Dict) else item.spaces)
        elif isinstance(item, spaces.Space) and item.dtype is not None and np.dtype(item.dtype).kind not in "biuf":
            raise ValueError(f"a {type(item).__name__} space of dtype {np.dtype(item.dtype)}, not of numbers")


def _charge_masks(build: _Build, buffer: Any) -> None:
    """
    Charge the action masks a maskable rollout buffer fills, one float32 per step, environment and mask value (at most
    two per flat action value: a MultiBinary's two outcomes).
    """
    try:
        masks = int(buffer.buffer_size) * int(buffer.n_envs) * 2 * spaces.flatdim(buffer.action_space)
    except Exception:  # a space the buffer does not know: it raises its own error
        return
    build.charge_array(masks * np.dtype(np.float32).itemsize)


def _check_before(owner: Any, name: str, check: Callable[..., None]) -> None:
    """
    Make ``owner.name`` run ``check(build, *args)`` first while a model is built here, and only itself everywhere else
    (installed once; another wrapper put over it is kept).
    """
    current = getattr(owner, name)
    if getattr(current, "__sb3_safe_check__", None) is check:
        return

    @functools.wraps(current)
    def checked(*args: Any, **kwargs: Any) -> Any:
        build = _BUILDING.get()
        if build is not None and build.reading.read:
            check(build, *args, **kwargs)
        return current(*args, **kwargs)

    checked.__sb3_safe_check__ = check  # type: ignore[attr-defined]
    setattr(owner, name, checked)


@contextlib.contextmanager
def bounded_building(reading: SecureReading) -> Iterator[None]:
    """
    Inside this block, in this thread, what SB3 builds from a file once :func:`~sb3_safe.loading.secure_reading` has
    read it is charged as the module docstring says.

    :param reading: the reading of the file
    """
    # SB3 converts the spaces it reads (before building anything from them), sb3-contrib's maskable buffers fill
    # their masks in reset: looked up when they run, so checked here and unchanged elsewhere
    from sb3_contrib.common.maskable.buffers import MaskableDictRolloutBuffer, MaskableRolloutBuffer

    _check_before(base_class, "_convert_space", _check_space)
    for buffer in (MaskableRolloutBuffer, MaskableDictRolloutBuffer):
        _check_before(buffer, "reset", _charge_masks)
    build = _Build(reading)
    token = _BUILDING.set(build)
    try:
        with _ChargedTensors(build):
            yield
    finally:
        _BUILDING.reset(token)


def _cause(error: BaseException) -> str:
    """The error in one line; torch's "Error(s) in loading state_dict for X:" with the first error it lists."""
    cause = first_line(error)
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].endswith(":"):
        cause += " " + printable(lines[1][:200])
    return cause


def build_model(algorithm_class: type[SelfAlgorithm], reading: SecureReading, path: Any, **load_kwargs: Any) -> SelfAlgorithm:
    """
    ``algorithm_class.load(path, **load_kwargs)`` inside ``reading`` (:func:`~sb3_safe.loading.secure_reading`), its
    building charged (:func:`bounded_building`); what fails once the file was read is refused, in one line.

    :param algorithm_class: the algorithm whose ``load`` builds the model
    :param reading: the secure reading the file is read in
    :param path: the file, as ``load`` takes it
    :param load_kwargs: the rest of ``load``'s arguments
    :return: the model
    :raises RefusedFileError: for a file the reading refuses, a model SB3 cannot build from it (:data:`BUILD_REFUSAL`
        and SB3's error), or one beyond the limits of building
    """
    try:
        with bounded_building(reading):
            return algorithm_class.load(path, **load_kwargs)
    except RefusedFileError:
        raise
    except Exception as error:
        if not reading.read:
            raise  # before the file was read (no such file): SB3's own error
        problem = str(error) if isinstance(error, BudgetExceeded) else f"{BUILD_REFUSAL} ({_cause(error)})"
        refusal = RefusedFileError(reading.read[-1], problem=problem)
    # Raised here, outside the handler: the one line, no chained traceback of SB3's building
    raise refusal


@functools.cache
def algorithms() -> dict[str, type[BaseAlgorithm]]:
    """The algorithms of SB3, sb3-contrib and sb3-safe, by class name: those doctor builds a model as."""
    from sb3_contrib import ARS, QRDQN, TQC, TRPO, CrossQ, MaskablePPO, RecurrentPPO
    from stable_baselines3 import A2C, DDPG, DQN, PPO, SAC, TD3

    from sb3_safe.a2c_safe import SafeA2C
    from sb3_safe.ppo_kl import KLAdaptivePPO

    classes: tuple[type[BaseAlgorithm], ...] = (PPO, A2C, DQN, SAC, TD3, DDPG, ARS, CrossQ, MaskablePPO, QRDQN)
    classes += (RecurrentPPO, TQC, TRPO, KLAdaptivePPO, SafeA2C)
    return {algorithm.__name__: algorithm for algorithm in classes}


@functools.cache
def _saved_attributes(algorithm: type[BaseAlgorithm]) -> frozenset[str]:
    """The attributes ``algorithm``'s ``save`` writes to ``data`` (those of an instance built as ``load`` builds it)."""
    model = algorithm(policy=next(iter(algorithm.policy_aliases.values())), env=None, _init_setup_model=False)  # type: ignore[call-arg]
    return frozenset(vars(model)) - set(model._excluded_save_params())


def algorithm_of(data: dict[str, Any], policy_class: Any) -> type[BaseAlgorithm]:
    """
    The algorithm that saved a model: the one whose saved attributes are most like ``data``'s items (Jaccard), of the
    policies nearest ``policy_class`` among equals (RecurrentPPO and PPO save the same items). TD3 for DDPG's files,
    which TD3 builds alike.

    :param data: the model's ``data``
    :param policy_class: its ``policy_class`` item
    """
    keys = set(data)
    ancestry = policy_class.__mro__ if isinstance(policy_class, type) else ()

    def likeness(algorithm: type[BaseAlgorithm]) -> tuple[float, int]:
        saved = _saved_attributes(algorithm)
        distances = [ancestry.index(alias) for alias in algorithm.policy_aliases.values() if alias in ancestry]
        return len(keys & saved) / len(keys | saved), -min(distances, default=len(ancestry))

    return max(algorithms().values(), key=likeness)
