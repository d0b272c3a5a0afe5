"""
Checks of what ``sb3-safe train`` / ``enjoy`` are given, before rl_zoo3 runs: the algorithm, the environment, the
configuration file and its entry for the environment, the model ``-i`` continues; and, when rl_zoo3's ``enjoy``
looks for it, the saved model it plays. Each fails in one line (:class:`~sb3_safe.zoo.ZooUsageError`).
"""

import contextlib
import difflib
import io
import os
from pathlib import Path

import gymnasium as gym
import yaml
from gymnasium.envs.registration import load_env_creator
from huggingface_sb3 import EnvironmentName
from huggingface_sb3.load_from_hub import strtobool
from rl_zoo3 import ALGOS
from rl_zoo3.exp_manager import ExperimentManager
from rl_zoo3.utils import get_model_path

from sb3_safe.zoo.errors import ZooUsageError, did_you_mean, file_hint, one_line
from sb3_safe.zoo.registration import ZOO_ALGOS

#: Entries of a zoo configuration that are not environment ids: rl_zoo3 uses "atari" for the Atari ids without an
#: entry, "default" for the other ids without one
SPECIAL_ENTRIES = ("atari", "default")
#: ``train``'s default log folder
LOG_FOLDER = "logs"
#: ``enjoy``'s default folder: rl_zoo3 downloads a model missing from a folder of this name from the Hugging Face hub
TRAINED_AGENTS = "rl-trained-agents"

# difflib ratio from which a configuration key that is no registered id counts as a typo of the requested id:
# one- and two-letter typos of ids score 0.88 and more, keys of other environments mostly less
_TYPO_CUTOFF = 0.85


def check_algo(algo: str) -> None:
    """
    :param algo: a zoo algorithm name
    :raises ZooUsageError: naming the close matches, if rl_zoo3 (with sb3-safe's algorithms) does not know it
    """
    if algo not in ALGOS:
        hint = did_you_mean(algo, ALGOS) or f"; choose from: {', '.join(ALGOS)}"
        raise ZooUsageError(f"unknown algorithm {algo!r}{hint}")


def check_env(env_id: str) -> None:
    """
    :param env_id: a gymnasium environment id
    :raises ZooUsageError: naming the close matches, if gymnasium's registry does not hold it; or the package to
        install, if its module needs one that is missing (Box2D, MuJoCo)
    """
    if env_id not in gym.registry:
        hint = did_you_mean(env_id, gym.registry) or "; no close match in gymnasium's registry"
        raise ZooUsageError(f"unknown environment id {env_id!r}{hint}")
    entry_point = gym.registry[env_id].entry_point
    if isinstance(entry_point, str):
        # Imported here, as gymnasium.make imports it: a missing dependency is bad input, not a crash of the run
        try:
            load_env_creator(entry_point)
        except (ImportError, gym.error.DependencyNotInstalled) as error:
            raise ZooUsageError(f"environment {env_id}: {one_line(str(error))}") from error


def _yaml_error(error: yaml.YAMLError) -> str:
    # PyYAML's message takes several lines, with the file name on each
    if not isinstance(error, yaml.MarkedYAMLError) or error.problem_mark is None:
        return f": {one_line(str(error))}"
    mark, context_mark = error.problem_mark, error.context_mark
    where = f" ({error.context} at line {context_mark.line + 1})" if error.context and context_mark else ""
    return f" at line {mark.line + 1}, column {mark.column + 1}: {one_line(f'{error.problem}{where}')}"


def check_config_file(path: str, env_id: str) -> None:
    """
    Check a zoo configuration before rl_zoo3 reads it: the file, its YAML, and the entry rl_zoo3 will take for
    the environment: the environment's own, else ``atari`` (Atari ids) or ``default``. rl_zoo3 falls back on
    those silently, so a key that is no registered id and close to the requested one is taken for a typo.

    :param path: the ``--conf-file`` value: a ``.yml`` / ``.yaml`` / ``.py`` file, or else a module name
    :param env_id: the environment id
    :raises ZooUsageError: a missing file, a directory, a YAML syntax error, no entry for the environment, or a
        key that looks like a typo of its id
    """
    file = Path(path)
    if file.is_dir():
        raise ZooUsageError(f"--conf-file {path}: is a directory; pass a .yml file")
    if file.suffix not in (".yml", ".yaml", ".py"):
        return  # rl_zoo3 imports it as a module
    if not file.is_file():
        raise ZooUsageError(f"--conf-file {path}: no such file{file_hint(file)}")
    if file.suffix == ".py":
        return
    try:
        config = yaml.safe_load(file.read_text())
    except yaml.YAMLError as error:
        raise ZooUsageError(f"--conf-file {path}: invalid YAML{_yaml_error(error)}") from error
    if not isinstance(config, dict):
        raise ZooUsageError(f"--conf-file {path}: expected environment ids mapped to hyperparameters")
    keys = [key for key in config if isinstance(key, str)]
    entry = env_id
    if env_id not in config:
        entry = "atari" if ExperimentManager.is_atari(env_id) else "default"
        unknown = [key for key in keys if key not in SPECIAL_ENTRIES and key not in gym.registry]
        typos = difflib.get_close_matches(env_id, unknown, n=3, cutoff=_TYPO_CUTOFF)
        if typos:
            instead = f"its {entry!r} entry" if entry in config else "no entry"
            raise ZooUsageError(
                f"{path} has no entry {env_id!r} but {', '.join(map(repr, typos))}, which is no registered "
                f"environment id: a typo of {env_id!r}? (rl_zoo3 would train with {instead})"
            )
        if entry not in config:
            hint = did_you_mean(env_id, keys) or f"; its entries: {', '.join(keys[:8])}{', ...' if len(keys) > 8 else ''}"
            raise ZooUsageError(f"{path} has no entry {env_id!r} and no {entry!r} entry{hint}")
    if not isinstance(config[entry], dict):
        raise ZooUsageError(f"{path}: the entry {entry!r} must map hyperparameter names to values, got {config[entry]!r}")


def check_trained_agent(path: str) -> None:
    """
    :param path: the ``-i`` value, the saved model to continue training
    :raises ZooUsageError: if it is not a ``.zip`` file
    """
    file = Path(path)
    if file.is_dir():
        raise ZooUsageError(f"-i {path}: is a directory; pass the model's .zip")
    if not file.is_file():
        raise ZooUsageError(f"-i {path}: no such file{file_hint(file)}")
    if file.suffix != ".zip":
        raise ZooUsageError(f"-i {path}: not a .zip; pass the model's .zip")


class MissingSavedModel(Exception):
    """
    No saved model where ``enjoy`` looks; the message is one line. Not a ``ValueError``: rl_zoo3's ``enjoy`` would
    take it for a model to download from the hub. :func:`~sb3_safe.zoo.command.rl_zoo3_command` raises it as
    :class:`~sb3_safe.zoo.ZooUsageError`.
    """


def _hub_download_allowed(algo: str) -> bool:
    # What rl_zoo3 does with a model missing from rl-trained-agents: the hub has sb3's stock models only, and
    # huggingface_sb3 refuses to download (they load with pickle) unless the user trusts them
    try:
        return algo not in ZOO_ALGOS and bool(strtobool(os.environ.get("TRUST_REMOTE_CODE", "False")))
    except ValueError:  # not a truth value: huggingface_sb3 would fail on it too
        return False


def find_saved_model(
    exp_id: int,
    folder: str,
    algo: str,
    env_name: EnvironmentName,
    load_best: bool = False,
    load_checkpoint: str | None = None,
    load_last_checkpoint: bool = False,
) -> tuple[str, str, str]:
    """
    rl_zoo3's ``get_model_path``, which its ``enjoy`` calls (after parsing its options) to find the saved model,
    with a missing model reported in one line. In its default folder, ``rl-trained-agents``, rl_zoo3 downloads a
    missing stock model from the Hugging Face hub: that is left to it only where the download can work
    (``TRUST_REMOTE_CODE`` set, as huggingface_sb3 requires).

    :param exp_id: the run number (0: the latest)
    :param folder: the folder holding the runs, ``<folder>/<algo>/<env>_<n>``
    :param algo: the zoo algorithm name
    :param env_name: the environment
    :param load_best: the run's best model instead of its last
    :param load_checkpoint: the checkpoint of this many timesteps instead of the last model
    :param load_last_checkpoint: the run's last checkpoint instead of its last model
    :return: rl_zoo3's name prefix, model path and run folder
    :raises MissingSavedModel: naming where it looked, the runs the folder holds, and for the default folder that
        ``train`` saves in ``logs``
    """
    output = io.StringIO()
    try:
        # It prints the run it picks: shown only when there is one, so that a missing model is one line
        with contextlib.redirect_stdout(output):
            found = get_model_path(exp_id, folder, algo, env_name, load_best, load_checkpoint, load_last_checkpoint)
    except (AssertionError, ValueError) as error:
        if TRAINED_AGENTS in folder and _hub_download_allowed(algo):
            print(output.getvalue(), end="")
            raise  # rl_zoo3 downloads it
        raise MissingSavedModel(f"{one_line(str(error))}{_runs_hint(folder, algo, env_name)}") from error
    print(output.getvalue(), end="")
    return found


def _runs_hint(folder: str, algo: str, env_name: EnvironmentName) -> str:
    # rl_zoo3 saves runs as <folder>/<algo>/<env>_<n>
    runs = {f"{run.parent.name}/{run.name.rpartition('_')[0]}" for run in Path(folder).glob("*/*_[0-9]*") if run.is_dir()}
    wanted = f"{algo}/{env_name}"
    if wanted in runs:
        hint = ""  # rl_zoo3's message names the run or the file that is missing
    elif runs:
        hint = did_you_mean(wanted, runs) or f"; runs there: {', '.join(sorted(runs))}"
    else:
        hint = f"; no runs in {folder}"
    if Path(folder) == Path(TRAINED_AGENTS):
        # Without -f, enjoy and train disagree: the user's own runs are elsewhere
        hint += f"; enjoy looks there without -f, and train saves in {LOG_FOLDER}: pass -f {LOG_FOLDER}"
        if algo not in ZOO_ALGOS:
            hint += " (or set TRUST_REMOTE_CODE=True to download sb3's pretrained model from the Hugging Face hub)"
    return hint
