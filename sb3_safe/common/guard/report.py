"""
The report of each guard event: its message (what, where, the last healthy state, likely causes, what was done),
and where it goes: a :class:`NonFiniteGuardWarning`, a logger WARNING, a line of ``nonfinite_guard.jsonl`` and the
logger keys ``guard/events`` and ``guard/rollbacks``.
"""

import json
import os
import warnings
from dataclasses import dataclass
from typing import Any

from stable_baselines3.common.logger import WARN, HumanOutputFormat, Logger

from sb3_safe.common.guard.locate import ENVIRONMENT, MODEL, NORMALIZATION, ROLLOUT, STALL
from sb3_safe.common.numerics import NonFiniteTensor

REPORT_FILENAME = "nonfinite_guard.jsonl"
#: The non-finite tensors a message lists; the rest are counted
_SHOWN = 8

_CAUSES = {
    MODEL: (
        "Likely causes: a learning rate too high for the scale of the loss (lower `learning_rate`, or pass "
        "on_nonfinite='rollback', which lowers it on each failure); rewards of large magnitude (scale them or wrap "
        "the env in VecNormalize); an unbounded log-std (use a bounded policy such as sb3_safe's SafeMlpPolicy); "
        "no gradient clipping (set `max_grad_norm`)."
    ),
    NORMALIZATION: (
        "Likely causes: observations or rewards of extreme magnitude overflowed the VecNormalize running "
        "statistics. Check the scale of the environment's outputs, clip them before VecNormalize."
    ),
    ENVIRONMENT: (
        "The environment produced it: check its step() and reset() (division by zero, simulator blow-up, "
        "unbounded reward), and wrap it in VecCheckNan(raise_exception=True) to find the call. "
        "Environment data cannot be rolled back."
    ),
    ROLLOUT: (
        "The policy or value function produced it from finite parameters: a log-std so large that the std "
        "overflows (or so small that log-probs reach -inf), or a diverging value function. Bound the log-std "
        "(sb3_safe's SafeMlpPolicy), lower the learning rate, scale the rewards. "
        "Data already collected cannot be rolled back."
    ),
    STALL: (
        "Likely causes: rewards of a scale whose value loss overflows or swamps the gradient (scale them: wrap the env "
        "in VecNormalize(norm_reward=True), or divide the reward in a wrapper; KLAdaptivePPO and SafeA2C learn at any "
        "scale with normalize_value=True), observations of a scale that saturates the network's units, so that no "
        "gradient reaches the weights (normalize them: VecNormalize(norm_obs=True), or sb3_safe's safe policies with "
        "policy_kwargs=dict(normalize_observations='auto'), KLAdaptivePPO's default), a non-finite loss at every "
        "update "
        "from the data, a learning rate of 0 or too small to move float32 weights. A rollback cannot fix a stall: the "
        "next updates would read the same data."
    ),
}


class NonFiniteGuardWarning(RuntimeWarning):
    """
    Issued by :class:`~sb3_safe.common.callbacks.NonFiniteGuardCallback` for every stop and rollback (and before
    raising), with its message.
    """


@dataclass
class GuardEvent:
    """
    One detection of non-finite values by :class:`~sb3_safe.common.callbacks.NonFiniteGuardCallback`.

    :param timestep: ``model.num_timesteps`` when it was detected
    :param phase: when in the training loop, e.g. ``optimizer step of policy.optimizer in train()``
    :param source: ``"model"``, ``"normalization"``, ``"environment"`` or ``"rollout"``
    :param nonfinite: the non-finite tensors, most likely cause first
    :param healthy: statistics of the last healthy state (timestep, largest |param|, grad norm, log-std range)
    :param action: what the guard did: ``"raise"``, ``"stop"`` or ``"rollback"``
    :param message: the full explanation, as raised or logged
    :param measured: what was measured beyond the non-finite tensors (a stall's rollout statistics), or ""
    """

    timestep: int
    phase: str
    source: str
    nonfinite: list[NonFiniteTensor]
    healthy: dict[str, Any]
    action: str = ""
    message: str = ""
    measured: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The event as JSON-serializable data."""
        return {
            "timestep": self.timestep,
            "phase": self.phase,
            "source": self.source,
            "nonfinite": [vars(bad) for bad in self.nonfinite],
            "healthy": self.healthy,
            "action": self.action,
            "message": self.message,
            "measured": self.measured,
        }


def compose(event: GuardEvent, outcome: str) -> str:
    """
    The event's message.

    :param event: the event, its action decided
    :param outcome: what the guard did, as a sentence
    """
    shown = event.nonfinite[:_SHOWN]
    if event.source == STALL:
        lines = [f"Training stalled at timestep {event.timestep}: {event.phase}" + (":" if shown else ".")]
    else:
        lines = [f"Non-finite values at timestep {event.timestep} ({event.phase}):"]
    lines += [f"  {bad}" for bad in shown]
    if len(event.nonfinite) > len(shown):
        lines.append(f"  ... and {len(event.nonfinite) - len(shown)} more")
    if event.measured:
        lines.append(event.measured)
    lines.append(describe_statistics(event.healthy))
    lines.append(_CAUSES[event.source])
    lines.append(outcome)
    return "\n".join(lines)


def describe_statistics(stats: dict[str, Any]) -> str:
    """
    One sentence on the last healthy state.

    :param stats: :meth:`~sb3_safe.common.guard.snapshot.Snapshot.statistics`, or {} if there was no healthy state
    """
    if not stats:
        return "No healthy state was recorded before this."
    parts = []
    if "largest_abs_param" in stats:
        parts.append(f"largest |param| {stats['largest_abs_param']:.4g} ({stats['largest_abs_param_name']})")
    grad_norm = stats.get("grad_norm")
    parts.append("last grad norm " + (f"{grad_norm:.4g}" if grad_norm is not None else "unknown (no update yet)"))
    if "log_std_min" in stats:
        parts.append(f"log-std range [{stats['log_std_min']:.3g}, {stats['log_std_max']:.3g}]")
    return f"Last healthy state (timestep {stats['timestep']}): " + ", ".join(parts) + "."


def report_folder(report_dir: str | None, logger: Logger) -> str | None:
    """
    Where ``nonfinite_guard.jsonl`` goes: ``report_dir``, else the logger's folder if the logger writes files there
    (SB3's default logger has a temporary folder it writes nothing to; stdout is no folder); None: nowhere (the
    events are in the warnings, the logger and the callback's ``events``), as nothing was asked to be written.

    :param report_dir: the folder asked for, or None
    :param logger: the model's logger
    """
    writes_files = any(not isinstance(output, HumanOutputFormat) or output.own_file for output in logger.output_formats)
    return report_dir or (logger.get_dir() if writes_files else None)


def record_counts(logger: Logger, n_events: int, n_rollbacks: int) -> None:
    """
    Record ``guard/events`` and ``guard/rollbacks``.

    :param logger: the model's logger
    :param n_events: events so far
    :param n_rollbacks: rollbacks over the model's whole training
    """
    # At every rollout end: recorded again only when a dump cleared them or they changed
    values = logger.name_to_value
    if values.get("guard/events") != n_events or values.get("guard/rollbacks") != n_rollbacks:
        logger.record("guard/events", n_events)
        logger.record("guard/rollbacks", n_rollbacks)


def publish(event: GuardEvent, logger: Logger, report_dir: str | None) -> None:
    """
    Send an event's message to the logger (WARNING), to ``warnings`` and to the JSON-lines report.

    :param event: the event, with its message
    :param logger: the model's logger
    :param report_dir: the folder asked for (see :func:`report_folder`)
    """
    if event.action != "raise":  # raised, the exception carries the message: once
        # Never silent: a stop looks like a finished run, a rollback like a healthy one, whatever verbose is
        logger.log(event.message, level=WARN)
        # stacklevel 2: the warning points at the callback that handled the event, the caller
        warnings.warn(event.message, NonFiniteGuardWarning, stacklevel=2)
    folder = report_folder(report_dir, logger)
    if folder is None:
        return
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, REPORT_FILENAME), "a", encoding="utf-8") as file:
        file.write(json.dumps(event.to_dict()) + "\n")
