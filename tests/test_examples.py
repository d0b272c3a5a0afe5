"""Each example runs to the end at its small budget (``--timesteps``) and writes what it announces."""

import os
import re
import runpy
import subprocess
import sys
import warnings
from pathlib import Path

from stable_baselines3 import A2C
from stable_baselines3.common.callbacks import BaseCallback

from sb3_safe import KLAdaptivePPO, NonFiniteGuardCallback, SafeA2C, SafeActorCriticPolicy, SafeMlpPolicy
from sb3_safe.common.exploration import ExplorationWarning

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run_example(name: str, output: Path, *args: str) -> list[str]:
    # In the output folder: MuJoCo writes its warnings to MUJOCO_LOG.TXT in the working directory
    command = [sys.executable, str(EXAMPLES / name), "--output", str(output), *args]
    # One torch thread, as conftest.py sets in-process: threads fighting over 2 cores slow small networks ~5x
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(command, capture_output=True, text=True, cwd=output, env=env)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    return result.stdout.splitlines()


def test_quickstart(tmp_path: Path) -> None:
    lines = run_example("quickstart.py", tmp_path, "--timesteps", "2000")
    assert lines[-3] == f"saved model: {tmp_path / 'ppo_safe_cartpole.zip'}"
    assert lines[-2] == f"saved learning curve: {tmp_path / 'learning_curve.png'}"
    assert lines[-1].startswith("evaluation over 10 episodes: mean return ")
    assert (tmp_path / "learning_curve.png").stat().st_size > 0


def test_rescue(tmp_path: Path) -> None:
    lines = run_example("rescue.py", tmp_path, "--timesteps", "1000")
    text = "\n".join(lines)
    # 1. stock A2C crashes as reported
    assert "stock A2C: ValueError: Expected parameter scale (Tensor of shape (1, 4)) of distribution Normal" in text
    # 2. the guard names the tensors and rolls back to its last full check (the start) with a halved learning rate,
    # with which training goes on to the end
    assert "policy.log_std: 4 NaN, 0 inf of 4" in text
    assert "guard: actions ['rollback'], learning rate now 1.5" in text
    assert "guard: training ran to the end" in text
    # 3. the safe policy trains to the end with its log-std inside the bounds
    prefix = "SafeMlpPolicy: trained 1000 steps, 0 guard events, log-std parameter in ["
    assert lines[-2].startswith(prefix) and lines[-2].endswith("] (bounds [-20, 2])")
    low, high = (float(value) for value in lines[-2][len(prefix) :].split("]")[0].split(", "))
    assert -20.0 <= low <= high <= 2.0
    # The exploration report is right about the run: at learning rate 3 the log-std bounces between the bounds, so
    # whether it sat at one for the patience depends on the seed and on the CPU's float kernels; the same run,
    # repeated here with a look at the log-std after every update, tells which
    observed, report = _rescue_safe_policy_observed(patience=200, timesteps=1000)
    assert lines[-2] == prefix + observed
    assert lines[-1] == f"guard: {report or 'no log-std sat at a bound for 200 environment steps'}"


class LogStdAtBounds(BaseCallback):
    """
    The longest runs of environment steps in which some log-std entry sat at each bound, looked at when the guard's
    exploration watch is documented to look: at the start, then at the first rollout end a twentieth of the patience
    after the last look, a run counted from the first look that found it.
    """

    def __init__(self, patience: int) -> None:
        super().__init__()
        self.every = patience // 20
        self.last_look = 0
        self.since: dict[str, int | None] = {"collapsed": None, "exploded": None}
        self.longest = {"collapsed": 0, "exploded": 0}

    def _on_training_start(self) -> None:
        self._look()

    def _on_rollout_end(self) -> None:
        if self.num_timesteps - self.last_look >= self.every:
            self._look()

    def _look(self) -> None:
        self.last_look = self.num_timesteps
        assert isinstance(self.model.policy, SafeActorCriticPolicy)
        low, high = self.model.policy.log_std_range
        log_std = self.model.policy.log_std.detach()
        at_bound = {"collapsed": bool((log_std <= low + 1e-3).any()), "exploded": bool((log_std >= high - 1e-3).any())}
        for what, at in at_bound.items():
            since = self.since[what] = (self.num_timesteps if self.since[what] is None else self.since[what]) if at else None
            if since is not None:
                self.longest[what] = max(self.longest[what], self.num_timesteps - since)

    def _on_step(self) -> bool:
        return True


def _rescue_safe_policy_observed(patience: int, timesteps: int) -> tuple[str, str | None]:
    """
    Run 3 of the rescue example, in this process (same seed, one thread: the same run): the log-std range line's end
    it prints, and the exploration report it must print: checked against the longest time at a bound observed.
    """
    example = runpy.run_path(str(EXAMPLES / "rescue.py"))
    model = A2C(SafeMlpPolicy, example["LargeActionRewardEnv"](), learning_rate=example["LEARNING_RATE"], seed=0)
    guard, observer = NonFiniteGuardCallback(on_nonfinite="rollback", collapse_patience=patience), LogStdAtBounds(patience)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ExplorationWarning)
        model.learn(timesteps, callback=[observer, guard])
    warned = [str(warning.message) for warning in caught if warning.category is ExplorationWarning]
    # one warning for each bound some entry sat at for the patience (the run's log-std has reached both bounds)
    for what, bound in (("collapsed", "-20 (std 2.06e-09)"), ("exploded", "2 (std 7.39)")):
        about = [message for message in warned if message.startswith(f"exploration {what} at log_std = {bound} in ")]
        assert len(about) == (observer.longest[what] >= patience), (what, observer.longest[what], warned)
    report = guard.exploration.message
    assert report == (warned[-1] if warned else None)
    log_std = model.policy.log_std.detach()
    return f"{log_std.min().item():.3g}, {log_std.max().item():.3g}] (bounds [-20, 2])", report


def _adapted_betas(beta: float, kl: float) -> set[float]:
    """
    The beta the example's rule (KL target 0.01, tolerance 1.5, factor 2) gives after an update of mean KL ``kl``,
    printed with 4 significant digits: both sides of a threshold where the printed KL is that close to it.
    """
    rounding = 1e-3 * kl  # more than half a unit of the 4th significant digit
    betas = set()
    for measured in (kl - rounding, kl, kl + rounding):
        # the paper's rule, written out here: the library's adapt_kl_beta is what this checks
        adapted = beta / 2 if measured < 0.01 / 1.5 else beta * 2 if measured > 0.01 * 1.5 else beta
        betas.add(min(max(adapted, 1e-4), 1e3))
    return betas


def test_hopper_kl_ppo(tmp_path: Path) -> None:
    lines = run_example("hopper_kl_ppo.py", tmp_path, "--timesteps", "1024", "--print-every", "1")
    assert lines[0] == "       0 steps: beta 1"
    # beta follows the paper's rule after each of the two updates, from the KL each update measured
    after_first = re.fullmatch(r"     512 steps: beta (\S+), mean KL of the last update (\S+)", lines[1])
    final = re.fullmatch(
        r"final beta (\S+) \(mean KL of the last update (\S+)\); skipped optimizer steps 0; rollbacks 0", lines[2]
    )
    assert after_first is not None and final is not None, lines[1:3]
    beta_1, kl_1, beta_2, kl_2 = (float(value) for value in (*after_first.groups(), *final.groups()))
    assert beta_1 in _adapted_betas(1.0, kl_1) and beta_2 in _adapted_betas(beta_1, kl_2)
    assert lines[-3] == f"saved model: {tmp_path / 'kl_ppo_hopper.zip'}"
    assert lines[-2] == f"saved VecNormalize statistics: {tmp_path / 'vecnormalize.pkl'}"
    assert lines[-1].startswith("evaluation over 5 episodes: mean return ")
    model = KLAdaptivePPO.load(tmp_path / "kl_ppo_hopper.zip", device="cpu")
    assert model.num_timesteps == 1024 and model.kl_beta == beta_2


def test_pong_safe_a2c(tmp_path: Path) -> None:
    lines = run_example("pong_safe_a2c.py", tmp_path, "--timesteps", "80", "--eval-episodes", "1")
    model_path = tmp_path / "safe_a2c" / "PongNoFrameskip-v4_1" / "PongNoFrameskip-v4.zip"
    assert lines[-3] == f"saved model: {model_path}"
    assert lines[-2] == "learning curve: none (no training episode finished)"
    # One whole game: it ends when a side has 21 points, so its score (points won minus lost) is a whole number
    # between 1 and 21 in size; a truncated game or a clipped or averaged return would not be
    evaluation = re.fullmatch(r"evaluation over 1 episodes \(stochastic\): mean return (-?\d+)\.0 \+/- 0\.0", lines[-1])
    assert evaluation is not None, lines[-1]
    assert 1 <= abs(int(evaluation.group(1))) <= 21
    model = SafeA2C.load(model_path, device="cpu")
    assert model.num_timesteps == 80 and model.n_envs == 16
