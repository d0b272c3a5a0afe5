"""
Checkpoints of stock SB3 algorithms loaded into sb3-safe's: ``KLAdaptivePPO.load("ppo.zip")`` continues a PPO run
with the safe policy of the same kind (``MlpPolicy``, ``CnnPolicy``, ``MultiInputPolicy``), as if it had been
built with it; its ``state_dict`` keys equal the stock policy's (the observation normalizer the safe policy's
``"auto"`` installs is removed for a state dict without one), so the weights and the optimizer state load as they are.

Which algorithm wrote a checkpoint is read from its ``data`` entry as JSON, the stored policy class from the
opcodes of its pickle: nothing of the file is unpickled here (SB3's ``load`` then does, as for any checkpoint).
"""

import base64
import io
import json
import pathlib
import zipfile
from typing import Any

from stable_baselines3.common.policies import BasePolicy
from stable_baselines3.common.save_util import open_path

#: The stock policies of SB3's on-policy algorithms, by the alias that names them and their safe counterparts
STOCK_POLICY_ALIASES = {
    "stable_baselines3.common.policies.ActorCriticPolicy": "MlpPolicy",
    "stable_baselines3.common.policies.ActorCriticCnnPolicy": "CnnPolicy",
    "stable_baselines3.common.policies.MultiInputActorCriticPolicy": "MultiInputPolicy",
}
#: Largest ``data`` entry read to decide (a model's is a few kB; beyond this, SB3's load decides alone)
_MAX_DATA_BYTES = 64 * 2**20


class _NameEverything:
    """Scan rules that accept every global: only the name the pickle holds is wanted."""

    def may_reference(self, found: Any) -> bool:
        return True

    def may_call(self, found: Any) -> bool:
        return True

    def may_pass(self, callee: Any, passed: Any) -> bool:
        return True

    def loads_bytes(self, found: Any) -> bool:
        return False

    def describe(self, found: Any) -> str | None:
        return None

    def may_initialize(self, found: Any) -> bool:
        return True


def read_checkpoint_data(path: str | pathlib.Path | io.BufferedIOBase) -> dict[str, Any] | None:
    """
    The ``data`` entry of a saved model as JSON (pickled items left as their base64 text), or None if it cannot
    be read: SB3's ``load`` then reports what is wrong. A file object is left where it was.

    :param path: what ``load`` is given: a path (``.zip`` may be left out, as for ``load``) or a binary file
    """
    try:
        file = open_path(path, "r", verbose=0, suffix="zip")
    except (OSError, TypeError, ValueError):
        return None
    position = file.tell()
    try:
        with zipfile.ZipFile(file) as archive:
            info = archive.getinfo("data")
            if info.file_size > _MAX_DATA_BYTES:
                return None
            data = json.loads(archive.read(info).decode())
    except Exception:  # not a zip, no data, damaged, not JSON: SB3's load reports it
        return None
    finally:
        if isinstance(path, str | pathlib.Path):
            file.close()
        else:
            file.seek(position)
    return data if isinstance(data, dict) else None


def stored_class_name(item: Any) -> str | None:
    """The ``module.Name`` of a class that a data item pickles by reference, read from its opcodes."""
    from sb3_safe.doctor.scan import scan_pickle  # the doctor package imports the policies: imported when needed

    if not isinstance(item, dict) or not isinstance(item.get(":serialized:"), str):
        return None
    try:
        pickle = base64.b64decode(item[":serialized:"].encode())
    except ValueError:
        return None
    scan = scan_pickle(pickle, "policy_class", _NameEverything())
    if scan.error is not None or scan.calls or len(scan.references) != 1:
        return None
    return str(scan.references[0])


def safe_policy_of_stock_checkpoint(
    path: str | pathlib.Path | io.BufferedIOBase,
    policy_aliases: dict[str, type[BasePolicy]],
    own_keys: tuple[str, ...],
) -> type[BasePolicy] | None:
    """
    The safe policy class a stock algorithm's checkpoint continues with, or None (a checkpoint of the safe
    algorithm itself, a policy without a safe counterpart, an unreadable file).

    :param path: the checkpoint
    :param policy_aliases: the safe algorithm's aliases (``"MlpPolicy"`` -> its safe policy)
    :param own_keys: attributes only the safe algorithm saves (a checkpoint with one of them is its own)
    """
    data = read_checkpoint_data(path)
    if data is None or any(key in data for key in own_keys):
        return None
    alias = STOCK_POLICY_ALIASES.get(stored_class_name(data.get("policy_class")) or "")
    return None if alias is None else policy_aliases.get(alias)


def continue_stock_checkpoint(
    path: str | pathlib.Path | io.BufferedIOBase,
    policy_aliases: dict[str, type[BasePolicy]],
    own_keys: tuple[str, ...],
    custom_objects: dict[str, Any] | None,
) -> dict[str, Any] | None:
    """
    The ``custom_objects`` for SB3's ``load`` that make a stock algorithm's checkpoint continue with the safe
    policy (:func:`safe_policy_of_stock_checkpoint`); the caller's own ``custom_objects`` take precedence.
    """
    policy_class = safe_policy_of_stock_checkpoint(path, policy_aliases, own_keys)
    if policy_class is None:
        return custom_objects
    return {"policy_class": policy_class, **(custom_objects or {})}


def with_settings_of_older_checkpoints(
    path: str | pathlib.Path | io.BufferedIOBase, settings: dict[str, Any], kwargs: dict[str, Any]
) -> dict[str, Any]:
    """
    ``load``'s ``kwargs`` with, for each setting in ``settings`` the checkpoint does not have (saved before the
    setting existed, or by a stock algorithm), the value that reproduces the saved model; the caller's ``kwargs``
    take precedence. An unreadable file: ``kwargs`` unchanged (SB3's ``load`` reports it).

    :param path: the checkpoint
    :param settings: attribute -> the value a checkpoint without it was trained with (e.g. ``normalize_value=False``)
    :param kwargs: the keyword arguments given to ``load``
    """
    data = read_checkpoint_data(path)
    if data is None:
        return kwargs
    return {**{key: value for key, value in settings.items() if key not in data}, **kwargs}
