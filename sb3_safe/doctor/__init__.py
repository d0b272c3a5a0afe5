"""
``sb3-safe doctor``: check a saved SB3 model, a file that may come from anyone, without loading it and without its
environment.

What it guarantees for an untrusted file:

- **Nothing of the file runs.** The pickles SB3's ``load`` would unpickle (the ``:serialized:`` items of ``data``,
  the ``.pth`` entries, the tensors pickled inside them) are read opcode by opcode (:mod:`~sb3_safe.doctor.scan`);
  only if they name and call nothing beyond the allowlist are ``data``'s items built, by the restricted unpickler
  :func:`sb3_safe.load` uses (arrays, spaces, schedules: no code of the file), and the tensors loaded with
  ``torch.load(weights_only=True)``. The file is read as :func:`sb3_safe.load` reads it
  (:mod:`~sb3_safe.doctor.reading`), and the model built from what was read as :func:`sb3_safe.load` builds it
  (:mod:`~sb3_safe.loading.building`: SB3's ``load``, which runs SB3's and torch's code only): a file doctor calls
  healthy loads, one load refuses is not healthy, for the same cause.
- **Every global a pickle would import or call is named**, and compared with what SB3 / sb3-contrib / sb3-safe
  model files hold (:mod:`~sb3_safe.doctor.allowlist`). Any other ("loading this file would run code from
  ``posix.system``") makes the file unhealthy (exit 1); so does a global that cannot be resolved without running
  the pickle.
- **Bounded reading.** One budget per file (:mod:`~sb3_safe.doctor.budget`), charged across every archive nested in
  it, pickle and call: the bytes held (the sizes each zip's central directory declares, checked before anything is
  read), the opcodes, the calls and the values searched in their arguments. A file beyond it is refused (exit 2)
  at the first charge that passes it, unexpanded.
- **Bounded building.** The tensors building the model makes are charged before torch allocates them, to twice the
  file's size (and 4 MiB) within the budget, the arrays numpy fills to the budget
  (:func:`~sb3_safe.loading.building.bounded_building`): a file cannot describe a network larger than its tensors.
- **One line, never a traceback**, for a file that is not a readable model (exit 2), naming the entry and what
  was expected; for a model SB3 cannot build from it, the line :func:`sb3_safe.load` refuses it with.

What it does not: it does not make SB3's ``load`` safe. It reports what loading would run; SB3's ``load`` still
unpickles ``data`` with a full unpickler, and calls the classes the file names (the policy class, the activation,
the optimizer) with the file's arguments. Doctor accepts as a name a class defined in SB3, sb3-contrib and sb3-safe
of a kind SB3 builds from a model's data (a module, a buffer, an optimizer, a space), and checks that loading calls
only the constructors model files need; it does not sandbox ``load``. :func:`sb3_safe.load` loads with the same
allowlist enforced.

A model is unhealthy (exit 1) if a pickle would run code beyond an SB3 file's needs, if a tensor holds NaN or inf,
if the policy's log-std leaves its range (the policy's own ``log_std_range`` for sb3-safe's policies,
:data:`STOCK_LOG_STD_RANGE` for other policies), or if a policy weight exceeds :data:`WEIGHT_LIMIT` in magnitude.
"""

from sb3_safe.common.exploration import STOCK_LOG_STD_RANGE
from sb3_safe.doctor.budget import (
    DEFAULT_MAX_CALLS,
    DEFAULT_MAX_ENTRY_BYTES,
    DEFAULT_MAX_OPCODES,
    DEFAULT_MAX_TOTAL_BYTES,
    DEFAULT_MAX_VALUES,
    BudgetExceeded,
    SizeLimits,
    UnreadableModelError,
)
from sb3_safe.doctor.diagnose import EXIT_HEALTHY, EXIT_UNHEALTHY, EXIT_UNREADABLE, diagnose, disassemble, run_doctor
from sb3_safe.doctor.report import WEIGHT_LIMIT, BeyondLimit, DoctorReport
from sb3_safe.doctor.scan import Finding

__all__ = [
    "DEFAULT_MAX_CALLS",
    "DEFAULT_MAX_ENTRY_BYTES",
    "DEFAULT_MAX_OPCODES",
    "DEFAULT_MAX_TOTAL_BYTES",
    "DEFAULT_MAX_VALUES",
    "EXIT_HEALTHY",
    "EXIT_UNHEALTHY",
    "EXIT_UNREADABLE",
    "STOCK_LOG_STD_RANGE",
    "WEIGHT_LIMIT",
    "BeyondLimit",
    "BudgetExceeded",
    "DoctorReport",
    "Finding",
    "SizeLimits",
    "UnreadableModelError",
    "diagnose",
    "disassemble",
    "run_doctor",
]
