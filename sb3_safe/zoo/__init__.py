"""
sb3-safe in rl-baselines3-zoo: :class:`~sb3_safe.KLAdaptivePPO` and :class:`~sb3_safe.SafeA2C` as the zoo
algorithms ``kl_ppo`` and ``safe_a2c``, their optuna samplers, the packaged zoo-format configurations, and
rl_zoo3's own ``train`` / ``enjoy`` run with them registered.

Needs the ``zoo`` extra (rl_zoo3, optuna, matplotlib): ``pip install "sb3-safe[zoo]"``.

Modules: ``registration`` (algorithms, samplers, packaged configurations), ``checks`` (the input of ``train`` /
``enjoy``), ``config_errors`` (hyperparameter types, rl_zoo3's setup errors explained), ``storage`` (optuna storage
and trials), ``command`` (rl_zoo3 run as a checked command), ``run`` (the entry points), ``run_folder`` (a run
folder's ``config.yml`` / ``args.yml`` read as data), ``report`` (learning curve and evaluation), ``errors``
(:class:`ZooUsageError`, :class:`TrainingInterrupted`).
"""

from sb3_safe.zoo.checks import (
    SPECIAL_ENTRIES,
    check_algo,
    check_config_file,
    check_env,
    check_trained_agent,
)
from sb3_safe.zoo.config_errors import check_hyperparam_types, explain_config_error, explain_unexpected_keyword
from sb3_safe.zoo.errors import TrainingInterrupted, ZooUsageError
from sb3_safe.zoo.registration import (
    CONFIG_DIR,
    PACKAGED_BY_DEFAULT,
    ZOO_ALGOS,
    config_path,
    convert_safe_params,
    register,
    sample_kl_ppo_params,
    sample_safe_a2c_params,
)
from sb3_safe.zoo.report import (
    EVALUATIONS,
    LEARNING_CURVE,
    SMOOTHING_FRACTION,
    LearningCurve,
    RunReport,
    learning_curve_data,
    plot_learning_curve,
    report_run,
    smooth_over_timesteps,
)
from sb3_safe.zoo.run import enjoy, train
from sb3_safe.zoo.run_folder import RunFolderError
from sb3_safe.zoo.storage import check_trial, open_storage

__all__ = [
    "CONFIG_DIR",
    "EVALUATIONS",
    "LEARNING_CURVE",
    "PACKAGED_BY_DEFAULT",
    "SMOOTHING_FRACTION",
    "SPECIAL_ENTRIES",
    "ZOO_ALGOS",
    "LearningCurve",
    "RunFolderError",
    "RunReport",
    "TrainingInterrupted",
    "ZooUsageError",
    "check_algo",
    "check_config_file",
    "check_env",
    "check_hyperparam_types",
    "check_trained_agent",
    "check_trial",
    "config_path",
    "convert_safe_params",
    "enjoy",
    "explain_config_error",
    "explain_unexpected_keyword",
    "learning_curve_data",
    "open_storage",
    "plot_learning_curve",
    "register",
    "report_run",
    "sample_kl_ppo_params",
    "sample_safe_a2c_params",
    "smooth_over_timesteps",
    "train",
]
