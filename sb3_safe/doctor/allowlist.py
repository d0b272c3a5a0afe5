"""
Which globals the pickles of an SB3 model file may name and call, derived from the files SB3, sb3-contrib,
sb3-safe and rl_zoo3 write (every algorithm, policy and saved option: tests/test_doctor_hostile.py keeps them
"Healthy").

Two levels, because naming a class and calling it are different risks:

- **called** while loading (``REDUCE``, ``NEWOBJ``, ...): only :data:`CALLABLE` (reconstructors of numpy and torch
  values, plain containers, and the SB3 objects a model's data holds: schedules, noise, spaces, ...). A class of
  SB3 that opens files (a logger, a monitor) is never built by a model file, so it is not here.
- **named** only (``policy_class``, ``activation_fn``, ``optimizer_class``, ``features_extractor_class``,
  ``rollout_buffer_class``, ...): the classes SB3 calls after loading, with arguments from the file. A class defined
  in SB3, sb3-contrib or sb3-safe of a kind SB3 builds from a model's data (:data:`TRUSTED_KINDS`: a module, such as
  a policy or a features extractor, a buffer, an optimizer, a space; not a logger or a monitor, which open files),
  torch's modules and optimizers, gymnasium's spaces, numpy's scalar types.

Nothing named by a file is imported to decide, except modules of SB3, sb3-contrib and sb3-safe (libraries whose
import has no effect beyond defining their classes; a ``__main__`` module runs a program and is refused) and the
torch / gymnasium / numpy modules listed below, to check that the name is a class of the right kind. rl_zoo3 is
not imported: some of its modules run a program on import (``rl_zoo3.benchmark``).
"""

import importlib
import sys
from types import ModuleType
from typing import Any

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.buffers import BaseBuffer

from sb3_safe.doctor.scan import PickleGlobal

#: Packages whose classes a model file may name (their modules define policies, buffers, extractors, schedules)
TRUSTED_PACKAGES = ("stable_baselines3", "sb3_contrib", "sb3_safe")
#: What a class of TRUSTED_PACKAGES that a file names must be: the kinds SB3 builds from a model's data (the policy,
#: its features extractor and activation, the rollout or replay buffer, the optimizer, the spaces)
TRUSTED_KINDS = (th.nn.Module, BaseBuffer, th.optim.Optimizer, spaces.Space)

#: Called while loading a model file
CALLABLE = frozenset(
    {
        # containers and plain values
        "collections.OrderedDict",
        "collections.deque",  # ep_info_buffer, ep_success_buffer
        "builtins.set",
        "builtins.frozenset",
        "builtins.complex",
        "builtins.slice",
        "_codecs.encode",  # bytes in pickle protocol 2
        # numpy arrays, scalars, dtypes and random generators (numpy 2 and numpy 1 module names)
        "numpy.dtype",
        "numpy._core.multiarray._reconstruct",
        "numpy.core.multiarray._reconstruct",
        "numpy._core.multiarray.scalar",
        "numpy.core.multiarray.scalar",
        "numpy._core.numeric._frombuffer",
        "numpy.core.numeric._frombuffer",
        "numpy.random._pickle.__generator_ctor",
        "numpy.random._pickle.__bit_generator_ctor",
        "numpy.random._pickle.__randomstate_ctor",
        "numpy.random.bit_generator.__pyx_unpickle_SeedSequence",
        # torch tensors (torch's own weights_only allowlist, without the rebuilders that call a class they are given
        # and the one that converts an array of the file to any dtype: 16 bytes per byte of the file)
        "torch._utils._rebuild_tensor",
        "torch._utils._rebuild_tensor_v2",
        "torch._utils._rebuild_tensor_v3",
        "torch._utils._rebuild_parameter",
        "torch._utils._rebuild_parameter_with_state",
        "torch._utils._rebuild_meta_tensor_no_storage",
        "torch._utils._rebuild_sparse_tensor",
        "torch._utils._rebuild_nested_tensor",
        "torch._utils._rebuild_qtensor",
        "torch.serialization._get_layout",
        "torch.Size",
        "torch.device",
        # a tensor pickled by plain pickle (ARS's weights): torch.load of its bytes, which are scanned in turn
        "torch.storage._load_from_bytes",
        # what SB3 / sb3-contrib algorithms keep in their data
        "stable_baselines3.common.utils.FloatSchedule",
        "stable_baselines3.common.utils.ConstantSchedule",
        "stable_baselines3.common.utils.LinearSchedule",
        "stable_baselines3.common.type_aliases.TrainFreq",
        "stable_baselines3.common.type_aliases.TrainFrequencyUnit",
        "stable_baselines3.common.noise.NormalActionNoise",
        "stable_baselines3.common.noise.OrnsteinUhlenbeckActionNoise",
        "stable_baselines3.common.noise.VectorizedActionNoise",
        "stable_baselines3.her.goal_selection_strategy.GoalSelectionStrategy",
        # the pickles SB3 writes besides model zips: VecNormalize's (vecnormalize.pkl), replay buffers
        "stable_baselines3.common.vec_env.vec_normalize.VecNormalize",
        "stable_baselines3.common.running_mean_std.RunningMeanStd",
        "stable_baselines3.common.buffers.ReplayBuffer",
        "stable_baselines3.common.buffers.DictReplayBuffer",
        "stable_baselines3.her.her_replay_buffer.HerReplayBuffer",
        # sb3-safe's
        "sb3_safe.common.schedules.ScaledSchedule",
        # (a schedule read at progress 0 in an update past the end of training: in a file a stop saves then)
        "sb3_safe.common.schedules.ReadFromZero",
        "sb3_safe.common.updates.GuardedOptimizerStep",
        # rl_zoo3's "lin_" hyperparameters (sb3-safe train)
        "rl_zoo3.utils.SimpleLinearSchedule",
    }
)

# Not functools.partial: no SB3 file holds one, and its state (BUILD) can make it call any class named in the file

#: Globals some callables are given to call (numpy's reconstructors build the class passed to them); any other
#: global passed as an argument must be in CALLABLE
_PASSED = {
    "numpy._core.multiarray._reconstruct": frozenset({"numpy.ndarray"}),
    "numpy.core.multiarray._reconstruct": frozenset({"numpy.ndarray"}),
    "numpy.random._pickle.__bit_generator_ctor": frozenset(
        {
            "numpy.random._pcg64.PCG64",
            "numpy.random._pcg64.PCG64DXSM",
            "numpy.random._mt19937.MT19937",
            "numpy.random._philox.Philox",
            "numpy.random._sfc64.SFC64",
        }
    ),
    "numpy.random.bit_generator.__pyx_unpickle_SeedSequence": frozenset({"numpy.random.bit_generator.SeedSequence"}),
}
_PASSED["numpy.random._pickle.__generator_ctor"] = _PASSED["numpy.random._pickle.__bit_generator_ctor"] | {
    "numpy.random._pickle.__bit_generator_ctor"
}
_PASSED["numpy.random._pickle.__randomstate_ctor"] = _PASSED["numpy.random._pickle.__generator_ctor"]

#: Packages whose classes a file builds with NEWOBJ and state, never by calling them with arguments
_INITIALIZED_BY_STATE = frozenset({*TRUSTED_PACKAGES, "rl_zoo3", "gymnasium"})
#: Enums of those packages in CALLABLE: pickled as a call of the class with the member's value
_ENUMS = frozenset(
    {
        "stable_baselines3.common.type_aliases.TrainFrequencyUnit",
        "stable_baselines3.her.goal_selection_strategy.GoalSelectionStrategy",
    }
)

#: Named, never called by a file: numpy's array and random classes that its reconstructors are given
_NAMED = frozenset().union(*_PASSED.values())

#: Modules (besides those of TRUSTED_PACKAGES) that may be imported to check a name, as the prefixes of their names
_CHECKABLE_MODULES = ("torch.nn.modules.", "torch.optim.", "gymnasium.spaces.")

#: Classes a name from each module must be, besides being defined in a trusted package
_NAMED_KINDS: tuple[tuple[str, tuple[type, ...]], ...] = (
    ("torch.nn.modules.", (th.nn.Module,)),
    ("torch.optim.", (th.optim.Optimizer,)),
    ("gymnasium.spaces.", (spaces.Space,)),
)


#: cloudpickle's machinery for a function pickled by value (a lambda or a closure given as a learning rate or a
#: schedule): the function's code is in the file, built while loading (and a pickle can call what it builds)
_CODE_BUILDERS = frozenset(
    {
        "cloudpickle.cloudpickle._make_function",
        "cloudpickle.cloudpickle._builtin_type",
        "cloudpickle.cloudpickle._make_skeleton_class",
        "cloudpickle.cloudpickle._make_code",
        "cloudpickle.cloudpickle_fast._make_function",
        "cloudpickle.cloudpickle_fast._builtin_type",
        "types.CodeType",
        "types.FunctionType",
    }
)


class Allowlist:
    """
    The decisions :func:`~sb3_safe.doctor.scan.scan_pickle` asks for, with modules the user trusts beyond the
    defaults (``sb3-safe doctor --trust``).

    :param trusted_modules: modules (or packages: their submodules too) whose globals may be named, for a model
        built with the user's own classes (a features extractor, a policy); they are never imported by doctor
    """

    def __init__(self, trusted_modules: tuple[str, ...] = ()) -> None:
        self.trusted_modules = tuple(trusted_modules)
        self._resolved: dict[PickleGlobal, Any] = {}

    def may_reference(self, found: PickleGlobal) -> bool:
        """Whether loading may import ``found`` and look it up, to hold it (a class SB3 calls later)."""
        dotted = str(found)
        if dotted in CALLABLE or dotted in _NAMED:
            return True
        if not _is_plain_name(found):
            return False
        if self.is_trusted(found):
            return True
        value = self._resolve(found)
        if value is None:
            return False
        if found.module == "torch":
            # dtypes (torch.float32) and the legacy storage classes of torch.save's persistent ids (torch.FloatStorage)
            return isinstance(value, th.dtype) or (isinstance(value, type) and issubclass(value, th.storage.TypedStorage))
        if found.module == "numpy":
            return isinstance(value, type) and issubclass(value, np.generic)  # scalar types: numpy.float32
        if not isinstance(value, type):
            return False
        for prefix, kinds in _NAMED_KINDS:
            if found.module.startswith(prefix):
                return issubclass(value, kinds)
        # A class of SB3 / sb3-contrib / sb3-safe, defined there (not a re-export of another package's class), of a
        # kind SB3 builds after loading: SB3 calls it with arguments from the file
        return _top_package(value.__module__) in TRUSTED_PACKAGES and issubclass(value, TRUSTED_KINDS)

    def is_trusted(self, found: PickleGlobal) -> bool:
        """Whether ``found`` is in a module the user trusts."""
        return any(found.module == trusted or found.module.startswith(f"{trusted}.") for trusted in self.trusted_modules)

    def may_call(self, found: PickleGlobal) -> bool:
        """Whether loading may call ``found``: build one of the objects SB3 model files hold."""
        if str(found) in CALLABLE:
            return True
        # gymnasium's spaces (observation_space, action_space)
        return found.module.startswith("gymnasium.spaces.") and self.may_reference(found)

    @staticmethod
    def may_initialize(found: PickleGlobal) -> bool:
        """
        Whether loading may call ``found`` with arguments (REDUCE, OBJ, INST): a function, a builtin type, or an enum
        (a lookup of its member). The classes of SB3, sb3-contrib, sb3-safe, rl_zoo3 and gymnasium that a file holds
        objects of are pickled by their ``__new__`` (NEWOBJ) and state: their ``__init__`` allocates what its
        arguments ask for (a space of a billion values, a buffer of a million copies).
        """
        dotted = str(found)
        return dotted in _ENUMS or _top_package(found.module) not in _INITIALIZED_BY_STATE

    def may_pass(self, callee: PickleGlobal, passed: PickleGlobal) -> bool:
        """Whether ``callee`` may be given ``passed`` as an argument (it may call what it is given)."""
        return str(passed) in _PASSED.get(str(callee), frozenset()) or self.may_call(passed)

    @staticmethod
    def describe(found: PickleGlobal) -> str | None:
        """The finding's detail for cloudpickle's functions pickled by value."""
        if str(found) in _CODE_BUILDERS:
            return (
                "a function pickled by value, its code stored in the file: a lambda or closure, e.g. a learning "
                "rate (SB3's LinearSchedule / FloatSchedule are pickled by name)"
            )
        return None

    @staticmethod
    def loads_bytes(found: PickleGlobal) -> bool:
        """Whether calling ``found`` loads its bytes argument as a torch file (scanned in turn)."""
        return str(found) == "torch.storage._load_from_bytes"

    def _resolve(self, found: PickleGlobal) -> Any:
        """The object ``found`` names, from a module doctor may import to check it; None if there is none."""
        if found not in self._resolved:
            module = _checkable_module(found.module)
            self._resolved[found] = None if module is None else getattr(module, found.name, None)
        return self._resolved[found]


def _is_plain_name(found: PickleGlobal) -> bool:
    # A dotted name is an attribute path (pickle protocol 4): it reaches anything a module imports
    parts = found.module.split(".")
    return found.name.isidentifier() and all(part.isidentifier() and part != "__main__" for part in parts)


def _top_package(module: str) -> str:
    return module.split(".", 1)[0]


def _checkable_module(name: str) -> ModuleType | None:
    """The module, imported if it is one doctor may import to check a name; None otherwise or if it does not import."""
    if name in ("torch", "numpy"):
        return sys.modules[name]
    if _top_package(name) not in TRUSTED_PACKAGES and not name.startswith(_CHECKABLE_MODULES):
        return None
    if name in sys.modules:
        return sys.modules[name]
    try:
        return importlib.import_module(name)
    except Exception:  # a name no installed module has, or a module that fails to import: nothing to check
        return None
