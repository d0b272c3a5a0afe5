"""
The entry points of ``sb3-safe train`` and ``sb3-safe enjoy``: rl_zoo3's own ``train`` / ``enjoy`` run with sb3-safe's
algorithms registered, after the checks of their input, and for ``train`` followed by the run's report.
"""

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path

import rl_zoo3.train
from huggingface_sb3 import EnvironmentName
from rl_zoo3.enjoy import enjoy as zoo_enjoy

from sb3_safe.loading import secure_reading
from sb3_safe.zoo.checks import check_config_file, check_trained_agent
from sb3_safe.zoo.command import checked_options, rl_zoo3_command
from sb3_safe.zoo.config_errors import explained_config_errors
from sb3_safe.zoo.configuration import configuration_line
from sb3_safe.zoo.registration import PACKAGED_BY_DEFAULT, config_path
from sb3_safe.zoo.report import RunReport, report_run
from sb3_safe.zoo.run_folder import read_run_yaml, run_folder_reading, wrapper_modules
from sb3_safe.zoo.storage import check_trial, open_storage


def _run_folders(folder: str, algo: str, env_id: str) -> set[Path]:
    return {path for path in Path(folder, algo).glob(f"{EnvironmentName(env_id)}_*") if path.is_dir()}


@contextlib.contextmanager
def _no_empty_folders(folder: str, algo: str) -> Iterator[None]:
    """Remove the log folder and its algorithm folder if rl_zoo3 created them inside the block and left them empty."""
    # A run that fails before training leaves them empty (its run folder is removed); enjoy would look there
    created = [path for path in (Path(folder), Path(folder, algo)) if not path.exists()]
    try:
        yield
    finally:
        for path in reversed(created):
            with contextlib.suppress(OSError):  # not empty, or gone
                path.rmdir()


def train(zoo_args: Sequence[str], report: bool = True, trust: Sequence[str] = ()) -> RunReport | None:
    """
    Run rl_zoo3's trainer (``python -m rl_zoo3.train``) with sb3-safe's algorithms registered.

    Without ``--conf-file``, the algorithms with a packaged configuration (``kl_ppo``, ``safe_a2c``, ``ppo``, ``a2c``,
    ``ppo_lstm``) use it: ``zoo_configs/<algo>.yml``, rl-zoo's tuned values with the safe policies and the guard. The
    run's first line names the configuration file, its entry for the environment, and whether the guard is on.
    Bad input fails before training: the options, the configuration file and its entry for the environment, the
    optuna storage of ``-optimize`` and the trial of ``--trial-id``, the types of the hyperparameters, and whatever
    the callbacks, wrappers, environments and the model reject when rl_zoo3 builds them.

    :param zoo_args: ``rl_zoo3.train``'s command-line arguments
    :param report: after a training run (not ``-optimize``), write a learning-curve PNG next to the saved
        model and evaluate the model for ``--eval-episodes`` episodes
    :param trust: modules (or packages) of your own whose classes the model of ``-i`` may name
    :return: the report, or None without one
    :raises ZooUsageError: bad input, in one line; on standard output only the configuration line before it
    :raises TrainingInterrupted: for a Ctrl-C during training, after rl_zoo3 saved the model (no report)
    :raises RefusedFileError: for a model of ``-i`` (or its VecNormalize statistics, its replay buffer) whose pickles
        name or call more than SB3 files need: it is loaded as by :func:`sb3_safe.load`
    """
    options = checked_options("train", zoo_args)
    zoo_args = list(zoo_args)
    packaged = options.conf_file is None and options.algo in PACKAGED_BY_DEFAULT
    if packaged:
        options.conf_file = str(config_path(options.algo))
        zoo_args += ["--conf-file", options.conf_file]
    # Without one, the other stock algorithms read rl_zoo3's own files
    if options.conf_file is not None:
        check_config_file(options.conf_file, options.env)
    if options.trained_agent:
        check_trained_agent(options.trained_agent)
    if options.trial_id is not None:
        check_trial(options.storage, options.study_name, options.trial_id)
    elif options.optimize and options.storage is not None and not options.storage.endswith(".log"):
        # A database: its tables are created here, before rl_zoo3 opens it, and a bad URL fails in one line
        open_storage(options.storage)
    runs_before = _run_folders(options.folder, options.algo, options.env)
    print(configuration_line(options.algo, options.env, options.conf_file, packaged, options.hyperparams), flush=True)
    # -i: the model, its statistics and replay buffer are read as sb3_safe.load reads them
    reading = secure_reading(trust) if options.trained_agent else contextlib.nullcontext()
    # rl_zoo3's output (its dump of the hyperparameters) is shown once the setup succeeded
    with (
        _no_empty_folders(options.folder, options.algo),
        rl_zoo3_command("sb3-safe train", zoo_args, hold_output=True) as run,
        explained_config_errors(options.algo),
        reading,
    ):
        rl_zoo3.train.train()
    if run.interruption is not None:
        raise run.interruption
    if options.optimize or not report:
        return None
    env_name = EnvironmentName(options.env)
    new_runs = _run_folders(options.folder, options.algo, options.env) - runs_before
    trained = [run for run in new_runs if (run / f"{env_name}.zip").is_file()]
    if not trained:
        return None
    run_folder = max(trained, key=lambda run: run.stat().st_mtime)
    # The wrappers this training just built from its configuration are trusted by it
    config_file = run_folder / env_name / "config.yml"
    config = read_run_yaml(config_file, trust) if config_file.is_file() else None
    own_wrappers = wrapper_modules(config) if isinstance(config, dict) else ()
    return report_run(run_folder, options.algo, options.env, (*trust, *own_wrappers))


def enjoy(zoo_args: Sequence[str], trust: Sequence[str] = (), trust_folder: bool = False) -> None:
    """
    Run rl_zoo3's ``enjoy`` (``python -m rl_zoo3.enjoy``) with sb3-safe's algorithms registered. The run folder is
    read as data: its ``config.yml`` and ``args.yml`` as :mod:`sb3_safe.zoo.run_folder` reads them, checked before
    anything of the run is used; the model and its VecNormalize statistics as by :func:`sb3_safe.load`.

    :param zoo_args: ``rl_zoo3.enjoy``'s command-line arguments
    :param trust: modules (or packages) of your own whose classes the model and the run's wrappers may name
    :param trust_folder: the folder is your own: read and run it as rl_zoo3 does (YAML's unsafe loader, ``eval`` of
        ``normalize``, SB3's own ``load``)
    :raises ZooUsageError: bad options, no saved model where they point, or a run folder's file that would run code
        (:class:`~sb3_safe.zoo.run_folder.RunFolderError`), in one line
    :raises RefusedFileError: for a model (or statistics) whose pickles name or call more than SB3 files need
    """
    checked_options("enjoy", zoo_args)
    with contextlib.ExitStack() as stack:
        stack.enter_context(rl_zoo3_command("sb3-safe enjoy", zoo_args))
        if not trust_folder:
            stack.enter_context(secure_reading(trust))
            stack.enter_context(run_folder_reading(trust))
        zoo_enjoy()
