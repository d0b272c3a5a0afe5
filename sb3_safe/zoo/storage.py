"""
The optuna storage of ``-optimize`` and ``--trial-id``, opened as rl_zoo3 opens it (a journal file or a database URL,
possibly shared by several machines), and the trial ``--trial-id`` loads.
"""

import time
from pathlib import Path

import optuna
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from sqlalchemy import exc as sqlalchemy_exc
from sqlalchemy.engine import make_url

from sb3_safe.zoo.errors import ZooUsageError, did_you_mean, file_hint, one_line


def _storage_label(storage: str) -> str:
    # A database URL may hold a password: messages show it masked
    try:
        url = make_url(storage)
    except sqlalchemy_exc.ArgumentError:
        return storage  # a journal file, or no URL at all
    return storage if url.password is None else url.render_as_string(hide_password=True)


def open_storage(storage: str, attempts: int = 5) -> optuna.storages.BaseStorage:
    """
    Open an optuna storage as rl_zoo3 opens it: a journal file for a ``.log`` path, else a database URL
    (``sqlite:///study.db``, ``postgresql://user:password@host:5432/db``). A database gets optuna's tables if it has
    none yet.

    :param storage: the ``--storage`` value
    :param attempts: how often to try creating the tables of a database while other workers create them too
    :return: the storage
    :raises ZooUsageError: for a URL that is no database URL, a database driver that is not installed, or a database
        that cannot be opened (refused connection, unknown database or user ...); the URL's password is masked
    """
    if storage.endswith(".log"):
        return JournalStorage(JournalFileBackend(storage))
    label = _storage_label(storage)
    attempt = 1
    while True:
        try:
            return optuna.storages.RDBStorage(storage)
        except ImportError as error:
            # optuna's message does not name the missing module, its cause does
            driver = one_line(str(error.__cause__ or error))
            postgres = make_url(storage).drivername in ("postgresql", "postgresql+psycopg")
            extra = "; pip install 'sb3-safe[postgres]'" if postgres else ""
            raise ZooUsageError(f"--storage {label}: the database driver is not installed ({driver}){extra}") from error
        except sqlalchemy_exc.ArgumentError as error:
            raise ZooUsageError(f"--storage {label}: not a database URL ({one_line(str(error))})") from error
        except sqlalchemy_exc.DBAPIError as error:
            # Workers started together on an empty database all create its tables: all but one fail, once
            if isinstance(error, sqlalchemy_exc.IntegrityError | sqlalchemy_exc.ProgrammingError) and attempt < attempts:
                time.sleep(0.2 * attempt)
                attempt += 1
                continue
            reason = one_line(str(error.orig or error))
            raise ZooUsageError(f"--storage {label}: cannot open the database: {reason}") from error


def check_trial(storage: str | None, study_name: str | None, trial_id: int) -> None:
    """
    Check the trial that ``--trial-id`` loads from an optuna study, as rl_zoo3 opens the study.

    :param storage: the ``--storage`` value: an optuna storage URL, or a journal ``.log`` file
    :param study_name: the ``--study-name`` value
    :param trial_id: the ``--trial-id`` value: a trial's number in the study
    :raises ZooUsageError: without a storage or a study name, for a storage file or a study that does not exist,
        a storage that cannot be opened (see :func:`open_storage`), or for a trial number the study does not have
    """
    if storage is None or study_name is None:
        raise ZooUsageError("--trial-id needs --storage and --study-name, the optuna study to read the trial from")
    journal = storage.endswith(".log")
    file = storage if journal else storage.removeprefix("sqlite:///") if storage.startswith("sqlite:///") else None
    # Opening a missing file would create an empty storage; a server URL (postgresql://...) has no file
    if file is not None and not Path(file).is_file():
        raise ZooUsageError(f"--storage {storage}: no such file {file}{file_hint(Path(file))}")
    optuna_storage = open_storage(storage)
    names = optuna.get_all_study_names(optuna_storage)
    if study_name not in names:
        hint = did_you_mean(study_name, names) or f"; its studies: {', '.join(names) or 'none'}"
        raise ZooUsageError(f"--study-name {study_name!r}: no such study in {_storage_label(storage)}{hint}")
    n_trials = len(optuna.load_study(study_name=study_name, storage=optuna_storage).get_trials(deepcopy=False))
    if not 0 <= trial_id < n_trials:
        trials = f"{n_trials} trials, numbered 0 to {n_trials - 1}" if n_trials else "no trials"
        raise ZooUsageError(f"--trial-id {trial_id}: study {study_name!r} has {trials}")
