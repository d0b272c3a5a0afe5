"""
Mutation testing of the modules that carry sb3-safe's promises (issue 41): a promise is guarded only if some test
fails when the code that keeps it is broken.

Mutants come from cosmic-ray's operators (``pip install .[mutation]``), a reduced set: each arithmetic, comparison,
boolean and unary operator replaced by its natural counterpart (``+`` by ``-``, ``*`` by ``/``, ``<`` by ``<=`` and by
``>=``, ``and`` by ``or``, ``-x`` by ``x``, ...), numbers moved by one, ``not`` added to conditions, ``True`` and
``False`` swapped, loops run zero times, ``break`` / ``continue`` swapped, caught exceptions replaced and decorators
removed (:data:`OPERATORS`); never inside a type annotation, where ``X | None`` is not arithmetic. The four mutants
that issue 41 found by hand (:data:`HAND_MUTANTS`) run too.

Each mutant runs only the tests that cover it: :data:`MODULES` maps each module to its test files, and a baseline
run of those (on a work copy, ``build/mutation``, never the checkout) records with coverage which tests execute each
line and how long each takes; a mutant then runs the tests that execute its statement (those that execute its
function where the statement's line was not recorded; all of them for code that runs at import), fastest first, up to
the first failure. One process imports torch, SB3 and pytest once and forks one child per mutant, which imports the
mutated sb3-safe. A mutant is *killed* when a test fails (or the import fails, or the tests hang past the timeout),
*survived* when they all pass, *not covered* when no test executes it.

Usage: ``python -m benchmarks run mutation --jobs 1`` (hours; resumable: rerun the same command and it runs only the
mutants without a row; the modules go smallest first) writes ``mutation.jsonl`` and ``mutation.md``; ``--quick``
runs every tenth mutant of each module (the sample the report scores a module on until all its mutants have run),
``--modules PATH ...`` only those modules' mutants (a path or its end: ``--modules snapshot.py kl.py``).
``python -m benchmarks.mutation retest [MODULE ...]`` runs the survivors again (after new tests) and rewrites their
rows; ``python -m benchmarks.mutation show KEY`` prints a mutant's diff. Survivors that change no behaviour are
listed in :data:`EQUIVALENT` with why.

One JSONL holds the rows of every size: a row is keyed by its mutant and the hash of the source it mutated
(``source``), so a quick run and a full one share the mutants they have in common, and a row of a module whose source
has changed since is *stale*: run again, never scored.
"""

import ast
import contextlib
import difflib
import hashlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import reports, suite
from benchmarks.configs import ROOT

#: The modules measured, smallest first, and the test files that may kill their mutants
MODULES: dict[str, list[str]] = {
    "sb3_safe/common/observation_norm.py": ["tests/test_observation_norm.py"],
    "sb3_safe/common/updates.py": [
        "tests/test_updates.py",
        "tests/test_promises.py",
        "tests/test_ppo_kl.py",
        "tests/test_a2c_safe.py",
        "tests/test_supervisor.py",  # schedules read at 0 past the end of the budget
    ],
    "sb3_safe/common/guard/snapshot.py": [
        "tests/test_guard.py",
        "tests/test_guard_cadence.py",
        "tests/test_guard_coverage.py",
        "tests/test_promises.py",
    ],
    "sb3_safe/common/guard/locate.py": ["tests/test_guard.py", "tests/test_guard_coverage.py", "tests/test_promises.py"],
    "sb3_safe/doctor/allowlist.py": [
        "tests/test_doctor.py",
        "tests/test_doctor_hostile.py",
        "tests/test_secure_load_hostile.py",
    ],
    "sb3_safe/common/supervisor.py": ["tests/test_supervisor.py", "tests/test_adaptive_lr.py", "tests/test_faults.py"],
    "sb3_safe/doctor/pickles.py": ["tests/test_doctor.py", "tests/test_doctor_hostile.py"],
    "sb3_safe/common/guard/response.py": [
        "tests/test_guard.py",
        "tests/test_guard_response_promises.py",
        "tests/test_guard_cadence.py",
        "tests/test_guard_coverage.py",
        "tests/test_promises.py",
    ],
    "sb3_safe/a2c_safe/a2c_safe.py": [
        "tests/test_a2c_safe.py",
        "tests/test_a2c_safe_promises.py",
        "tests/test_promises.py",
        "tests/test_value_norm.py",
        "tests/test_supervisor.py",
    ],
    "sb3_safe/ppo_kl/ppo_kl.py": [
        "tests/test_promises.py",
        "tests/test_ppo_kl.py",
        "tests/test_ppo_kl_promises.py",
        "tests/test_value_norm.py",
        "tests/test_supervisor.py",
    ],
    "sb3_safe/common/adaptive_lr.py": [
        "tests/test_adaptive_lr.py",
        "tests/test_adaptive_lr_promises.py",
        "tests/test_supervisor.py",
        "tests/test_faults.py",
    ],
    "sb3_safe/common/distributions.py": [
        "tests/test_promises.py",
        "tests/test_distributions.py",
        "tests/test_verified_distributions.py",
        "tests/test_policies.py",
        "tests/test_distributions_promises.py",
    ],
    "sb3_safe/common/kl.py": [
        "tests/test_kl.py",
        "tests/test_kl_exact.py",
        "tests/test_promises.py",
        "tests/test_kl_promises.py",
        "tests/test_kl_accuracy.py",
    ],
}

_COMPARISONS = [("Lt", "LtE"), ("Lt", "GtE"), ("LtE", "Lt"), ("LtE", "Gt"), ("Gt", "GtE"), ("Gt", "LtE"), ("GtE", "Gt"),
                ("GtE", "Lt"), ("Eq", "NotEq"), ("NotEq", "Eq"), ("Is", "IsNot"), ("IsNot", "Is")]  # fmt: skip
_ARITHMETIC = [("Add", "Sub"), ("Sub", "Add"), ("Mul", "Div"), ("Div", "Mul"), ("FloorDiv", "Div"), ("Mod", "FloorDiv"),
               ("Pow", "Mul"), ("BitAnd", "BitOr"), ("BitOr", "BitAnd"), ("BitXor", "BitOr"), ("LShift", "RShift"),
               ("RShift", "LShift")]  # fmt: skip
#: cosmic-ray's operators used: each operator replaced by its natural counterpart, as mutmut and PIT do, not by all
OPERATORS: list[str] = [
    *(f"core/ReplaceComparisonOperator_{a}_{b}" for a, b in _COMPARISONS),
    *(f"core/ReplaceBinaryOperator_{a}_{b}" for a, b in _ARITHMETIC),
    "core/ReplaceUnaryOperator_Delete_USub",
    "core/ReplaceUnaryOperator_Delete_Not",
    "core/ReplaceUnaryOperator_Delete_Invert",
    "core/NumberReplacer",
    "core/AddNot",
    "core/ReplaceTrueWithFalse",
    "core/ReplaceFalseWithTrue",
    "core/ReplaceAndWithOr",
    "core/ReplaceOrWithAnd",
    "core/ZeroIterationForLoop",
    "core/ReplaceBreakWithContinue",
    "core/ReplaceContinueWithBreak",
    "core/ExceptionReplacer",
    "core/RemoveDecorator",
]
#: The four one-line bugs issue 41 found surviving the suite, as (module, code, mutated code)
HAND_MUTANTS: dict[str, tuple[str, str, str]] = {
    "issue41/multicategorical_raw_logits": (
        "sb3_safe/common/distributions.py",
        "th.split(bounded, list(self.action_dims), dim=1)",
        "th.split(action_logits, list(self.action_dims), dim=1)",
    ),
    "issue41/no_log_ratio_clamp": (
        "sb3_safe/ppo_kl/ppo_kl.py",
        "log_ratio = clamp_log_ratio(raw_log_ratio)",
        "log_ratio = raw_log_ratio",
    ),
    "issue41/detached_kl_penalty": (
        "sb3_safe/ppo_kl/ppo_kl.py",
        "self.kl_beta * mean_kl\n",
        "self.kl_beta * mean_kl.detach()\n",
    ),
    "issue41/no_rollout_buffer_check": (
        "sb3_safe/common/callbacks.py",
        "        if (\n"
        "            buffer is not None\n"
        "            and not self.stopping\n"
        "            and not self._watched.rollout_buffer_is_finite(buffer, not self._others_may_write)\n"
        "        ):\n"
        "            self._handle(self._locator.in_rollout_buffer(buffer))\n",
        "",
    ),
}
#: Tests of the hand mutants' modules for those mutants (callbacks.py is not among MODULES)
HAND_TESTS = ["tests/test_promises.py"]
#: Survivors that change no behaviour, by row key (``module:operator:occurrence@source``: a changed source is triaged
#: again), with why
EQUIVALENT: dict[str, str] = {
    "sb3_safe/common/observation_norm.py:core/ReplaceBinaryOperator_Pow_Mul:0@54dab1d5da5c": (
        "KEPT_ELEMENTS bounds the memory of observations kept: the statistics are the same at any bound (a full block "
        "is folded before more rows are copied in, a larger batch gets a block of its own), and the tests read the "
        "constant."
    ),
    "sb3_safe/common/observation_norm.py:core/ReplaceComparisonOperator_Gt_GtE:0@54dab1d5da5c": (
        "At a largest std of exactly FLOAT32_STD_LIMIT (1e30) both paths are exact to rounding: the float32 scale "
        "1e-30 is a normal number, and obs - mean cannot overflow float32 where the result is not clipped anyway."
    ),
    "sb3_safe/common/observation_norm.py:core/NumberReplacer:6@54dab1d5da5c": (
        "KEPT_ELEMENTS bounds the memory of observations kept: the statistics are the same at any bound (a full block "
        "is folded before more rows are copied in, a larger batch gets a block of its own), and the tests read the "
        "constant."
    ),
    "sb3_safe/common/observation_norm.py:core/NumberReplacer:7@54dab1d5da5c": (
        "KEPT_ELEMENTS bounds the memory of observations kept: the statistics are the same at any bound (a full block "
        "is folded before more rows are copied in, a larger batch gets a block of its own), and the tests read the "
        "constant."
    ),
    "sb3_safe/common/observation_norm.py:core/NumberReplacer:8@54dab1d5da5c": (
        "The mutant writes 1e+30 for 1e30: the same float."
    ),
    "sb3_safe/common/observation_norm.py:core/NumberReplacer:9@54dab1d5da5c": (
        "The mutant writes 1e+30 for 1e30: the same float."
    ),
    "sb3_safe/common/observation_norm.py:core/NumberReplacer:11@54dab1d5da5c": (
        "SB3's features extractors are called with the observations alone: args holds one tensor, args[-1] is args[0]."
    ),
    "sb3_safe/common/observation_norm.py:core/NumberReplacer:12@54dab1d5da5c": (
        "SB3's features extractors are called with the observations alone: args[1:] and args[2:] are both empty."
    ),
    "sb3_safe/common/observation_norm.py:core/NumberReplacer:32@54dab1d5da5c": (
        "The pending variance is reset with a count of 0, which weights it by 0 in the next merge: any finite reset "
        "value gives the same statistics."
    ),
    "sb3_safe/common/observation_norm.py:core/NumberReplacer:33@54dab1d5da5c": (
        "The pending variance is reset with a count of 0, which weights it by 0 in the next merge: any finite reset "
        "value gives the same statistics."
    ),
    "sb3_safe/common/observation_norm.py:core/NumberReplacer:34@54dab1d5da5c": (
        "The least capacity only bounds memory (a block of 1 or 2 rows): KEPT_ELEMENTS bounds the memory of "
        "observations kept: the statistics are the same at any bound (a full block is folded before more rows are "
        "copied in, a larger batch gets a block of its own), and the tests read the constant."
    ),
    "sb3_safe/common/observation_norm.py:core/NumberReplacer:35@54dab1d5da5c": (
        "A capacity of 0 still allocates a block of the batch's size (add() takes the larger), so every row is kept and"
        " folded: the same statistics."
    ),
    "sb3_safe/common/observation_norm.py:core/NumberReplacer:36@54dab1d5da5c": (
        "Dividing by max(2, n) instead of max(1, n) only halves the capacity of a 1-element observation: KEPT_ELEMENTS "
        "bounds the memory of observations kept: the statistics are the same at any bound (a full block is folded "
        "before more rows are copied in, a larger batch gets a block of its own), and the tests read the constant."
    ),
    "sb3_safe/common/observation_norm.py:core/NumberReplacer:37@54dab1d5da5c": (
        "max(0, n) differs from max(1, n) only for an observation of 0 elements, which no Box a policy is built with has."
    ),
    "sb3_safe/common/kl.py:core/ReplaceComparisonOperator_Gt_GtE:0@134ad189f87a": (
        "mass = Phi(-lower) - Phi(-upper) or Phi(upper) - Phi(lower) are the same quantity; `>=` only changes the choice "
        "at lower == 0.0 exactly, where both differences are of values in [0.5, 1] and round alike (~1e-16 absolute)."
    ),
    "sb3_safe/common/kl.py:core/ReplaceComparisonOperator_Eq_NotEq:1@134ad189f87a": (
        "Equal-shape gradients go through sum_to_size(same shape), a no-op; broadcast ones are returned unreduced, and "
        "torch's autograd engine (validate_outputs) sums an expandable gradient to the input's shape itself."
    ),
    "sb3_safe/common/kl.py:core/ReplaceBinaryOperator_Mul_Div:14@134ad189f87a": (
        "outward holds exactly +1.0 and -1.0, so PRESQUASH_BOUND / outward == PRESQUASH_BOUND * outward bit for bit."
    ),
    "sb3_safe/common/kl.py:core/ReplaceUnaryOperator_Delete_USub:31@134ad189f87a": (
        "Every categorical's log-probabilities are (batch, n) tensors (torch Categorical logits of 2-D inputs), so "
        "shape[1] is shape[-1]."
    ),
    "sb3_safe/common/kl.py:core/NumberReplacer:10@134ad189f87a": (
        "-1e30 + 1 == -1e30 in float64 (spacing there ~1.4e14): the constant is bit-identical."
    ),
    "sb3_safe/common/kl.py:core/NumberReplacer:11@134ad189f87a": (
        "-1e30 - 1 == -1e30 in float64 (spacing there ~1.4e14): the constant is bit-identical."
    ),
    "sb3_safe/common/kl.py:core/NumberReplacer:15@134ad189f87a": (
        "Taken only when len(log_probs) == 1, where log_probs[-1] is log_probs[0]."
    ),
    "sb3_safe/common/kl.py:core/NumberReplacer:17@134ad189f87a": (
        "With one 2-D tensor th.cat([t], dim=1) returns a copy of t with the same values and the same autograd graph "
        "(CatBackward passes the gradient through), so distribution_params' value and gradients are unchanged."
    ),
    "sb3_safe/common/kl.py:core/NumberReplacer:29@134ad189f87a": (
        "z^2 + expm1(2d) >= expm1(2d) >= 2d in floating point (rounded addition of a non-negative term is monotone; a "
        "faithfully rounded expm1(x) is never below x, checked exhaustively on CPU for every float32 |x| < 4), so the "
        "sum before the clamp is never negative and clamp(min=-1) == clamp(min=0)."
    ),
    "sb3_safe/common/kl.py:core/NumberReplacer:100@134ad189f87a": (
        "Same quantity, other tail: for lower in (0, 1] it computes Phi(upper) - Phi(lower) instead of "
        "Phi(-lower) - Phi(-upper), both differences of values >= 0.16 with the same ~1e-16 absolute rounding; the "
        "precise-tail choice only matters deeper in the tail (lower > 1), which the mutant keeps."
    ),
    "sb3_safe/common/kl.py:core/NumberReplacer:101@134ad189f87a": (
        "Same quantity, other tail: for lower in (-1, 0] it computes Phi(-lower) - Phi(-upper) instead of "
        "Phi(upper) - Phi(lower), both differences of values >= 0.16 with the same ~1e-16 absolute rounding; no value "
        "or gradient changes beyond float64 rounding."
    ),
    "sb3_safe/common/kl.py:core/NumberReplacer:221@134ad189f87a": (
        "_batch_mean only receives 1-D per-sample KLs (batch,), so shape[-1] is shape[0]."
    ),
    "sb3_safe/common/kl.py:core/NumberReplacer:223@134ad189f87a": (
        "_batch_mean only receives 1-D per-sample KLs (batch,), so sum(dim=-1) is sum(dim=0)."
    ),
    "sb3_safe/common/kl.py:core/NumberReplacer:243@134ad189f87a": (
        "A single categorical then takes the multi-categorical path: the same per-sample kl_div sums ('none' "
        "identical); for 'batchmean' each sample is clamped at 0 before the divided sum instead of the divided sum "
        "being clamped, which differs only by the float rounding (~1e-7) of nearly equal samples: the mean of the "
        "per-sample KLs either way."
    ),
    "sb3_safe/common/kl.py:core/NumberReplacer:245@134ad189f87a": (
        "Taken only when len(log_probs) == 1, where log_probs[-1] is log_probs[0]."
    ),
    "sb3_safe/common/kl.py:core/NumberReplacer:257@134ad189f87a": (
        "expm1(x) - x with x = the clamped log-ratio is never negative in floating point (a faithfully rounded expm1(x) "
        "is >= x; checked exhaustively on CPU for every float32 |x| < 4, beyond which the difference is >= 1), so "
        "clamp(min=-1) == clamp(min=0)."
    ),
    "sb3_safe/common/kl.py:core/ReplaceTrueWithFalse:0@134ad189f87a": (
        "grads and ctx.shapes are both 4-tuples by construction, so strict=True never raises and zip is the same."
    ),
    "sb3_safe/common/kl.py:core/ReplaceTrueWithFalse:1@134ad189f87a": (
        "grads, ctx.shapes, ctx.dtypes and needs[:4] all have exactly 4 entries by construction: zip is the same."
    ),
    "sb3_safe/common/kl.py:core/ReplaceTrueWithFalse:3@134ad189f87a": (
        "split() with sizes from log_probs raises unless they sum to old_params' width, and then returns exactly "
        "len(log_probs) chunks, so the two zipped sequences always have equal length."
    ),
    "sb3_safe/common/kl.py:core/ReplaceAndWithOr:0@134ad189f87a": (
        "grad_mean is None only when neither needs[0] nor needs[2]; the mutant only also returns -grad_mean for a "
        "mean_q that does not require grad, a gradient autograd discards (a Function may return one for such an input)."
    ),
    "sb3_safe/common/kl.py:core/ReplaceAndWithOr:1@134ad189f87a": (
        "g is computed whenever its input needs a gradient (grads[0:2] if needs[0] or needs[1], grads[2:4] if needs[2] "
        "or needs[3]); the mutant only adds gradients for inputs that do not require grad, which autograd discards."
    ),
    "sb3_safe/common/kl.py:core/RemoveDecorator:0@134ad189f87a": (
        "autograd calls forward through the class (cls.forward(ctx, *args)); a plain function looked up on a class is "
        "the function itself in Python 3, so it receives the same arguments with or without @staticmethod."
    ),
    "sb3_safe/common/kl.py:core/RemoveDecorator:1@134ad189f87a": (
        "autograd calls backward through the class (_forward_cls.backward(ctx, *grads)); a plain function looked up on "
        "a class is the function itself in Python 3, so it receives the same arguments with or without @staticmethod."
    ),
    "sb3_safe/common/kl.py:core/RemoveDecorator:2@134ad189f87a": (
        "autograd calls forward through the class (cls.forward(ctx, *args)); a plain function looked up on a class is "
        "the function itself in Python 3, so it receives the same arguments with or without @staticmethod."
    ),
    "sb3_safe/common/kl.py:core/RemoveDecorator:3@134ad189f87a": (
        "autograd calls backward through the class (_forward_cls.backward(ctx, *grads)); a plain function looked up on "
        "a class is the function itself in Python 3, so it receives the same arguments with or without @staticmethod."
    ),
    "sb3_safe/common/kl.py:core/ReplaceComparisonOperator_Eq_NotEq:1@1bbd4ca6d28d": (
        "gaussian_kl's backward: equal-shape gradients go through sum_to_size(same shape), a no-op; broadcast ones "
        "are returned unreduced, and torch's autograd engine (validate_outputs) sums an expandable gradient to the "
        "input's shape itself."
    ),
    "sb3_safe/common/kl.py:core/ReplaceBinaryOperator_Mul_Div:26@1bbd4ca6d28d": (
        "outward holds exactly +1.0 and -1.0, so PRESQUASH_BOUND / outward == PRESQUASH_BOUND * outward bit for bit."
    ),
    "sb3_safe/common/kl.py:core/ReplaceUnaryOperator_Delete_USub:39@1bbd4ca6d28d": (
        "Every categorical's log-probabilities are (batch, n) tensors (torch Categorical logits of 2-D inputs), so "
        "shape[1] is shape[-1]."
    ),
    "sb3_safe/common/kl.py:core/NumberReplacer:10@1bbd4ca6d28d": (
        "-1e30 + 1 == -1e30 in float64 (spacing there ~1.4e14): the constant is bit-identical."
    ),
    "sb3_safe/common/kl.py:core/NumberReplacer:11@1bbd4ca6d28d": (
        "-1e30 - 1 == -1e30 in float64 (spacing there ~1.4e14): the constant is bit-identical."
    ),
    "sb3_safe/common/kl.py:core/NumberReplacer:15@1bbd4ca6d28d": (
        "Taken only when len(log_probs) == 1, where log_probs[-1] is log_probs[0]."
    ),
    "sb3_safe/common/kl.py:core/NumberReplacer:17@1bbd4ca6d28d": (
        "With one 2-D tensor th.cat([t], dim=1) returns a copy of t with the same values and the same autograd graph "
        "(CatBackward passes the gradient through), so distribution_params' value and gradients are unchanged."
    ),
    "sb3_safe/common/kl.py:core/NumberReplacer:29@1bbd4ca6d28d": (
        "gaussian_kl: z^2 + expm1(2d) >= expm1(2d) >= 2d in floating point (rounded addition of a non-negative term "
        "is monotone; a faithfully rounded expm1(x) is never below x, checked exhaustively on CPU for every float32 "
        "|x| < 4), so the sum before the clamp is never negative and clamp(min=-1) == clamp(min=0)."
    ),
    "sb3_safe/common/kl.py:core/NumberReplacer:389@1bbd4ca6d28d": (
        "_batch_mean only receives 1-D per-sample KLs (batch,), so shape[-1] is shape[0]."
    ),
    "sb3_safe/common/kl.py:core/NumberReplacer:391@1bbd4ca6d28d": (
        "_batch_mean only receives 1-D per-sample KLs (batch,), so sum(dim=-1) is sum(dim=0)."
    ),
    "sb3_safe/common/kl.py:core/NumberReplacer:411@1bbd4ca6d28d": (
        "A single categorical then takes the multi-categorical path: the same per-sample kl_div sums ('none' "
        "identical); for 'batchmean' each sample is clamped at 0 before the divided sum instead of the divided sum "
        "being clamped, which differs only by the float rounding (~1e-7) of nearly equal samples: the mean of the "
        "per-sample KLs either way."
    ),
    "sb3_safe/common/kl.py:core/NumberReplacer:413@1bbd4ca6d28d": (
        "Taken only when len(log_probs) == 1, where log_probs[-1] is log_probs[0]."
    ),
    "sb3_safe/common/kl.py:core/NumberReplacer:425@1bbd4ca6d28d": (
        "expm1(x) - x with x = the clamped log-ratio is never negative in floating point (a faithfully rounded "
        "expm1(x) is >= x; checked exhaustively on CPU for every float32 |x| < 4, beyond which the difference is >= "
        "1), so clamp(min=-1) == clamp(min=0)."
    ),
    "sb3_safe/common/kl.py:core/ReplaceTrueWithFalse:0@1bbd4ca6d28d": (
        "grads and ctx.shapes are both 4-tuples by construction, so strict=True never raises and zip is the same."
    ),
    "sb3_safe/common/kl.py:core/ReplaceTrueWithFalse:1@1bbd4ca6d28d": (
        "grads, ctx.shapes, ctx.dtypes and needs[:4] all have exactly 4 entries by construction: zip is the same."
    ),
    "sb3_safe/common/kl.py:core/ReplaceTrueWithFalse:3@1bbd4ca6d28d": (
        "split() with sizes from log_probs raises unless they sum to old_params' width, and then returns exactly "
        "len(log_probs) chunks, so the two zipped sequences always have equal length."
    ),
    "sb3_safe/common/kl.py:core/ReplaceAndWithOr:0@1bbd4ca6d28d": (
        "grad_mean is None only when neither needs[0] nor needs[2]; the mutant only also returns -grad_mean for a "
        "mean_q that does not require grad, a gradient autograd discards (a Function may return one for such an "
        "input)."
    ),
    "sb3_safe/common/kl.py:core/ReplaceAndWithOr:1@1bbd4ca6d28d": (
        "g is computed whenever its input needs a gradient (grads[0:2] if needs[0] or needs[1], grads[2:4] if "
        "needs[2] or needs[3]); the mutant only adds gradients for inputs that do not require grad, which autograd "
        "discards."
    ),
    "sb3_safe/common/kl.py:core/RemoveDecorator:0@1bbd4ca6d28d": (
        "autograd calls forward through the class (cls.forward(ctx, *args)); a plain function looked up on a class is"
        " the function itself in Python 3, so it receives the same arguments with or without @staticmethod."
    ),
    "sb3_safe/common/kl.py:core/RemoveDecorator:1@1bbd4ca6d28d": (
        "autograd calls backward through the class (_forward_cls.backward(ctx, *grads)); a plain function looked up "
        "on a class is the function itself in Python 3, so it receives the same arguments with or without "
        "@staticmethod."
    ),
    "sb3_safe/common/kl.py:core/RemoveDecorator:3@1bbd4ca6d28d": (
        "autograd calls forward through the class (cls.forward(ctx, *args)); a plain function looked up on a class is"
        " the function itself in Python 3, so it receives the same arguments with or without @staticmethod."
    ),
    "sb3_safe/common/kl.py:core/RemoveDecorator:4@1bbd4ca6d28d": (
        "autograd calls backward through the class (_forward_cls.backward(ctx, *grads)); a plain function looked up "
        "on a class is the function itself in Python 3, so it receives the same arguments with or without "
        "@staticmethod."
    ),
    "sb3_safe/common/kl.py:core/RemoveDecorator:2@1bbd4ca6d28d": (
        "Without @functools.cache _legendre recomputes the same nodes and weights (numpy's deterministic leggauss, "
        "the same float64 tensors) on every call instead of once per device: the same values, more work."
    ),
    "sb3_safe/common/kl.py:core/ReplaceComparisonOperator_NotEq_Eq:0@1bbd4ca6d28d": (
        "_may_hold then is True for every CPU tensor: the far-tail and quadrature regimes are computed for every "
        "batch, and th.where keeps their results only where tail / short hold, as when they run anyway (off the CPU "
        "it reads mask.any(), a device sync, and skips a regime no element is in, as the CPU path does): the same "
        "values and gradients, other work."
    ),
    "sb3_safe/common/kl.py:core/ReplaceComparisonOperator_Lt_LtE:2@1bbd4ca6d28d": (
        "Changes the choice only at upper == 0.0 exactly, where complements[0] = masses_p[0] = 0.5 exactly: 0.5 - "
        "Phi(lower) or 1 - (0.5 + Phi(lower)) (the subtraction from 1 exact), one ulp of 0.5 apart; the mass is used "
        "only outside the quadrature regime, where lower < upper - 2 then, so it is >= 0.47 (2e-16 relative)."
    ),
    "sb3_safe/common/kl.py:core/ReplaceComparisonOperator_Gt_GtE:0@1bbd4ca6d28d": (
        "Changes the choice only at lower == 0.0 exactly, where complements[1] = masses_p[1] = 0.5 exactly: 0.5 - "
        "Phi(-upper) or 1 - (Phi(-upper) + 0.5), one ulp of 0.5 apart; outside the quadrature regime (the only one "
        "that uses the mass) upper > 2 then, so the mass is >= 0.47 (2e-16 relative)."
    ),
    "sb3_safe/common/kl.py:core/NumberReplacer:130@1bbd4ca6d28d": (
        "For lower in (0, 1] the mass becomes 1 - Phi(-upper) - Phi(lower) instead of Phi(-lower) - Phi(-upper): both"
        " differences of values in [0.16, 0.84] (~1e-16 absolute rounding); only the moments about p's mean use it, "
        "outside the quadrature regime, which there needs half_width > 1 (with lower <= 1 the slope test holds "
        "otherwise), so the mass is >= Phi(-1) - Phi(-3) = 0.157: both ~1e-15 relative, as the original's other "
        "branches (max 1.6e-15 relative difference over 52000 inputs; the tail form for lower > 5 is kept)."
    ),
    "sb3_safe/common/kl.py:core/NumberReplacer:131@1bbd4ca6d28d": (
        "For lower in (-1, 0] the mass becomes Phi(-lower) - Phi(-upper) instead of 1 - Phi(-upper) - Phi(lower): "
        "both differences of values in [0.16, 0.84] (~1e-16 absolute rounding); outside the quadrature regime (the "
        "only one that uses the mass) half_width > 1 there, so the mass is >= 0.34: the same to ~1e-15 relative (max "
        "5.8e-16 relative difference over 52000 inputs)."
    ),
    "sb3_safe/common/kl.py:core/NumberReplacer:136@1bbd4ca6d28d": (
        "For upper in [0, 1) (lower <= 0) the mass becomes Phi(upper) - Phi(lower) instead of 1 - Phi(-upper) - "
        "Phi(lower): both differences of values in [0.16, 0.84] (~1e-16 absolute rounding); outside the quadrature "
        "regime (the only one that uses the mass) half_width > 1 there, so the mass is >= 0.34: the same to ~1e-15 "
        "relative (max 5e-16 relative difference over 52000 inputs)."
    ),
    "sb3_safe/common/kl.py:core/NumberReplacer:137@1bbd4ca6d28d": (
        "For upper in [-1, 0) the mass becomes 1 - Phi(-upper) - Phi(lower) instead of Phi(upper) - Phi(lower): both "
        "differences of values in [0.16, 0.84] (~1e-16 absolute rounding); outside the quadrature regime (the only "
        "one that uses the mass) half_width > 1 there, so the mass is >= 0.157: the same to ~1e-15 relative (max "
        "1.5e-15 relative difference over 52000 inputs)."
    ),
    "sb3_safe/common/kl.py:core/ReplaceComparisonOperator_Lt_LtE:6@1bbd4ca6d28d": (
        "Adds the far-tail form only at upper == -_TAIL_Z exactly, where both forms are accurate: the moments about "
        "p's mean (used for every z above -5) cancel by ~z^4 / 2, measured < 6 ulps; the tail form's Mills ratios are"
        " within ~1 eps from 5 on (test_the_far_tails_mills_ratios_are_accurate); all accuracy tests pass on it."
    ),
    "sb3_safe/common/kl.py:core/ReplaceComparisonOperator_Gt_GtE:1@1bbd4ca6d28d": (
        "Adds the far-tail form only at lower == _TAIL_Z exactly, where both forms are accurate: the moments about "
        "p's mean (used for every z below 5) cancel by ~z^4 / 2, measured < 6 ulps; the tail form's Mills ratios are "
        "within ~1 eps from 5 on (test_the_far_tails_mills_ratios_are_accurate); all accuracy tests pass on it."
    ),
    "sb3_safe/common/kl.py:core/ReplaceComparisonOperator_Lt_LtE:7@1bbd4ca6d28d": (
        "beyond_upper matters only for the elements th.where(tail, ...) keeps, where upper < -5 or lower > 5 (so "
        "upper > 5): `upper <= 0.0` and `upper < 0.0` agree there; the other elements' results are discarded (the "
        "backward reads only the selected first / first_gap / second_gap)."
    ),
    "sb3_safe/common/kl.py:core/NumberReplacer:192@1bbd4ca6d28d": (
        "beyond_upper matters only for the elements th.where(tail, ...) keeps, where upper < -5 or lower > 5 (so "
        "upper > 5): `upper < 1.0` and `upper < 0.0` agree there; the other elements' results are discarded."
    ),
    "sb3_safe/common/kl.py:core/NumberReplacer:193@1bbd4ca6d28d": (
        "beyond_upper matters only for the elements th.where(tail, ...) keeps, where upper < -5 or lower > 5 (so "
        "upper > 5): `upper < -1.0` and `upper < 0.0` agree there; the other elements' results are discarded."
    ),
    "sb3_safe/common/kl.py:core/ReplaceComparisonOperator_Lt_LtE:8@1bbd4ca6d28d": (
        "Adds to free_p only elements with a clip point's z-score clamped at exactly 1e15; with its difference <= "
        "1e20 that needs std_p <= 1e5, and then the slope 3 |mean_p| / std_p^2 >= 3e15 / std_p - 9 / std_p^2 > 2: "
        "never in the quadrature regime (short), so nothing changes."
    ),
    "sb3_safe/common/kl.py:core/ReplaceComparisonOperator_LtE_Lt:2@1bbd4ca6d28d": (
        "Differs only where a clip point's difference is exactly 1e20 (|mean_p| ~ 1e20); the slope test then needs "
        "std_p^2 >= 1.5e20, so |z| >= 1e20 / 2.35e17 = 425: p's densities and interior mass underflow to 0 and every "
        "regime gives 0 for the interior, first, first_gap and second_gap (none of 20000 such inputs differ)."
    ),
    "sb3_safe/common/kl.py:core/ReplaceBinaryOperator_BitAnd_BitOr:3@1bbd4ca6d28d": (
        "free_p then holds where either test does: with a z-score clamped (its difference <= 1e20), which fails the "
        "slope test as for `<=` (std_p <= 1e5, slope > 2); or with a clip difference beyond 1e20 (|mean_p| > 1e20), "
        "where the slope test needs std_p >= 1.2e10, so |z| >= 425 and p's interior underflows: 0 in every regime "
        "(none of 20000 such inputs differ)."
    ),
    "sb3_safe/common/kl.py:core/ReplaceComparisonOperator_LtE_Lt:0@1bbd4ca6d28d": (
        "Differs only where a q clip difference is exactly 1e20, where its clamp is inactive (the clamped value is "
        "the value): the mutant takes rho z + delta instead of q's own z-score, the same quantity; with |mean_q| ~ "
        "1e20 and |mean_p - mean_q| <= 1e20 its terms are at most ~3 times it (no cancellation beyond a few ulps, "
        "against 1e5 times where the form matters: 'p wide, its mean far from q's')."
    ),
    "sb3_safe/common/kl.py:core/ReplaceComparisonOperator_LtE_Lt:1@1bbd4ca6d28d": (
        "Differs only where |mean_p - mean_q| is exactly 1e20, where its clamp is inactive: the mutant takes rho z + "
        "delta, the same quantity as q's own z-score; it cancels much only with mean_q near the clip points, so "
        "|mean_p| ~ 1e20 and p's z-scores >= 425 (std_p <= 2.35e17), where p's densities and interior mass underflow "
        "and multiply q's z-scores by 0."
    ),
    "sb3_safe/common/kl.py:core/NumberReplacer:153@1bbd4ca6d28d": (
        "Differs only where exactly one distribution's clip differences exceed 1e20. p's: |mean_p| > 1e20, p's "
        "z-scores >= 425, its densities and interior mass 0, so q's z-scores are multiplied by 0. q's: the mutant "
        "takes q's clamped z-score (-1e20 / std_q at both clip points) for rho z + delta, off by (|mean_q| - 1e20) / "
        "std_q <= |mean_p| / std_q; p's clip densities are non-zero only for std_p >= |mean_p| / 38, so its interval "
        "is <= 228 / |mean_p| of its stds wide and the two clip points' terms, shifted alike, cancel: a relative "
        "effect ~1e-18 (20000 such inputs: the same units as the original)."
    ),
    "sb3_safe/common/kl.py:core/ReplaceComparisonOperator_Lt_LtE:9@1bbd4ca6d28d": (
        "Differs only where own_terms == |delta| + |by_mean| exactly: the two forms of z_q - z's offset then have "
        "terms of the same size, so either is as accurate (the same quantity, to rounding)."
    ),
    "sb3_safe/common/kl.py:core/ReplaceComparisonOperator_LtE_Lt:3@1bbd4ca6d28d": (
        "Differs only at half_width == 1.0 exactly (std_p = 3), where both forms are accurate: quadrature is accurate"
        " well past it (with _SHORT_WIDTH = 2: max 0.24 units of eps scale against the mpmath reference over 20000 "
        "inputs at the regime's edges, as the original), and the original itself takes the other forms for half_width"
        " just above 1."
    ),
    "sb3_safe/common/kl.py:core/ReplaceComparisonOperator_LtE_Lt:4@1bbd4ca6d28d": (
        "Differs only where the slope |mean_p| half_width / std_p == 2.0 exactly, where both forms are accurate: "
        "quadrature is accurate past it (with _SHORT_SLOPE = 3: max 0.42 units over 40000 inputs at the regime's "
        "edges, the original 0.21), and the original itself takes the other forms for a slope just above 2."
    ),
    "sb3_safe/common/kl.py:core/NumberReplacer:60@1bbd4ca6d28d": (
        "17 Gauss-Legendre nodes instead of 16 (exact to degree 33 instead of 31) for p's moments over an interval at"
        " most 2 of p's stds wide where its log-density changes by at most 8: both far below float64 resolution "
        "there; value and gradient agree with the mpmath reference as the original's (same units, max 0.27, over "
        "40000 inputs at the regime's edges; 4e-7 relative differences only of tiny KLs of close distributions, below"
        " eps scale)."
    ),
    "sb3_safe/common/kl.py:core/NumberReplacer:61@1bbd4ca6d28d": (
        "15 Gauss-Legendre nodes instead of 16 (exact to degree 29) for p's moments over an interval at most 2 of p's"
        " stds wide where its log-density changes by at most 8: both far below float64 resolution there; value and "
        "gradient agree with the mpmath reference as the original's (same units, max 0.28, over 60000 inputs at the "
        "regime's edges)."
    ),
    "sb3_safe/common/kl.py:core/NumberReplacer:62@1bbd4ca6d28d": (
        "Quadrature up to a half-width of 2 of p's stds instead of 1: 16 nodes stay exact far below float64 "
        "resolution there (the log-density's change is still bounded by the slope test); max 0.24 units of eps scale "
        "against the mpmath reference over 20000 inputs at that edge, as the original."
    ),
    "sb3_safe/common/kl.py:core/NumberReplacer:64@1bbd4ca6d28d": (
        "Quadrature up to a log-density change of 12 instead of 8 across the interval: 16 nodes stay accurate (max "
        "0.42 units of eps scale against the mpmath reference over 40000 inputs at that edge, the original 0.21; "
        "gradients as the original's)."
    ),
    "sb3_safe/common/kl.py:core/NumberReplacer:65@1bbd4ca6d28d": (
        "Quadrature only up to a log-density change of 4: for slopes in (1, 2] the other forms take over, where the "
        "interval lies >= 1 / half_width of p's stds from its mean: the moments about p's mean then cancel by at most"
        " 1 / half_width^2 <= 25 (below z = 5), those about the clip point by at most 1 / (1 - e^-2); max 0.31 units "
        "over 40000 inputs there (the original 0.16), gradients as the original's."
    ),
    "sb3_safe/common/kl.py:core/ReplaceBinaryOperator_Add_Sub:2@1bbd4ca6d28d": (
        "Starting the backward recursion from the fixed point of r_23 instead of r_25: 22 damping steps from x >= 5 "
        "still converge; M1 / M0 within 0.9 eps and M2 / M1 within 4.3 eps of mpmath over x in [5, 1e15] (the "
        "original 0.7, 1.0), inside test_the_far_tails_mills_ratios_are_accurate's 8 eps, and the KL's tail term "
        "weights them by <= 2 / x^4 of its scale: the same KL to rounding."
    ),
    "sb3_safe/common/kl.py:core/NumberReplacer:68@1bbd4ca6d28d": (
        "25 continued-fraction terms instead of 24: converged the same (M1 / M0 within 0.72 eps, M2 / M1 within 0.73 "
        "eps of mpmath over x in [5, 1e15], as the original)."
    ),
    "sb3_safe/common/kl.py:core/NumberReplacer:69@1bbd4ca6d28d": (
        "23 continued-fraction terms instead of 24: still converged from x = 5 (M1 / M0 within 0.72 eps, M2 / M1 "
        "within 2.2 eps of mpmath over x in [5, 1e15]; the original 0.72, 1.03), inside the 8 eps "
        "test_the_far_tails_mills_ratios_are_accurate allows: the same KL to rounding."
    ),
    "sb3_safe/common/kl.py:core/NumberReplacer:72@1bbd4ca6d28d": (
        "Starting from the fixed point of r_26 instead of r_25: converged the same (M1 / M0 within 0.74 eps, M2 / M1 "
        "within 2.8 eps of mpmath over x in [5, 1e15]; the original 0.72, 1.03), inside the 8 eps "
        "test_the_far_tails_mills_ratios_are_accurate allows."
    ),
    "sb3_safe/common/kl.py:core/NumberReplacer:73@1bbd4ca6d28d": (
        "Starting from the fixed point of r_24 instead of r_25: converged the same (M1 / M0 within 0.72 eps, M2 / M1 "
        "within 2.2 eps of mpmath over x in [5, 1e15]; the original 0.72, 1.03), inside the 8 eps "
        "test_the_far_tails_mills_ratios_are_accurate allows."
    ),
    "sb3_safe/common/kl.py:core/NumberReplacer:76@1bbd4ca6d28d": (
        "A start 2 start / (x + sqrt(x^2 + 5 start)) instead of + 4 start: a slightly worse initial estimate that the"
        " 23 backward steps damp (M1 / M0 within 0.87 eps, M2 / M1 within 4.3 eps of mpmath over x in [5, 1e15]; the "
        "original 0.72, 1.03), inside the 8 eps test_the_far_tails_mills_ratios_are_accurate allows."
    ),
    "sb3_safe/common/kl.py:core/NumberReplacer:77@1bbd4ca6d28d": (
        "A start 2 start / (x + sqrt(x^2 + 3 start)) instead of + 4 start: a slightly worse initial estimate that the"
        " 23 backward steps damp (M1 / M0 within 0.97 eps, M2 / M1 within 6.2 eps of mpmath over x in [5, 1e15]; the "
        "original 0.72, 1.03), inside the 8 eps test_the_far_tails_mills_ratios_are_accurate allows."
    ),
    "sb3_safe/common/adaptive_lr.py:core/ReplaceComparisonOperator_Lt_LtE:5@8453bf549db7": (
        "_decide: where the newest factor is exactly 1.0 the mutant returns factors[-1] == 1.0, and the original falls"
        " through to `min(factors) <= 1.0`, which holds (1.0 is among them) and returns 1.0: the same value."
    ),
    "sb3_safe/common/adaptive_lr.py:core/ReplaceComparisonOperator_LtE_Lt:5@8453bf549db7": (
        "_decide: the two differ only where min(factors) == 1.0 exactly; the original returns 1.0, the mutant falls"
        " through to `return min(factors)`, which is 1.0: the same value."
    ),
    "sb3_safe/common/adaptive_lr.py:core/ReplaceComparisonOperator_Gt_GtE:2@8453bf549db7": (
        "learning_rate is the optimizer's rate after train(), which the bounded ScaledSchedule set (set at training"
        " start; _check_bounds requires lowest > 0), so it is >= lowest > 0 and `> 0.0` and `>= 0.0` always agree."
    ),
    "sb3_safe/common/adaptive_lr.py:core/NumberReplacer:87@8453bf549db7": (
        "learning_rate is the step's rate, clamped into lr_bounds whose lowest is > 0 (_check_bounds), so"
        " `> 0.0` and `> -1.0` are both always true."
    ),
    "sb3_safe/common/adaptive_lr.py:core/ReplaceComparisonOperator_Gt_GtE:3@8453bf549db7": (
        "_limited returns 1.0 at line 426 whenever factor == 1.0, so at line 430 factor != 1.0 and"
        " `factor > 1.0` and `factor >= 1.0` agree."
    ),
    "sb3_safe/common/adaptive_lr.py:core/NumberReplacer:41@8453bf549db7": (
        "verbose default -1 instead of 0: the only read of self.verbose is `self.verbose >= 1` (print a redo), false"
        " for both; BaseCallback only stores it."
    ),
    "sb3_safe/common/adaptive_lr.py:core/NumberReplacer:56@8453bf549db7": (
        "_window_start's initial value is never read: _on_training_start sets it to model.num_timesteps before any"
        " update is judged (judge_update is only reachable through a learn())."
    ),
    "sb3_safe/common/adaptive_lr.py:core/NumberReplacer:57@8453bf549db7": (
        "_window_start's initial value is never read: _on_training_start sets it to model.num_timesteps before any"
        " update is judged."
    ),
    "sb3_safe/common/adaptive_lr.py:core/NumberReplacer:58@8453bf549db7": (
        "The initial deque is replaced in _on_training_start by deque(maxlen=targets.raise_after) before _decide can"
        " append to it; its maxlen is never observed."
    ),
    "sb3_safe/common/adaptive_lr.py:core/NumberReplacer:60@8453bf549db7": (
        "_updates' initial value is never read: at the first learn() _counted_model is None, so same_model is False"
        " and _on_training_start resets _updates to 0 before prepare_update reads it."
    ),
    "sb3_safe/common/adaptive_lr.py:core/NumberReplacer:61@8453bf549db7": (
        "_updates' initial value is never read: the first learn() resets it to 0 (_counted_model is None, so"
        " same_model is False) before prepare_update reads it."
    ),
    "sb3_safe/common/adaptive_lr.py:core/NumberReplacer:62@8453bf549db7": (
        "_measure_every's initial value is never read: _on_training_start always assigns it (line 304) before"
        " prepare_update uses it."
    ),
    "sb3_safe/common/adaptive_lr.py:core/NumberReplacer:63@8453bf549db7": (
        "_measure_every's initial value (0 would divide by zero) is never read: _on_training_start always assigns it"
        " before prepare_update uses it."
    ),
    "sb3_safe/common/adaptive_lr.py:core/NumberReplacer:84@8453bf549db7": (
        "The `else 1` branch needs model.env None, which cannot be inside learn(): SB3 collects rollouts from"
        " model.env, so a redo (which follows a collected rollout) always has an env and reads env.num_envs."
    ),
    "sb3_safe/common/adaptive_lr.py:core/NumberReplacer:85@8453bf549db7": (
        "The `else 1` branch needs model.env None, which cannot be inside learn() (SB3 collects the rollout being"
        " redone from model.env): the constant is never used."
    ),
    "sb3_safe/common/adaptive_lr.py:core/NumberReplacer:91@8453bf549db7": (
        "param_groups[0] vs [-1]: SB3's policies build their optimizer with one parameter group, and both SB3's"
        " update_learning_rate and schedules.apply_learning_rate set every group to the same rate, so first == last."
    ),
    "sb3_safe/common/adaptive_lr.py:core/NumberReplacer:105@8453bf549db7": (
        "_limited never returns 0 (a clamped rate >= lowest > 0 over rate > 0), so the mutant only adds"
        " scale_learning_rate(..., 1.0) calls: the same scale and bounds, and the optimizer set to the schedule's"
        " current rate, which train() (at the same progress) or the last scaling already set."
    ),
    "sb3_safe/common/adaptive_lr.py:core/ReplaceTrueWithFalse:4@8453bf549db7": (
        "lean=False only adds a gradient-norm statistic (never read for an undo) and a VecNormalize copy: the"
        " snapshot is taken at the rollout end and restored before the next env step, and train() does not touch"
        " VecNormalize, so its restore writes back the values already there."
    ),
    "sb3_safe/common/adaptive_lr.py:core/ReplaceFalseWithTrue:3@8453bf549db7": (
        "A recorder armed at construction only records an unmeasured update's batch, which nothing reads: every"
        " measured update (and every redo) calls arm() first, which clears `recorded` before its step."
    ),
    "sb3_safe/common/adaptive_lr.py:core/ReplaceFalseWithTrue:4@8453bf549db7": (
        "A2C-style train() takes exactly one optimizer step per update, so disarming after it changes nothing for"
        " that update; staying armed only records later unmeasured updates, never read, as arm() clears `recorded`"
        " before each measured update and redo."
    ),
    "sb3_safe/common/adaptive_lr.py:core/ReplaceBreakWithContinue:0@8453bf549db7": (
        "When the loop breaks because there is nothing to undo, kl and the snapshot are unchanged, so with"
        " `continue` every remaining iteration re-evaluates the same condition and does nothing: same state after."
    ),
    "sb3_safe/common/adaptive_lr.py:core/ReplaceBreakWithContinue:1@8453bf549db7": (
        "When the cut is >= 1 (rate at the lower bound) nothing has changed, so with `continue` each remaining"
        " iteration computes the same kl test and the same cut >= 1 and does nothing: same state after the loop."
    ),
    "sb3_safe/common/distributions.py:core/ReplaceComparisonOperator_Lt_LtE:2@283c5f01c4f6": (
        "The two branches of log_normal_cdf agree at the only point where the choice changes (z = 0 or -0): both give "
        "log(0.5) and both have gradient sqrt(2/pi), bit for bit in float32 and float64 (checked numerically)."
    ),
    "sb3_safe/common/distributions.py:core/NumberReplacer:12@283c5f01c4f6": (
        "1e20 and 1e+20 are the same float literal: DIFFERENCE_LIMIT keeps exactly the same value."
    ),
    "sb3_safe/common/distributions.py:core/NumberReplacer:13@283c5f01c4f6": (
        "1e20 and 1e+20 are the same float literal: DIFFERENCE_LIMIT keeps exactly the same value."
    ),
    "sb3_safe/common/distributions.py:core/NumberReplacer:19@283c5f01c4f6": (
        "np.nextafter(float32 1, float32 -1) and np.nextafter(float32 1, float32 0) are the same number (the largest "
        "float32 below 1), so INNER_LIMIT does not change."
    ),
    "sb3_safe/common/distributions.py:core/NumberReplacer:54@283c5f01c4f6": (
        "Clamping the left tail's input at 1 instead of 0 changes left_tail only where z > 0, where th.where selects "
        "right_side; left_tail stays finite there (z <= 1), so the unselected branch gets a zero gradient: identical "
        "values and gradients (checked on float32 and float64 grids)."
    ),
    "sb3_safe/common/distributions.py:core/NumberReplacer:57@283c5f01c4f6": (
        "Clamping the right side's input at -1 instead of 0 changes right_side only where z < 0, where th.where "
        "selects left_tail; right_side stays finite there (Phi(-1) > 0), so values and gradients are identical "
        "(checked on float32 and float64 grids)."
    ),
    # A snapshot's defaults: only a committed snapshot is read, and commit() captures it first
    "sb3_safe/common/guard/snapshot.py:core/NumberReplacer:0@7e233fc9058b": (
        "the default `timestep` is never read: capture() sets it on every snapshot before commit() makes it the healthy"
        " one, and only the healthy one is read (statistics, the rollback and stop messages)"
    ),
    "sb3_safe/common/guard/snapshot.py:core/NumberReplacer:1@7e233fc9058b": (
        "the default `timestep` is never read: capture() sets it on every snapshot before commit() makes it the healthy"
        " one, and only the healthy one is read (statistics, the rollback and stop messages)"
    ),
    "sb3_safe/common/guard/snapshot.py:core/NumberReplacer:2@7e233fc9058b": (
        "the default `lr_scale` is never read: its one reader is a rollback, whose store is restorable, and capture()"
        " sets it on every restorable snapshot before commit(); a non-restorable one (raise mode) is never restored"
    ),
    "sb3_safe/common/supervisor.py:core/RemoveDecorator:0@c12fe12d5480": (
        "`Guard` is a typing Protocol (not runtime-checkable, never in isinstance): its `stopping` member is read only on"
        " the guards, whose own `stopping` is a property; the Protocol's body never runs"
    ),
    "sb3_safe/common/guard/snapshot.py:core/NumberReplacer:3@7e233fc9058b": (
        "the default `lr_scale` is never read (as for 2.0): capture() sets it on every restorable snapshot before"
        " commit(), and only a restorable one is rolled back to"
    ),
    "sb3_safe/common/guard/snapshot.py:core/ReplaceTrueWithFalse:0@7e233fc9058b": (
        "capture()'s default `restorable` is never read: its one caller, SnapshotStore.commit, passes it"
    ),
    "sb3_safe/common/guard/snapshot.py:core/ReplaceFalseWithTrue:0@7e233fc9058b": (
        "capture()'s default `lean` is never read: its one caller, SnapshotStore.commit, passes it"
    ),
    "sb3_safe/common/guard/snapshot.py:core/ReplaceTrueWithFalse:1@7e233fc9058b": (
        "the three zipped lists always have the same length: capture() builds the states and groups from the same"
        " `watched.optimizers` list restore() zips them with, fixed when the WatchedModel is built"
    ),
    "sb3_safe/common/guard/snapshot.py:core/ReplaceTrueWithFalse:2@7e233fc9058b": (
        "a snapshot's groups are copied from the same optimizer and nothing in SB3, sb3-contrib or sb3-safe adds a"
        " param group during learn(): the lengths are equal, `strict` only guards against such an addition"
    ),
    "sb3_safe/common/supervisor.py:core/ReplaceFalseWithTrue:0@c12fe12d5480": (
        "`restored` is read only after rollout_end(), which sets it to False first (after_update and judge_update)"
    ),
    "sb3_safe/common/supervisor.py:core/ReplaceFalseWithTrue:1@c12fe12d5480": (
        "`restored` is read only after rollout_end(), which sets it to False first (after_update and judge_update)"
    ),
    "sb3_safe/common/supervisor.py:core/ReplaceContinueWithBreak:0@c12fe12d5480": (
        "in every algorithm SB3, sb3-contrib and sb3-safe ship the schedules read are callable but `clip_range_vf`"
        " (PPO's family, the last name looped over), so no callable schedule follows a skipped one"
    ),
    "sb3_safe/doctor/pickles.py:core/NumberReplacer:21@9c160def3685": (
        "reads the pickle of the last record's folder instead of the first's: torch (2.13) refuses to load any zip"
        " with a record outside the first record's folder, so for every zip torch loads both name the same data.pkl;"
        " only the report on a zip torch refuses anyway differs (neither healthy)"
    ),
    "sb3_safe/doctor/allowlist.py:core/NumberReplacer:0@e39f2d4b9f64": (
        "`split('.', 2)[0]` is `split('.', 1)[0]` for every string: the first part ends at the first '.' whatever"
        " the number of splits"
    ),
    "sb3_safe/doctor/pickles.py:core/NumberReplacer:22@9c160def3685": (
        "`name.split('/', 2)[0]` is `name.split('/', 1)[0]` for every string: the first part ends at the first '/'"
        " whatever the number of splits"
    ),
    "sb3_safe/common/guard/response.py:core/NumberReplacer:14@6d17786cfdd2": (
        "the episode count of the RolloutReturn that ends an off-policy learn() is never read: SB3's"
        " OffPolicyAlgorithm.learn breaks on `continue_training=False` before it reads the counts"
    ),
    "sb3_safe/common/distributions.py:core/ReplaceComparisonOperator_GtE_Gt:2@283c5f01c4f6": (
        "changes only a variance of exactly exp(-2 LOG_STD_LIMIT) (one float64 value, clamped to that same value"
        " either way): there fresh noise replaces the exploration matrix's, both draws of the same Normal(mean,"
        " bounded std); the distribution, its log-prob and entropy are unchanged"
    ),
    "sb3_safe/common/distributions.py:core/NumberReplacer:11@283c5f01c4f6": (
        "Z_SCORE_LIMIT 1e15 moved by 1 (1e-15 relative): float32 clamps and comparisons round both to the same value"
        " (999999986991104); float64 ones differ only for a z-score within 1 of 1e15, clamped 1e-15 relative lower,"
        " far below any tolerance a promise states"
    ),
    "sb3_safe/common/distributions.py:core/ReplaceFalseWithTrue:3@283c5f01c4f6": (
        "argument validation only: the logits are checked finite and bounded first, so every valid input gives the"
        " same values; only an action outside a sub-space's support given to log_prob differs (a ValueError instead"
        " of torch's indexing: an IndexError out of range, a fractional action truncated)"
    ),
    "sb3_safe/common/adaptive_lr.py:core/NumberReplacer:59@8453bf549db7": (
        "the deque of recent windows built in __init__ is never used: _on_training_start replaces it (maxlen"
        " raise_after) before any decision appends to it or reads it"
    ),
    "sb3_safe/ppo_kl/ppo_kl.py:core/RemoveDecorator:1@ed45d85562e1": (
        "`@th.no_grad()` on _rollout_kl only spares building an autograd graph nobody backpropagates: the KL it"
        " returns is the same float"
    ),
    "sb3_safe/common/adaptive_lr.py:core/NumberReplacer:69@8453bf549db7": (
        "`max(0, ceil(MEASURED_SAMPLES / rollout_size))` is `max(1, ...)`: both are positive, so the ceiling is at least 1"
    ),
    "sb3_safe/common/adaptive_lr.py:core/ReplaceOrWithAnd:14@8453bf549db7": (
        "the batch recorder is armed at each measured update, which clears `recorded` and `_batch`: a recording made"
        " while unarmed (the mutant's) is cleared before any update reads it, and no step comes armed without a batch"
        " (every train() reads the buffer before it steps)"
    ),
    "sb3_safe/common/guard/response.py:core/NumberReplacer:15@6d17786cfdd2": (
        "EndCollection's RolloutReturn is only read by OffPolicyAlgorithm.learn (DQN, SAC, TD3, DDPG, QRDQN, TQC, "
        "CrossQ all call super().learn), which breaks on continue_training=False before reading episode_timesteps and"
        " never reads n_episodes; the stand-in is removed at the end of learn(), so the first number is unobservable."
    ),
    "sb3_safe/common/guard/response.py:core/NumberReplacer:16@6d17786cfdd2": (
        "EndCollection's RolloutReturn is only read by OffPolicyAlgorithm.learn, which breaks on "
        "continue_training=False before reading any field but continue_training (n_episodes is never read there), and"
        " the stand-in is removed at the end of learn(), so the second number is unobservable."
    ),
    "sb3_safe/common/guard/response.py:core/NumberReplacer:17@6d17786cfdd2": (
        "EndCollection's RolloutReturn is only read by OffPolicyAlgorithm.learn, which breaks on "
        "continue_training=False before reading any field but continue_training (n_episodes is never read there), and"
        " the stand-in is removed at the end of learn(), so the second number is unobservable."
    ),
    "sb3_safe/a2c_safe/a2c_safe.py:core/NumberReplacer:29@a150e3909f70": (
        "The forward hook is registered on action_net only around the single evaluate_actions call of train(), and "
        "every actor-critic policy SafeA2C accepts (SB3's and sb3-safe's Mlp/Cnn/MultiInput) calls action_net exactly"
        " once there, so raw_outputs always holds one tensor and raw_outputs[0] is raw_outputs[-1]."
    ),
    "sb3_safe/common/distributions.py:core/NumberReplacer:18@283c5f01c4f6": (
        "INNER_LIMIT = 1.0 changes squash() only where float32 tanh(u) / TANH_BOUND rounds onto 1.0 for some u < "
        "PRESQUASH_BOUND: on torch's CPU tanh none does (measured over the 2e6 float32 values below 3.0: the largest is "
        "0.99999994, INNER_LIMIT itself); the log-prob's clamp feeds only the density branch, which th.where does not "
        "select at +-1. The clamp guards other backends' tanh roundings."
    ),
    "sb3_safe/ppo_kl/ppo_kl.py:core/NumberReplacer:0@42117c5ddd88": (
        "_MEASURE_BATCH_SIZE 1024 -> 1025 only regroups the rollout into other no-gradient measuring batches (one"
        " permutation is drawn whatever the batch size, and in evaluation mode each row's KL does not depend on its"
        " batch), so the weighted mean sum(mean_b * n_b) / N is the same up to float rounding (summation order,"
        " matmul blocking, the per-batch clamp at 0 of a mean that rounding made negative): equivalent up to rounding."
    ),
    "sb3_safe/ppo_kl/ppo_kl.py:core/NumberReplacer:1@42117c5ddd88": (
        "_MEASURE_BATCH_SIZE 1024 -> 1023: as 1025, the same exact mean over the rollout from batches of another size,"
        " equal up to float rounding (summation order, matmul blocking): equivalent up to rounding."
    ),
    "sb3_safe/ppo_kl/ppo_kl.py:core/NumberReplacer:60@42117c5ddd88": (
        "The initial last_epoch_start is a dead store: every epoch overwrites it with len(minibatch_stats) before"
        " anything reads it, and with n_epochs=0 (no epoch) train() raises the same RuntimeError (th.stack of no rows)"
        " before the line that reads it, whatever its initial value."
    ),
    "sb3_safe/ppo_kl/ppo_kl.py:core/NumberReplacer:61@42117c5ddd88": (
        "The initial last_epoch_start is a dead store: every epoch overwrites it before it is read, and with"
        " n_epochs=0 train() raises the same RuntimeError (th.stack of no rows) before reading it."
    ),
}

#: One work copy, one mutant at a time (``--jobs`` above 1 is lowered to this)
MAX_JOBS = 1
#: Rows of every size in one JSONL (their keys name the source they mutated; the report says what each score is over)
ANY_SIZE = True
#: The work copy the mutants are written into (the checkout stays as it is: other jobs import it)
WORK = ROOT / "build" / "mutation"
#: The baselines, kept across sessions (keyed by the sources they ran)
BASELINES = ROOT / "build" / "mutation_baselines"
#: Copied into the work copy: what the mapped tests read
_COPIED = ("sb3_safe", "tests", "examples", "docs", "pyproject.toml", "README.md")
#: A mutant's tests may take this many times their baseline duration, plus this many seconds, before it counts as killed
_TIMEOUT_FACTOR, _TIMEOUT_SLACK = 3.0, 60.0
#: The size of each run: every mutant, every tenth, or the first three of each module
_STRIDES = {"full": 1, "quick": 10, "tiny": 0}

Mutant = tuple[str, str, int, int]  # (module, operator, occurrence, line)


# ----- the mutants -----


def _annotation_spans(source: str) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """(start, end) positions, as (line, column), of the type annotations, where ``|`` builds a union type."""
    spans = []
    for node in ast.walk(ast.parse(source)):
        annotations: list[ast.expr] = []
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            arguments = node.args
            every = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs, arguments.vararg, arguments.kwarg]
            annotations += [argument.annotation for argument in every if argument is not None and argument.annotation]
            annotations += [node.returns] if node.returns is not None else []
        elif isinstance(node, ast.AnnAssign):
            annotations.append(node.annotation)
        spans += [((a.lineno, a.col_offset), (a.end_lineno or a.lineno, a.end_col_offset or 0)) for a in annotations]
    return spans


def module_mutants(module: str) -> list[Mutant]:
    """Every mutant of ``module`` by :data:`OPERATORS`, outside type annotations."""
    import cosmic_ray.plugins
    from cosmic_ray.ast import ast_nodes, get_ast

    source = (ROOT / module).read_text()
    tree = get_ast(source)
    annotations = _annotation_spans(source)
    mutants = []
    for name in OPERATORS:
        operator = cosmic_ray.plugins.get_operator(name)()
        positions = [start for node in ast_nodes(tree) for start, _ in operator.mutation_positions(node)]
        for occurrence, (line, column) in enumerate(positions):
            if not any(start <= (line, column) < end for start, end in annotations):
                mutants.append((module, name, occurrence, line))
    return mutants


def mutated_source(module: str, operator: str, occurrence: int) -> str | None:
    """The source of ``module`` with one mutant applied (None: the operator has no such occurrence)."""
    source = (ROOT / module).read_text()
    if operator in HAND_MUTANTS:
        _, code, mutated = HAND_MUTANTS[operator]
        assert source.count(code) == 1, f"{operator}: the code it mutates changed"
        return source.replace(code, mutated)
    import cosmic_ray.plugins
    from cosmic_ray.mutating import mutate_code

    try:
        return mutate_code(source, cosmic_ray.plugins.get_operator(operator)(), occurrence)
    except AttributeError:
        # cosmic-ray's ExceptionReplacer lists a dotted name (``except binascii.Error``) but cannot rewrite it
        return None


def mutant_key(module: str, operator: str, occurrence: int) -> str:
    return f"{module}:{operator}:{occurrence}"


def source_hash(module: str) -> str:
    """The hash of ``module``'s source now: a row of another source measured other code."""
    return hashlib.sha256((ROOT / module).read_bytes()).hexdigest()[:12]


def diff(module: str, operator: str, occurrence: int) -> str:
    """The mutant's change, as changed lines (``-`` original, ``+`` mutated)."""
    source, mutated = (ROOT / module).read_text(), mutated_source(module, operator, occurrence) or ""
    lines = difflib.unified_diff(source.splitlines(), mutated.splitlines(), lineterm="", n=0)
    return "\n".join(line for line in lines if line[:1] in "+-" and line[:3] not in ("---", "+++"))


# ----- running tests in a forked child -----


def _prepare_parent() -> None:
    """Import once what every child needs (never sb3_safe: each child imports the mutated one)."""
    import gymnasium  # noqa: F401
    import hypothesis
    import pytest  # noqa: F401
    import stable_baselines3  # noqa: F401
    import torch as th

    th.set_num_threads(1)  # before any fork: one thread per child, no OpenMP pool to inherit
    os.environ["OMP_NUM_THREADS"] = "1"
    # Runs as reproducible as the tests allow, never failed by a deadline on a loaded machine, no shared database
    hypothesis.settings.register_profile("mutation", database=None, deadline=None, derandomize=True)
    hypothesis.settings.load_profile("mutation")


def make_work_copy() -> None:
    """A fresh copy of what the tests read, where mutants are written."""
    if WORK.exists():
        shutil.rmtree(WORK)
    WORK.mkdir(parents=True)
    for name in _COPIED:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, WORK / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        elif source.exists():
            shutil.copy2(source, WORK / name)


def _in_child(function: Callable[[], int], timeout: float) -> tuple[int | None, float]:
    """Run ``function`` in a forked child: its exit status (None: killed at the timeout) and the wall seconds."""
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        status = 3
        try:
            os.setpgid(0, 0)  # its own process group, so that a timeout also ends what it started
            with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull), contextlib.redirect_stderr(devnull):
                status = function()
        finally:
            os._exit(status)
    deadline = start + timeout
    while True:
        done, wait_status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(wait_status), time.perf_counter() - start
        if time.perf_counter() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return None, time.perf_counter() - start
        time.sleep(0.05)


def _pytest_in_work_copy(args: list[str], plugins: list[Any]) -> int:
    """In a child: run pytest on the work copy, with its sb3_safe imported fresh."""
    import pytest

    for name in [name for name in sys.modules if name == "sb3_safe" or name.startswith("sb3_safe.")]:
        del sys.modules[name]
    os.chdir(WORK)
    sys.path.insert(0, str(WORK))
    # Subprocesses the tests start (examples, the CLI) import the work copy too
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(WORK), os.environ.get("PYTHONPATH")]))
    base = ["-q", "-p", "no:cacheprovider", "-p", "no:randomly", "-p", "no:xdist"]
    return int(pytest.main([*base, *args], plugins=plugins))


class _Recorder:
    """A pytest plugin: each test's outcome and duration, and (with coverage) the lines it executes."""

    def __init__(self, order: dict[str, float] | None = None, selected: set[str] | None = None, cov: Any = None):
        self.order, self.selected, self.cov = order, selected, cov
        self.outcomes: dict[str, str] = {}
        self.durations: dict[str, float] = {}

    def pytest_collection_modifyitems(self, session: Any, config: Any, items: list[Any]) -> None:
        if self.selected is not None:
            deselected = [item for item in items if item.nodeid not in self.selected]
            items[:] = [item for item in items if item.nodeid in self.selected]
            config.hook.pytest_deselected(items=deselected)
        if self.order is not None:
            order = self.order
            items.sort(key=lambda item: order.get(item.nodeid, 0.0))

    def pytest_runtest_setup(self, item: Any) -> None:
        if self.cov is not None:
            self.cov.switch_context(item.nodeid)

    def pytest_runtest_logreport(self, report: Any) -> None:
        if report.failed or report.when == "call":
            self.outcomes[report.nodeid] = "failed" if report.failed else report.outcome
        self.durations[report.nodeid] = self.durations.get(report.nodeid, 0.0) + report.duration


def baseline(module: str, tests: list[str]) -> dict[str, Any]:
    """
    ``tests`` on the unmutated code, with coverage: which pass, how long each takes, which tests execute each line of
    ``module``. Cached in the work copy, keyed by the module's and the tests' sources.
    """
    # The work copy's files: what runs (the checkout's tests may have changed since the copy was made)
    digest = hashlib.sha256(
        b"".join((WORK / path).read_bytes() for path in [module, *tests, "tests/conftest.py"])
    ).hexdigest()[:16]
    cache = BASELINES / f"{module.replace('/', '_')}-{digest}.json"
    if cache.exists():
        return json.loads(cache.read_text())
    cache.parent.mkdir(parents=True, exist_ok=True)

    def run() -> int:
        import coverage

        cov = coverage.Coverage(data_file=None, include=[str(WORK / module)])
        recorder = _Recorder(cov=cov)
        cov.start()
        status = _pytest_in_work_copy(tests, [recorder])
        cov.stop()
        data = cov.get_data()
        lines = {
            str(line): sorted(contexts) for line, contexts in data.contexts_by_lineno(str(WORK / module)).items() if contexts
        }
        result = dict(status=status, outcomes=recorder.outcomes, durations=recorder.durations, lines=lines)
        cache.write_text(json.dumps(result))
        return 0

    status, wall = _in_child(run, timeout=4 * 3600)
    assert status == 0 and cache.exists(), f"the baseline of {module} failed (status {status})"
    print(f"[mutation] baseline of {module}: {wall:.0f} s", flush=True)
    return json.loads(cache.read_text())


def _statement_lines(module: str, line: int) -> tuple[int, list[int] | None]:
    """
    The first line of the innermost statement holding ``line`` (what coverage records), and the lines of the function
    whose body holds it (None: code that runs at import, a signature or decorator included).
    """
    statement, function = line, None
    for node in ast.walk(ast.parse((ROOT / module).read_text())):
        if not isinstance(node, ast.stmt) or not node.lineno <= line <= (node.end_lineno or node.lineno):
            continue
        definition = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        in_body = definition and line >= node.body[0].lineno  # type: ignore[attr-defined]
        if in_body and not isinstance(node, ast.ClassDef) and (function is None or node.lineno > function[0]):
            function = (node.lineno, node.end_lineno or node.lineno)
        if not in_body:
            statement = node.lineno if statement == line else max(statement, node.lineno)
    return statement, None if function is None else list(range(function[0], function[1] + 1))


def covering_tests(module: str, line: int, base: dict[str, Any]) -> list[str] | None:
    """The passing tests that execute the mutant's statement (its function's, all for import-time code); None: none."""
    passing = {test for test, outcome in base["outcomes"].items() if outcome == "passed"}
    statement, function = _statement_lines(module, line)
    by_line = {int(number): set(contexts) - {""} for number, contexts in base["lines"].items()}
    tests = by_line.get(statement, set())
    if not tests and function is not None:
        tests = set().union(*(by_line.get(number, set()) for number in function))
    if not tests and function is None:
        tests = passing  # module or class level: runs at import, for every test
    tests &= passing
    return sorted(tests) or None


# ----- the suite -----


def _all_mutants(size: str, modules: list[str]) -> list[Mutant]:
    # The hand mutants first: a few runs of one test file that show the machinery works
    mutants: list[Mutant] = [
        (module, name, 0, 0) for name, (module, _, _) in HAND_MUTANTS.items() if module in modules or module not in MODULES
    ]
    for module in modules:
        every = module_mutants(module)
        stride = _STRIDES[size]
        mutants += every[::stride] if stride else every[:3]
    return mutants


def select_modules(names: list[str] | None) -> list[str]:
    """The modules of :data:`MODULES` that ``names`` name (a path or its end, ``guard/snapshot.py``), in its order."""
    if not names:
        return list(MODULES)
    unknown = [name for name in names if not any(module == name or module.endswith("/" + name) for module in MODULES)]
    if unknown:
        raise ValueError(f"--modules: {unknown} name none of the measured modules {list(MODULES)}")
    return [module for module in MODULES if any(module == name or module.endswith("/" + name) for name in names)]


def jobs(size: str, modules: list[str] | None = None) -> list[Mutant]:
    """The mutants of a run of ``size``, of ``modules`` (names as :func:`select_modules` takes them; None: all)."""
    return _all_mutants(size, select_modules(modules))


def job_key(job: Mutant) -> str:
    module, operator = job[:2]
    target = HAND_MUTANTS[operator][0] if operator in HAND_MUTANTS else module
    return f"{mutant_key(*job[:3])}@{source_hash(target)}"


def row_key(row: dict[str, Any]) -> str:
    return f"{mutant_key(row['module'], row['operator'], row['occurrence'])}@{row.get('source')}"


def budget(size: str) -> dict[str, Any]:
    """The operators and the measured sources: a run of other code is another run."""
    sources = {module: hashlib.sha256((ROOT / module).read_bytes()).hexdigest()[:12] for module in MODULES}
    return dict(operators=OPERATORS, hand_mutants=sorted(HAND_MUTANTS), sources=sources)


_PREPARED: list[bool] = []


def run_job(job: Mutant) -> list[dict[str, Any]]:
    """Test one mutant: its row."""
    if not _PREPARED:
        _prepare_parent()
        make_work_copy()
        _PREPARED.append(True)
    module, operator, occurrence, line = job
    target = HAND_MUTANTS[operator][0] if operator in HAND_MUTANTS else module
    row = dict(module=target, operator=operator, occurrence=occurrence, line=line, source=source_hash(target))
    mutated = mutated_source(target, operator, occurrence)
    if mutated is None:
        return [dict(row, outcome="no mutation", wall_s=0.0)]
    base = baseline(target, HAND_TESTS if operator in HAND_MUTANTS else MODULES[target])
    if operator in HAND_MUTANTS:
        tests: list[str] | None = sorted(test for test, outcome in base["outcomes"].items() if outcome == "passed")
    else:
        tests = covering_tests(target, line, base)
    if tests is None:
        return [dict(row, outcome="not covered", tests=0, wall_s=0.0)]
    recorder = _Recorder(order=base["durations"], selected=set(tests))
    files = sorted({test.split("::")[0] for test in tests})
    path = WORK / target
    original = path.read_text()
    for cached in (path.parent / "__pycache__").glob(f"{path.stem}.*.pyc"):
        cached.unlink()
    path.write_text(mutated)
    try:
        timeout = _TIMEOUT_FACTOR * sum(base["durations"].get(test, 1.0) for test in tests) + _TIMEOUT_SLACK

        def run() -> int:
            status = _pytest_in_work_copy(["-x", *files], [recorder])
            failed = [test for test, outcome in recorder.outcomes.items() if outcome == "failed"]
            (WORK / "last_failure").write_text(failed[0] if failed else "")
            return status

        status, wall = _in_child(run, timeout)
    finally:
        path.write_text(original)
        for cached in (path.parent / "__pycache__").glob(f"{path.stem}.*.pyc"):
            cached.unlink()
    killed_by = (WORK / "last_failure").read_text() if (WORK / "last_failure").exists() else ""
    with contextlib.suppress(FileNotFoundError):
        (WORK / "last_failure").unlink()
    # pytest: 0 all passed, 1 a test failed, 2 interrupted (an import or collection error: the mutant breaks import)
    outcome = {None: "timeout", 0: "survived", 1: "killed", 2: "killed"}.get(status, f"error {status}")
    return [dict(row, outcome=outcome, killed_by=killed_by, tests=len(tests), wall_s=round(wall, 2))]


# ----- the report -----

_KILLED = ("killed", "timeout")


def _current_rows(rows: list[dict[str, Any]]) -> tuple[dict[str, dict[str, Any]], dict[str, int]]:
    """The rows of the sources as they are now, by mutant key (a later row replaces an earlier); stale rows per module."""
    current: dict[str, dict[str, Any]] = {}
    stale: dict[str, int] = {}
    for row in rows:
        if row["outcome"] == "no mutation":
            continue
        if row.get("source") != source_hash(row["module"]):
            stale[row["module"]] = stale.get(row["module"], 0) + 1
        else:
            current[mutant_key(row["module"], row["operator"], row["occurrence"])] = row
    return current, stale


def report(out: Path) -> None:
    """
    ``mutation.md``: mutants, killed, survived and score per module, and what each score is over (every mutant, the
    quick sample of every tenth, or a partial run); every survivor with its disposition.
    """
    path = out / "mutation.jsonl"
    meta, rows = suite.read_jsonl(path)
    metas = [json.loads(text) for text in path.read_text().splitlines() if text.strip() and '"kind": "meta"' in text]
    sessions = [m for m in metas if "wall_s" not in m]
    current, stale = _current_rows(rows)
    # A mutant whose source equals the module's (an operator the code gives nothing to change) is no mutant
    unchanged = {
        mutant_key(row["module"], row["operator"], row["occurrence"])
        for row in rows
        if row["outcome"] == "no mutation" and row.get("source") == source_hash(row["module"])
    }
    lines = reports.report_header(
        "Mutation testing of the modules that carry the promises",
        meta,
        [
            "Mutants: cosmic-ray's operators, each operator replaced by its natural counterpart (`benchmarks/mutation.py`,"
            " `OPERATORS`), none inside type annotations; each run against the tests that execute it (coverage of the"
            " mapped test files, `MODULES`), fastest first, up to the first failure.",
            "Score: killed (a test fails, the import fails, or the tests hang past 3x their baseline time + 60 s) over"
            " the mutants scored; a mutant no test executes counts as survived. Equivalent mutants (no behaviour"
            " changes) are listed with why and left out of the score.",
            "What a score is over: *full* when every mutant of the module has a row; else *quick* (every tenth mutant"
            " in the module's order, `--quick`) when that sample has run, rows outside it then listed but not scored;"
            " else *partial* (the rows there are, labelled so). Rows of a module whose source has changed since they ran"
            " are *stale*: never scored, run again by the next run.",
            "Sessions (one JSONL, rows of every size): "
            + "; ".join(f"`{m.get('command')}` at {m.get('commit')}" for m in sessions),
        ],
    )
    table = []
    for module in MODULES:
        every = [key for key in (mutant_key(*mutant[:3]) for mutant in module_mutants(module)) if key not in unchanged]
        sample = every[:: _STRIDES["quick"]]
        mine = {key: current[key] for key in every if key in current}
        if len(mine) == len(every):
            measured, keys = "full (every mutant)", every
        elif all(key in mine for key in sample):
            measured, keys = f"quick (every 10th: {len(sample)} of {len(every)})", sample
        elif mine:
            in_sample = sum(key in mine for key in sample)
            measured = f"**partial**: {len(mine)} of {len(every)} (quick sample: {in_sample} of {len(sample)})"
            keys = list(mine)
        else:
            measured, keys = "**not measured**", []
        scored = [mine[key] for key in keys if key in mine]
        killed = sum(row["outcome"] in _KILLED for row in scored)
        equivalent = sum(row_key(row) in EQUIVALENT and row["outcome"] not in _KILLED for row in scored)
        survived = len(scored) - killed - equivalent
        score = f"{100 * killed / (killed + survived):.1f} %" if killed + survived else "-"
        unscored = len(mine) - len(scored)
        table.append(
            [
                f"`{module}`",
                len(every),
                measured,
                len(scored),
                killed,
                survived,
                equivalent,
                score,
                unscored,
                stale.get(module, 0),
            ]
        )
    lines += ["## Score per module", ""]
    lines += reports.table(
        [
            "module",
            "mutants",
            "measured on",
            "scored",
            "killed",
            "survived",
            "equivalent",
            "score",
            "run, not scored",
            "stale rows",
        ],
        table,
    )
    # The latest row of each hand mutant (rows of the code as it is now before stale ones)
    latest = {row["operator"]: row for row in rows if row["operator"] in HAND_MUTANTS}
    latest.update({row["operator"]: row for row in current.values() if row["operator"] in HAND_MUTANTS})
    hand = [latest[operator] for operator in sorted(latest)]
    lines += ["", "## The four survivors of issue 41", ""]
    lines += reports.table(
        ["mutant", "outcome", "killed by", "source"],
        [
            [
                row["operator"],
                row["outcome"],
                f"`{row.get('killed_by') or '-'}`",
                "as now" if row.get("source") == source_hash(row["module"]) else "stale (changed since)",
            ]
            for row in hand
        ],
    )
    tool = [row for row in current.values() if row["operator"] not in HAND_MUTANTS]
    retested = [row for row in tool if row.get("first_outcome") not in (None, *_KILLED) and row["outcome"] in _KILLED]
    lines += ["", "## Survivors killed by new tests", ""]
    if not retested:
        lines.append("None so far.")
    for row in retested:
        change = diff(row["module"], row["operator"], row["occurrence"]).replace("\n", " / ")
        lines.append(f"- `{row_key(row)}` (line {row['line']}): `{change}`: killed by `{row.get('killed_by') or '-'}`")
    survivors = [row for row in tool if row["outcome"] not in _KILLED]
    lines += ["", "## Survivors", ""]
    if not survivors:
        lines.append("None so far.")
    for row in survivors:
        why = EQUIVALENT.get(row_key(row), "**open**: no test fails on it yet")
        change = diff(row["module"], row["operator"], row["occurrence"]).replace("\n", " / ")
        lines.append(f"- `{row_key(row)}` (line {row['line']}, {row['outcome']}): `{change}`: {why}")
    reports.write_report(out / "mutation.md", lines)


# ----- commands -----


def retest(modules: list[str], out: Path = reports.RESULTS) -> None:
    """
    Run the survivors (of ``modules``, or all; rows of the sources as they are now, not those listed as equivalent)
    again and rewrite their rows: after new tests.
    """
    path = out / "mutation.jsonl"
    texts = [text for text in path.read_text().splitlines() if text.strip()]
    rewritten = []
    for text in texts:
        row = json.loads(text)
        if (
            row.get("kind") == "run"
            and row["outcome"] not in (*_KILLED, "no mutation")
            and (not modules or row["module"] in modules)
            and row.get("source") == source_hash(row["module"])  # a stale row measured other code
            and row_key(row) not in EQUIVALENT
        ):
            module = row["module"] if row["operator"] not in HAND_MUTANTS else HAND_MUTANTS[row["operator"]][0]
            (new,) = run_job((module, row["operator"], row["occurrence"], row["line"]))
            print(f"[mutation retest] {row_key(row)}: {row['outcome']} -> {new['outcome']} {new.get('killed_by', '')}")
            row = dict(row, **new, retested_at=time.time(), first_outcome=row.get("first_outcome", row["outcome"]))
        rewritten.append(json.dumps(row))
    with tempfile.NamedTemporaryFile("w", dir=out, delete=False) as file:
        file.write("\n".join(rewritten) + "\n")
    os.replace(file.name, path)
    report(out)


def main(argv: list[str]) -> None:
    if argv[:1] == ["retest"]:
        retest(select_modules(argv[1:]) if argv[1:] else [])
    elif argv[:1] == ["show"]:
        module, operator, occurrence = argv[1].rsplit(":", 2)
        print(diff(module, operator, int(occurrence)))
    else:
        for module in MODULES:
            print(f"{module}: {len(module_mutants(module))} mutants")


if __name__ == "__main__":
    main(sys.argv[1:])
