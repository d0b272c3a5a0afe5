"""
Which configuration ``sb3-safe train`` trains with, and the line that says so before rl_zoo3 starts: the file, the
entry it takes for the environment, and whether the guard (and the adaptive learning rate) is on.
"""

from pathlib import Path
from typing import Any

import rl_zoo3
import yaml
from rl_zoo3.exp_manager import ExperimentManager

#: The class names a configuration's ``callback`` may give the guard and the adaptive learning rate under
_GUARD, _ADAPTIVE_LR = "NonFiniteGuardCallback", "KLAdaptiveLRCallback"


def rl_zoo3_config(algo: str) -> Path:
    """
    :param algo: a zoo algorithm name
    :return: the file rl_zoo3 reads for it without ``--conf-file`` (it may not exist)
    """
    return Path(rl_zoo3.__file__).parent / "hyperparams" / f"{algo}.yml"


def entry_for(config: dict[Any, Any], env_id: str) -> str | None:
    """
    :param config: a zoo configuration
    :param env_id: the environment id
    :return: the entry rl_zoo3 takes for the environment: its own, else ``atari`` (Atari ids) or ``default``; None
        if there is none
    """
    if env_id in config:
        return env_id
    fallback = "atari" if ExperimentManager.is_atari(env_id) else "default"
    return fallback if fallback in config else None


def _callback_settings(callback: Any) -> dict[str, dict[str, Any]]:
    """The callbacks a configuration's ``callback`` value names, by class name, with their keyword arguments."""
    items = callback if isinstance(callback, list) else [callback]
    settings: dict[str, dict[str, Any]] = {}
    for item in items:
        # rl_zoo3's forms: "module.Class", or {"module.Class": {keyword: value}}
        for path, kwargs in item.items() if isinstance(item, dict) else [(item, {})]:
            if isinstance(path, str) and path.startswith("sb3_safe."):
                settings[path.rpartition(".")[2]] = kwargs if isinstance(kwargs, dict) else {}
    return settings


def _safety(hyperparams: dict[str, Any]) -> str:
    """What the entry's hyperparameters turn on: the guard (and its mode), the adaptive learning rate."""
    callbacks = _callback_settings(hyperparams.get("callback", []))
    if _GUARD in callbacks:
        safety = f"guard on ({callbacks[_GUARD].get('on_nonfinite', 'raise')})"
    else:
        safety = f"guard off (add sb3_safe.{_GUARD} to the entry's callback)"
    if _ADAPTIVE_LR in callbacks or hyperparams.get("adaptive_lr") is not None:
        safety += ", adaptive learning rate on"
    return safety


def configuration_line(
    algo: str, env_id: str, conf_file: str | None, packaged: bool, hyperparams: dict[str, Any] | None
) -> str:
    """
    The first line of a ``train`` run: the configuration file, the entry taken for the environment, and whether
    the guard is on.

    :param algo: the zoo algorithm name
    :param env_id: the environment id
    :param conf_file: the ``--conf-file`` value (a packaged file added by sb3-safe included); None: rl_zoo3's own
    :param packaged: whether ``conf_file`` is the packaged configuration sb3-safe chose
    :param hyperparams: the ``--hyperparams`` values, which rl_zoo3 lays over the entry
    :return: the line, e.g. ``sb3-safe train: configuration .../zoo_configs/ppo.yml (packaged), entry 'CartPole-v1';
        guard on (rollback)``
    """
    path = Path(conf_file) if conf_file is not None else rl_zoo3_config(algo)
    origin = "packaged" if packaged else ("yours" if conf_file is not None else "rl_zoo3's")
    line = f"sb3-safe train: configuration {path} ({origin})"
    if path.suffix not in (".yml", ".yaml"):
        return f"{line}; guard: not read from a Python configuration"
    config = yaml.safe_load(path.read_text())
    entry = entry_for(config, env_id) if isinstance(config, dict) else None
    if entry is None:
        return line  # rl_zoo3 reports the missing entry itself
    if not isinstance(config[entry], dict):
        return line  # check_config_file reports it for a file of the user's
    line += f", entry {entry!r}"
    stock = rl_zoo3_config(algo)
    if packaged and entry != env_id and stock.is_file() and env_id in (yaml.safe_load(stock.read_text()) or {}):
        # The packaged files hold the common tasks; rl_zoo3 tunes more
        line += f" (rl_zoo3 tunes {env_id}, without the guard: --conf-file {stock})"
    return f"{line}; {_safety({**config[entry], **(hyperparams or {})})}"
