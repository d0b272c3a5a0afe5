"""``load``, ``load_vec_normalize``, ``load_replay_buffer``: SB3's loaders, run inside :func:`secure_reading`."""

import io
import pathlib
from collections.abc import Sequence
from typing import Any, TypeVar

import torch as th
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.off_policy_algorithm import OffPolicyAlgorithm
from stable_baselines3.common.type_aliases import GymEnv
from stable_baselines3.common.vec_env import VecEnv, VecNormalize

from sb3_safe.doctor.allowlist import TRUSTED_PACKAGES
from sb3_safe.doctor.budget import SizeLimits
from sb3_safe.loading.building import build_model
from sb3_safe.loading.readers import secure_reading

SelfAlgorithm = TypeVar("SelfAlgorithm", bound=BaseAlgorithm)


def _check_reads_through_sb3(owner: type, method: str) -> None:
    """
    Refuse a class whose ``method`` is defined outside SB3 / sb3-contrib / sb3-safe: it may read the file its own way,
    not through the readers :func:`secure_reading` routes.
    """
    definer = next(cls for cls in owner.__mro__ if method in vars(cls))
    if definer.__module__.split(".", 1)[0] not in TRUSTED_PACKAGES:
        raise ValueError(
            f"{owner.__name__}.{method} is defined in {definer.__module__}, not in SB3, sb3-contrib or sb3-safe: it "
            f"may read the file without SB3's readers, so it cannot be made secure; load with the class it extends"
        )


def load(
    algorithm_class: type[SelfAlgorithm],
    path: str | pathlib.Path | io.BufferedIOBase,
    env: GymEnv | None = None,
    device: th.device | str = "auto",
    custom_objects: dict[str, Any] | None = None,
    trust: Sequence[str] = (),
    limits: SizeLimits | None = None,
    **kwargs: Any,
) -> SelfAlgorithm:
    """
    Load a model file you do not trust: the model ``algorithm_class.load(path, env, device, custom_objects, **kwargs)``
    builds, where no pickle of the file runs code.

    Every pickle of the file (the ``:serialized:`` items of ``data``, the ``.pth`` entries, the tensors pickled inside
    them) is first read opcode by opcode with ``sb3-safe doctor``'s allowlist (SB3, sb3-contrib, sb3-safe and rl_zoo3's
    classes and reconstructors), then unpickled by an unpickler that resolves and calls only those globals; the
    tensors come through ``th.load(weights_only=True)``. A file that names anything else is refused before anything
    is built.

    A function stored in the file (a lambda or closure given as a learning rate or a schedule: code, by definition)
    is not rebuilt: the error names the items and the ``custom_objects`` that replace them (SB3's own mechanism).

    What it does not guarantee: the classes the file names (the policy, its activation and optimizer, the buffers)
    are built by SB3 with the file's arguments, and run their own code; ``env`` is yours and runs as given.

    :param algorithm_class: the algorithm (``PPO``, ``KLAdaptivePPO``, ...); its ``load`` must be SB3's or one of
        sb3-contrib's or sb3-safe's (a ``load`` defined elsewhere may read the file its own way)
    :param path: the model zip (``.zip`` may be left out), or a binary file
    :param env: the new environment to run the loaded model on (can be None if you only need prediction from a
        trained model); has priority over any saved environment
    :param device: device on which the code should run
    :param custom_objects: items of the file's ``data`` to replace, never unpickled (e.g. a stored lambda schedule)
    :param trust: modules (or packages) of your own whose classes the file may name, e.g. a features extractor
        (as ``sb3-safe doctor --trust``)
    :param limits: what reading the file may cost (default :class:`~sb3_safe.doctor.budget.SizeLimits`, as
        ``sb3-safe doctor``'s: 1 GiB held, 500k argument values searched, 100k calls, 2M opcodes)
    :param kwargs: the rest of ``algorithm_class.load``'s arguments (``print_system_info``, ``force_reset``) and extra
        arguments to change the model when loading
    :return: new model instance with loaded parameters
    :raises RefusedFileError: for a file whose pickles name or call more than the allowlist, a function stored in
        the file, a file beyond ``limits``, or a file that is not a readable model; one line naming each global and
        the entry that holds it (or the limit). Also for a file read in full from which SB3 cannot build the model
        (tensors that do not fit the policy, an attribute of the wrong type), or whose model would pass the limits
        of building it (:mod:`~sb3_safe.loading.building`; ``sb3-safe doctor`` builds it the same way), or an
        ``env`` whose spaces are not the model's
    """
    _check_reads_through_sb3(algorithm_class, "load")
    with secure_reading(trust, limits) as reading:
        return build_model(algorithm_class, reading, path, env=env, device=device, custom_objects=custom_objects, **kwargs)


def load_vec_normalize(
    path: str | pathlib.Path, venv: VecEnv, trust: Sequence[str] = (), limits: SizeLimits | None = None
) -> VecNormalize:
    """
    ``VecNormalize.load(path, venv)`` for statistics you do not trust: the pickle is read as by :func:`load`, and must
    hold VecNormalize statistics.

    :param path: the pickle ``VecNormalize.save`` wrote (``vecnormalize.pkl``)
    :param venv: the environment to wrap
    :param trust: modules (or packages) of your own whose classes the pickle may name
    :param limits: what reading the file may cost (default :class:`~sb3_safe.doctor.budget.SizeLimits`)
    :return: the VecNormalize wrapper of ``venv``, with the saved statistics
    :raises RefusedFileError: for a pickle that names or calls more than the allowlist, holds something else, or is
        not a valid pickle
    """
    with secure_reading(trust, limits):
        return VecNormalize.load(str(path), venv)


def load_replay_buffer(
    model: OffPolicyAlgorithm,
    path: str | pathlib.Path | io.BufferedIOBase,
    truncate_last_traj: bool = True,
    trust: Sequence[str] = (),
    limits: SizeLimits | None = None,
) -> None:
    """
    ``model.load_replay_buffer(path, truncate_last_traj)`` for a replay buffer you do not trust: the pickle is read as by
    :func:`load`.

    :param model: the off-policy model the buffer is for
    :param path: the pickle ``save_replay_buffer`` wrote (``.pkl`` may be left out), or a binary file
    :param truncate_last_traj: when using ``HerReplayBuffer`` with online sampling: if set to ``True``, we assume
        that the last trajectory in the replay buffer was finished (and truncate it); if ``False``, we assume that
        we continue the same trajectory (same episode)
    :param trust: modules (or packages) of your own whose classes the pickle may name
    :param limits: what reading the file may cost (default :class:`~sb3_safe.doctor.budget.SizeLimits`; a replay
        buffer is one entry: more than 512 MiB needs a larger ``entry`` and ``total``)
    :raises RefusedFileError: for a pickle that names or calls more than the allowlist, passes ``limits``, or is not
        a valid pickle
    """
    _check_reads_through_sb3(type(model), "load_replay_buffer")
    with secure_reading(trust, limits):
        model.load_replay_buffer(path, truncate_last_traj)
