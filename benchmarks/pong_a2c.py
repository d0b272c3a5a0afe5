"""
A2C on PongNoFrameskip-v4 with rl-zoo's Atari configuration: the longer run of the A2C benchmark.

rl-zoo's A2C reaches about +17 to +20 on Pong after 10M steps. The full run is for a machine with more compute;
``--max-minutes`` stops a partial run (the curve so far is still written).

Usage::

    # full run (rl-zoo budget), one per algorithm and seed
    python -m benchmarks.pong_a2c --algo SafeA2C --seed 0 --timesteps 10_000_000 --n-envs 16 --vec-env subproc
    # partial run, as done on a 2-core machine
    python -m benchmarks.pong_a2c --algo SafeA2C --seed 0 --max-minutes 10

Hyperparameters (rl_zoo3/hyperparams/a2c.yml, ``atari``): AtariWrapper, 4 stacked frames, CnnPolicy, 16 envs,
n_steps 5, gamma 0.99, gae_lambda 1, ent_coef 0.01, vf_coef 0.25, max_grad_norm 0.5, learning rate 7e-4
(constant), RMSpropTFLike(alpha=0.99, eps=1e-5), no advantage normalization. For SafeA2C the optimizer is
selected with ``use_rms_prop_tf_like=True``, for stock A2C through ``policy_kwargs`` as rl-zoo does: the same
optimizer either way.

Outputs in ``--out`` (default ``benchmarks/results/pong_a2c/<algo>_<seed>``): Monitor CSVs, checkpoints every
1M steps, ``final_model.zip``, ``curve.csv`` (timesteps, mean return of the last 100 training episodes) and
``summary.json``.
"""

import argparse
import json
import time
from pathlib import Path
from typing import Any

import ale_py
import gymnasium as gym
import numpy as np
import torch as th
from stable_baselines3 import A2C
from stable_baselines3.common.callbacks import BaseCallback, CallbackList, CheckpointCallback
from stable_baselines3.common.env_util import make_atari_env
from stable_baselines3.common.sb2_compat.rmsprop_tf_like import RMSpropTFLike
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecFrameStack

from benchmarks.reports import RESULTS
from benchmarks.training import params_finite, skipped_updates
from sb3_safe import SafeA2C

ENV_ID = "PongNoFrameskip-v4"
#: rl-zoo's A2C Atari hyperparameters (besides n_envs, frame stacking and the wrapper)
ZOO_ATARI = dict(ent_coef=0.01, vf_coef=0.25)


class PongProgress(BaseCallback):
    """
    Record the mean training return of the last 100 episodes every ``log_every`` steps, and stop after
    ``max_seconds`` of wall time.

    :param log_every: timesteps between two curve points
    :param max_seconds: wall-time limit of the run, None for none
    """

    def __init__(self, log_every: int, max_seconds: float | None):
        super().__init__()
        self.log_every = log_every
        self.max_seconds = max_seconds
        self.points: list[tuple[int, float, int]] = []
        self.returns: list[float] = []
        self.start = time.perf_counter()
        self._next_log = log_every

    def _on_step(self) -> bool:
        for info in self.locals["infos"]:
            if "episode" in info:
                self.returns.append(float(info["episode"]["r"]))
        if self.num_timesteps >= self._next_log:
            self._next_log += self.log_every
            mean = float(np.mean(self.returns[-100:])) if self.returns else float("nan")
            self.points.append((self.num_timesteps, mean, len(self.returns)))
            elapsed = time.perf_counter() - self.start
            print(
                f"{self.num_timesteps} steps, {elapsed:.0f}s, {len(self.returns)} episodes, mean return {mean:.2f}", flush=True
            )
        return self.max_seconds is None or time.perf_counter() - self.start < self.max_seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algo", choices=("SafeA2C", "A2C"), default="SafeA2C")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timesteps", type=int, default=10_000_000)
    parser.add_argument("--n-envs", type=int, default=16)
    parser.add_argument("--vec-env", choices=("dummy", "subproc"), default="dummy")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--max-minutes", type=float, default=None, help="stop the run after this wall time")
    parser.add_argument("--log-every", type=int, default=20_000, help="timesteps between curve points")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    th.set_num_threads(args.threads)
    gym.register_envs(ale_py)
    out = args.out or RESULTS / "pong_a2c" / f"{args.algo}_{args.seed}"
    out.mkdir(parents=True, exist_ok=True)

    vec_env_cls = SubprocVecEnv if args.vec_env == "subproc" else DummyVecEnv
    env = make_atari_env(ENV_ID, n_envs=args.n_envs, seed=args.seed, monitor_dir=str(out), vec_env_cls=vec_env_cls)
    env = VecFrameStack(env, n_stack=4)
    algo_kwargs: dict[str, Any] = dict(ZOO_ATARI, seed=args.seed, device=args.device, verbose=0)
    if args.algo == "SafeA2C":
        model: A2C = SafeA2C("CnnPolicy", env, use_rms_prop_tf_like=True, **algo_kwargs)
    else:
        policy_kwargs = dict(optimizer_class=RMSpropTFLike, optimizer_kwargs=dict(eps=1e-5))
        model = A2C("CnnPolicy", env, policy_kwargs=policy_kwargs, **algo_kwargs)

    progress = PongProgress(args.log_every, None if args.max_minutes is None else 60 * args.max_minutes)
    checkpoints = CheckpointCallback(max(1_000_000 // args.n_envs, 1), str(out / "checkpoints"), name_prefix=args.algo)
    start = time.perf_counter()
    model.learn(args.timesteps, callback=CallbackList([progress, checkpoints]))
    wall = time.perf_counter() - start
    model.save(out / "final_model.zip")
    env.close()

    with open(out / "curve.csv", "w") as curve:
        curve.write("timesteps,mean_return_last_100,episodes\n")
        curve.writelines(f"{steps},{mean},{episodes}\n" for steps, mean, episodes in progress.points)
    summary = dict(
        algo=args.algo,
        seed=args.seed,
        timesteps=model.num_timesteps,
        requested_timesteps=args.timesteps,
        n_envs=args.n_envs,
        wall_s=wall,
        fps=model.num_timesteps / wall,
        episodes=len(progress.returns),
        mean_return_last_100=float(np.mean(progress.returns[-100:])) if progress.returns else None,
        best_episode_return=max(progress.returns, default=None),
        params_finite=params_finite(model),
        skipped_updates=skipped_updates(model),
        device=str(model.device),
        torch_threads=args.threads,
    )
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
