"""
:class:`ZooUsageError`, the one-line error of ``sb3-safe train`` / ``enjoy``, :class:`TrainingInterrupted`, and the
pieces their messages are made of (the close matches of a misspelled name, a multi-line message folded onto one line).
"""

import difflib
from collections.abc import Iterable
from pathlib import Path


class ZooUsageError(ValueError):
    """Bad input to ``sb3-safe train`` / ``enjoy``; the message is one line that names the problem."""


class TrainingInterrupted(KeyboardInterrupt):
    """
    A training run stopped by Ctrl-C (SIGINT), after rl_zoo3 saved the model; the message is one line.

    :param step: the timesteps trained
    :param total: the timesteps the run was to train
    :param model_path: the saved model
    """

    def __init__(self, step: int, total: int, model_path: Path) -> None:
        self.step, self.total, self.model_path = step, total, model_path
        super().__init__(f"interrupted at step {step} of {total}, model saved to {model_path}")


def one_line(text: str) -> str:
    """
    :param text: a message, possibly of several lines
    :return: its words on one line
    """
    return " ".join(text.split())


def close_matches(word: str, choices: Iterable[str]) -> list[str]:
    """
    :param word: a name as the user wrote it
    :param choices: the names that exist
    :return: up to three of them close to ``word``, the closest first
    """
    return difflib.get_close_matches(word, list(choices), n=3)


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """
    :param word: a name as the user wrote it
    :param choices: the names that exist
    :return: ``"; did you mean: a, b?"`` naming the close matches, or ``""`` if there are none
    """
    matches = close_matches(word, choices)
    return f"; did you mean: {', '.join(matches)}?" if matches else ""


def file_hint(path: Path) -> str:
    """
    :param path: a file that does not exist
    :return: ``"; did you mean: ...?"`` naming the files next to it with close names, or ``""``
    """
    siblings = [sibling.name for sibling in path.parent.iterdir()] if path.parent.is_dir() else []
    matches = close_matches(path.name, siblings)
    return f"; did you mean: {', '.join(str(path.parent / match) for match in matches)}?" if matches else ""
