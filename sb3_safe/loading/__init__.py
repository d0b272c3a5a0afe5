"""
Loading files you did not write: SB3's ``load``, ``VecNormalize.load`` and ``load_replay_buffer``, where no pickle
of the file runs code.

:func:`load` builds the model exactly as ``algorithm_class.load`` does; inside it (:func:`secure_reading`), SB3's
readers (:mod:`~sb3_safe.loading.readers`) read every pickle first with ``sb3-safe doctor``'s allowlist, one source
of truth for what an SB3 / sb3-contrib / sb3-safe / rl_zoo3 file may name and call, then unpickle it with an
unpickler that enforces that allowlist (:mod:`~sb3_safe.doctor.unpickler`), and the tensors with
``th.load(weights_only=True)``. A file that names anything else is refused before anything is built, with
:class:`RefusedFileError`.

``KLAdaptivePPO.load`` and ``SafeA2C.load`` are SB3's ``load`` (plus the continuation of a stock checkpoint): they
load what ``PPO.load`` / ``A2C.load`` load, lambda learning rates and the user's own classes included, and run what
the file holds as those do. ``sb3_safe.load(KLAdaptivePPO, path)`` is the secure way, as for any algorithm.
"""

from sb3_safe.loading.models import load, load_replay_buffer, load_vec_normalize
from sb3_safe.loading.readers import RefusedFileError, secure_reading

__all__ = ["RefusedFileError", "load", "load_replay_buffer", "load_vec_normalize", "secure_reading"]
