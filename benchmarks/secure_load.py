"""
Load time of ``sb3_safe.load`` against SB3's ``load`` of the same file, in the same process.

Each model is saved once, then loaded ``repeats`` times by each loader, alternating (SB3 first, then sb3-safe, then
SB3 ...) so that both see the same machine state; a first load of each is not timed (imports, caches). The ratio is
the median of the paired ratios (each sb3-safe load over the SB3 load just before it), with its distribution-free
interval. The largest model the project writes is KLAdaptivePPO's CnnPolicy on Atari's 84x84x4 frames (1.7M
parameters, 6.4 MiB of weights and 12.9 MiB of Adam moments): the target is a ratio of at most 1.5 there. One job at a
time (timings), one torch thread. Sizes: full 30 loads each, quick 5, tiny 2 of the two small files.
"""

import io
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stable_baselines3.common.base_class import BaseAlgorithm

from benchmarks import reports, suite
from benchmarks.overhead import median_interval

SUITE = "secure_load"
#: The loading time's target, on the largest model
TARGET = 1.5
#: Timings: one load at a time
MAX_JOBS = 1
REPEATS = {"tiny": 2, "quick": 5, "full": 30}
LARGEST = "KLAdaptivePPO CnnPolicy, 84x84x4 frames"
STATISTICS = "VecNormalize statistics, Pendulum-v1"
#: What is loaded, the largest first
MODELS = (LARGEST, "PPO MlpPolicy, Pendulum-v1", "SAC MlpPolicy (256, 256), Pendulum-v1", STATISTICS)
#: (model, repeats)
Job = tuple[str, int]


def jobs(size: str) -> list[Job]:
    """Every model (tiny: the small PPO model and the statistics)."""
    models = (MODELS[1], STATISTICS) if size == "tiny" else MODELS
    return [(model, REPEATS[size]) for model in models]


def job_key(job: Job) -> str:
    """What identifies a job (a rerun with the same ``--out`` skips those written)."""
    return job[0]


def row_key(row: dict[str, Any]) -> str:
    """:func:`job_key` of the job that wrote ``row``."""
    return row["model"]


def _saved_model(name: str) -> tuple[type[BaseAlgorithm], bytes]:
    """The algorithm of the model ``name`` and its saved file's bytes (Adam's moments non-zero, as in a trained one)."""
    from stable_baselines3 import PPO, SAC
    from stable_baselines3.common.envs import FakeImageEnv

    import sb3_safe

    if name == LARGEST:
        env = FakeImageEnv(screen_height=84, screen_width=84, n_channels=4)
        model: Any = sb3_safe.KLAdaptivePPO("CnnPolicy", env, n_steps=8, batch_size=8, n_epochs=1).learn(8)
    elif name.startswith("PPO"):
        model = PPO("MlpPolicy", "Pendulum-v1", n_steps=64, batch_size=64).learn(64)
    else:
        model = SAC("MlpPolicy", "Pendulum-v1", learning_starts=8).learn(16)
    buffer = io.BytesIO()
    model.save(buffer)
    return type(model), buffer.getvalue()


def measure(loaders: dict[str, Callable[[], Any]], repeats: int) -> dict[str, list[float]]:
    """Seconds of each load, alternating the loaders, after one untimed load of each."""
    for load in loaders.values():
        load()
    seconds: dict[str, list[float]] = {name: [] for name in loaders}
    for _ in range(repeats):
        for name, load in loaders.items():
            start = time.perf_counter()
            load()
            seconds[name].append(time.perf_counter() - start)
    return seconds


def run_job(job: Job) -> list[dict[str, Any]]:
    """Time both loaders on one file; the medians and the paired ratio with its interval."""
    import gymnasium as gym
    import numpy as np
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    import sb3_safe

    name, repeats = job
    with tempfile.TemporaryDirectory(prefix="secure_load_") as folder:
        if name == STATISTICS:
            env = VecNormalize(DummyVecEnv([lambda: gym.make("Pendulum-v1")]))
            env.reset()
            for _ in range(100):
                env.step(np.array([env.action_space.sample()]))
            path = Path(folder) / "vecnormalize.pkl"
            env.save(str(path))
            venv = DummyVecEnv([lambda: gym.make("Pendulum-v1")])
            size = path.stat().st_size
            loaders: dict[str, Callable[[], Any]] = {
                "SB3": lambda: VecNormalize.load(str(path), venv),
                "sb3-safe": lambda: sb3_safe.load_vec_normalize(path, venv),
            }
        else:
            algorithm, raw = _saved_model(name)
            size = len(raw)
            loaders = {
                "SB3": lambda: algorithm.load(io.BytesIO(raw), device="cpu"),
                "sb3-safe": lambda: sb3_safe.load(algorithm, io.BytesIO(raw), device="cpu"),
            }
        seconds = measure(loaders, repeats)
    ratios = [ours / theirs for ours, theirs in zip(seconds["sb3-safe"], seconds["SB3"], strict=True)]
    low, high, coverage = median_interval(ratios)
    return [
        dict(
            model=name,
            repeats=repeats,
            file_mib=size / 2**20,
            sb3_ms=statistics.median(seconds["SB3"]) * 1e3,
            secure_ms=statistics.median(seconds["sb3-safe"]) * 1e3,
            ratio=statistics.median(ratios),
            ratio_low=low,
            ratio_high=high,
            coverage=coverage,
            sb3_s=seconds["SB3"],
            secure_s=seconds["sb3-safe"],
        )
    ]


def budget(size: str) -> dict[str, Any]:
    """The files and loads recorded in the JSONL meta row (a resumed run must have the same)."""
    return dict(repeats=REPEATS[size], models=[model for model, _ in jobs(size)])


def report(out: Path) -> None:
    """``secure_load.md``: the ratio on the largest model first, then the method, then every file."""
    meta, rows = suite.read_jsonl(out / f"{SUITE}.jsonl")
    rows.sort(key=lambda row: MODELS.index(row["model"]) if row["model"] in MODELS else len(MODELS))
    first = rows[0]
    repeats = meta.get("budget", {}).get("repeats", first["repeats"])
    figure = (
        f"**`sb3_safe.load` takes {first['ratio']:.2f}x SB3's load time on {first['model']}"
        f" ({first['file_mib']:.1f} MiB; target at most {TARGET} on the largest model the project writes)"
        + "".join(f"; {row['ratio']:.2f}x on {row['model']}" for row in rows[1:])
        + ".**"
    )
    lines = reports.report_header(
        "Secure loading: sb3_safe.load against SB3's load",
        meta,
        [
            f"Median milliseconds of {repeats} loads of the same file from memory by each, alternating; the median of"
            " the paired ratios (each sb3-safe load over the SB3 load before it), with its distribution-free interval"
            " (coverage in parentheses).",
        ],
        summary=figure,
    )
    lines += reports.table(
        ["model", "file", "SB3 load, ms", "sb3_safe.load, ms", "ratio"],
        [
            [
                row["model"],
                f"{row['file_mib']:.1f} MiB",
                f"{row['sb3_ms']:.1f}",
                f"{row['secure_ms']:.1f}",
                f"{row['ratio']:.2f} [{row['ratio_low']:.2f}, {row['ratio_high']:.2f}] ({row['coverage']:.0%})",
            ]
            for row in rows
        ],
    )
    reports.write_report(out / f"{SUITE}.md", lines)
