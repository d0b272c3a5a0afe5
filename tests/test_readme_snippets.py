"""
Every fenced code block of the README and of the documentation pages (``docs/**/*.md``) runs as written, so that a
snippet that fails for a reader fails CI. The blocks are found by :mod:`snippets`.

Python blocks run in this process, each in a fresh namespace and a temporary working directory; bash blocks run their
commands as subprocesses, in order, in one working directory per block. Only the budget differs from what the README
says, and only here, never in library code: :func:`apply_budget` caps the timesteps of every ``learn()`` and the
rollout / batch sizes of the SB3 constructors, in this process (monkeypatch) and in every Python process a command
starts (a ``sitecustomize`` module on ``PYTHONPATH``); the commands also get small ``-n`` / ``--n-trials`` /
``--eval-episodes`` values. A block marked ``% checked: WHAT`` (the documentation's install commands, and
commands another test runs) is checked as :data:`snippets.CHECKED` says instead of run.
"""

import functools
import inspect
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import gymnasium.envs.registration
import pytest
import tomllib
import torch as th
from packaging.requirements import Requirement
from snippets import CHECKED, CODE_DIRECTIVES, ROOT, Block, docs_blocks, docs_directives, readme_blocks
from stable_baselines3 import PPO
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.off_policy_algorithm import OffPolicyAlgorithm
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm

import sb3_safe
from sb3_safe.common.distributions import min_action_probability
from sb3_safe.doctor import diagnose

# The console scripts and the interpreter of the environment that runs the tests (.venv/bin)
BIN = Path(sys.executable).parent

#: the most timesteps any learn() of a snippet trains
MAX_TIMESTEPS = 64
#: caps of constructor arguments: a few small updates instead of rollouts of thousands of steps
CONSTRUCTOR_CAPS: dict[type[BaseAlgorithm], dict[str, int]] = {
    # PPO, A2C and their subclasses (KLAdaptivePPO, SafeA2C) pass n_steps on to OnPolicyAlgorithm
    OnPolicyAlgorithm: {"n_steps": 16},
    PPO: {"batch_size": 16, "n_epochs": 1},
    # SAC, TD3, DQN: gradient steps start within the budget
    OffPolicyAlgorithm: {"learning_starts": 16},
}
#: the commands' budget: -n for train and enjoy, episodes of sb3-safe's final evaluation and of rl_zoo3's trial evaluation
COMMAND_TIMESTEPS = str(MAX_TIMESTEPS)
EVAL_EPISODES = "1"
#: rl-zoo's Atari entries use 8 or 16 environments of a CNN policy; enough to check the command, 16 took 40 s here
ATARI_N_ENVS = 2
#: seconds after which a command of a block counts as hung
COMMAND_TIMEOUT = 600


# ----- the budget override -----


def _capped_init(init: Callable[..., None], caps: dict[str, int]) -> Callable[..., None]:
    signature = inspect.signature(init)

    @functools.wraps(init)
    def capped_init(*args: Any, **kwargs: Any) -> None:
        # Bound, so that positional, keyword and default values are all capped
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        for name, cap in caps.items():
            bound.arguments[name] = min(bound.arguments[name], cap)
        init(*bound.args, **bound.kwargs)

    return capped_init


def _capped_setup_learn(setup_learn: Callable[..., Any], max_timesteps: int) -> Callable[..., Any]:
    @functools.wraps(setup_learn)
    def capped_setup_learn(self: BaseAlgorithm, total_timesteps: int, *args: Any, **kwargs: Any) -> Any:
        return setup_learn(self, min(total_timesteps, max_timesteps), *args, **kwargs)

    return capped_setup_learn


def apply_budget(patch: Callable[[Any, str, Any], None], max_timesteps: int = MAX_TIMESTEPS) -> None:
    """
    Cap the budget of every SB3 algorithm, whatever the snippet asks for.

    :param patch: sets an attribute: ``monkeypatch.setattr`` in the tests, ``setattr`` in the commands' processes
    :param max_timesteps: the most timesteps a ``learn()`` trains
    """
    # Every algorithm's learn() (PPO, A2C, SAC ... and the subclasses) passes its total_timesteps through here
    patch(BaseAlgorithm, "_setup_learn", _capped_setup_learn(vars(BaseAlgorithm)["_setup_learn"], max_timesteps))
    for cls, caps in CONSTRUCTOR_CAPS.items():
        # Patched on the class that takes the argument, the subclasses' super().__init__() calls reach it too
        patch(cls, "__init__", _capped_init(vars(cls)["__init__"], caps))


# Imported at startup by every Python process of a command (train, the evaluation, SubprocVecEnv's workers)
SITECUSTOMIZE = f"""\
# Written by {Path(__file__).name}: the README commands' budget override
import sys

sys.path.insert(0, {str(Path(__file__).parent)!r})
from {Path(__file__).stem} import apply_budget

sys.path.pop(0)
apply_budget(setattr)
"""


# ----- the blocks -----


README_BLOCKS = readme_blocks()
DOCS_BLOCKS = docs_blocks()
BLOCKS = README_BLOCKS + DOCS_BLOCKS


def is_quickstart(block: Block) -> bool:
    """The first bash block under the README's Quickstart heading."""
    quickstart = [b for b in README_BLOCKS if b.language == "bash" and re.search(r"quick ?start", b.section, re.IGNORECASE)]
    return bool(quickstart) and block == quickstart[0]


def block_params(language: str) -> list[Any]:
    params = []
    for block in BLOCKS:
        if block.language != language or block.checked is not None:
            continue
        marks = []
        if is_quickstart(block):
            # CI runs this block itself (.ci/run; its second command is this very test suite, tests/test_readme.py
            # checks that): running it here would set up the environment and start the suite again from inside it
            marks.append(pytest.mark.skip(reason="CI runs the Quickstart block itself"))
        params.append(pytest.param(block, id=block.test_id, marks=marks))
    return params


def test_every_block_is_run() -> None:
    # A block in another language would be silently untested: teach this file to run it
    assert README_BLOCKS, "no fenced code block found in README.md"
    assert DOCS_BLOCKS, "no fenced code block found in docs/"
    others = [
        f"block {b.index} ({b.name} line {b.line}): ```{b.language}" for b in BLOCKS if b.language not in ("python", "bash")
    ]
    assert not others, f"only python and bash blocks are run: {others}"
    unknown = [f"{b.name} line {b.line}: % checked: {b.checked}" for b in BLOCKS if b.checked not in (None, *CHECKED)]
    assert not unknown, f"unknown markers (known: {sorted(CHECKED)}): {unknown}"
    in_readme = [f"README line {b.line}" for b in README_BLOCKS if b.checked is not None]
    assert not in_readme, f"the README's blocks all run (GitHub shows a % line as text): {in_readme}"


def test_docs_show_code_only_in_fences() -> None:
    # Code in a code-block or literalinclude directive, or inside eval-rst, would be shown but never run
    hidden = [
        f"{d.source.relative_to(ROOT)} line {d.line}: {{{d.name}}}"
        for d in docs_directives()
        if d.name in CODE_DIRECTIVES
        or (d.name == "eval-rst" and re.search(r"^\s*\.\. (code-block|code|sourcecode|literalinclude)::", d.content, re.M))
    ]
    assert not hidden, f"write these as plain ```python / ```bash fences, which the tests run: {hidden}"


# ----- python blocks -----


@pytest.fixture
def fresh_gym_registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """
    The environment registry of a fresh process: no Atari ids until the snippet imports ale_py itself. Another test
    of this process (rl_zoo3 imports ale_py) would otherwise hide a snippet that forgot to.
    """
    registry = gymnasium.envs.registration.registry
    fresh = {env_id: spec for env_id, spec in registry.items() if not str(spec.entry_point).startswith("ale_py")}
    for module in (gymnasium.envs.registration, gym, gym.envs):
        monkeypatch.setattr(module, "registry", fresh)
    # ale_py registers its ids when its package runs: the snippet's import runs it again (submodules stay loaded)
    ale_py = sys.modules.pop("ale_py", None)
    yield
    # As before: a package imported only by the snippet registered into the discarded registry, so a later import
    # of another test must run it again
    sys.modules.pop("ale_py", None)
    if ale_py is not None:
        sys.modules["ale_py"] = ale_py


@dataclass(frozen=True)
class Shows:
    """
    What a Python block shows (what it prints, what its comments claim), checked after it ran.

    :param source: the Markdown file, relative to the repository root
    :param code: a line of the block found in no other block of that file
    :param printed: exactly what it prints, where that is known
    :param check: called with what the block printed and its namespace; asserts what the block shows
    :param max_timesteps: the budget of its ``learn()`` calls, where what it shows needs more than the usual one
    """

    source: str
    code: str
    printed: str | None = None
    check: Callable[[str, dict[str, Any]], None] | None = None
    max_timesteps: int = MAX_TIMESTEPS

    def matches(self, block: Block) -> bool:
        return block.name == self.source and self.code in block.code

    def assert_shown(self, printed: str, namespace: dict[str, Any]) -> None:
        if self.printed is not None:
            assert printed == self.printed
        if self.check is not None:
            self.check(printed, namespace)


def _observations_in_raw_units(printed: str, namespace: dict[str, Any]) -> None:
    # "standard deviations ~1e8": the statistics are the observations' (x1e9), taken over the rollouts before the last
    std = namespace["model"].policy.observation_normalizer.obs_var.sqrt()
    assert ((std > 1e7) & (std < 1e10)).all(), std


def _doctor_healthy(printed: str, namespace: dict[str, Any]) -> None:
    # "sb3-safe doctor ppo_pendulum: checked without loading it"
    report = diagnose("ppo_pendulum")
    assert report.healthy and report.log_std_range is not None


def _adaptive_lr_moved(printed: str, namespace: dict[str, Any]) -> None:
    # "updates that move the policy too far are undone and redone at a lower rate, and the rate never goes above the
    # configured one" (0.1; the floor of a cut is 1e-5)
    learning_rate, redone, decisions = printed.split(" ", 2)
    callback = namespace["adaptive_lr"]
    assert float(learning_rate) == namespace["model"].policy.optimizer.param_groups[0]["lr"]
    assert 1e-5 <= float(learning_rate) <= 0.1 and int(redone) >= 1 and callback.history
    assert all(1e-5 <= rate <= 0.1 for _, rate in callback.history)
    assert int(redone) == callback.redone_updates and decisions.strip() == str(callback.decisions)


def _adaptive_lr_saved(printed: str, namespace: dict[str, Any]) -> None:
    # "saved with the model": the loaded model's settings are the trained one's
    assert printed == f"{namespace['model'].adaptive_lr}\n" and isinstance(namespace["model"].adaptive_lr, dict)


def _lambda_refused(printed: str, namespace: dict[str, Any]) -> None:
    # "refused, with the custom_objects that replace it", which then load the file
    assert "lambda.zip" in printed and 'custom_objects={"learning_rate": ' in printed, printed
    assert isinstance(namespace["model"], PPO) and namespace["model"].learning_rate == 3e-4


def _diagnosed(printed: str, namespace: dict[str, Any]) -> None:
    report = namespace["report"]
    assert report.healthy and printed == f"True {report.log_std_range}\n{report.format()}\n"
    assert report.log_std_range == (0.0, 0.0)  # a new policy's log-std, inside SafeMlpPolicy's range


def _all_finite(printed: str, namespace: dict[str, Any]) -> None:
    distribution, actions = namespace["distribution"], namespace["actions"]
    values = (distribution.log_prob(actions), distribution.entropy(), distribution.sample())
    assert all(bool(th.isfinite(value).all()) for value in values) and printed.count("tensor(") == 3
    assert "nan" not in printed and "inf" not in printed


def _stalled(printed: str, namespace: dict[str, Any]) -> None:
    expected = "Training stalled at timestep 160: every optimizer step of the last 10 updates "
    assert printed.startswith(expected), printed


def _minimum_kept(printed: str, namespace: dict[str, Any]) -> None:
    # "each of Pong's 6 actions keeps at least this probability": in the trained policy too
    minimum = min_action_probability(6, 10.0)
    assert printed.splitlines()[0] == str(minimum)
    model = namespace["model"]
    observation = th.as_tensor(model._last_obs, device=model.device)
    with th.no_grad():
        probabilities = model.policy.get_distribution(observation).distribution.probs
    assert probabilities.shape == (8, 6) and probabilities.min().item() >= minimum * (1 - 1e-4)


def _policy_refused(printed: str, namespace: dict[str, Any]) -> None:
    assert printed.startswith("SafeActorCriticPolicy serves PPO, ") and ", not SAC, " in printed, printed


def _stock_run_continued(printed: str, namespace: dict[str, Any]) -> None:
    # "SafeMlpPolicy, the weights and Adam state of the stock run"
    assert type(namespace["model"].policy) is sb3_safe.SafeMlpPolicy and namespace["model"].num_timesteps > 0


def _evaluated(printed: str, namespace: dict[str, Any]) -> None:
    assert re.fullmatch(r"mean return \d+\.\d \+- \d+\.\d\n", printed), printed


#: What the Python blocks show: every block that prints has an entry (test_every_printing_block_is_checked)
SHOWS = [
    Shows("README.md", 'model.save("ppo_pendulum")  # sb3-safe doctor', check=_doctor_healthy),
    Shows("docs/guide/adaptive_lr.md", "adaptive_lr.redone_updates, adaptive_lr.decisions", check=_adaptive_lr_moved),
    Shows("docs/guide/adaptive_lr.md", 'KLAdaptivePPO.load("kl_ppo_adaptive_lr").adaptive_lr', check=_adaptive_lr_saved),
    Shows("docs/guide/doctor.md", "except sb3_safe.RefusedFileError as error:", check=_lambda_refused),
    Shows("docs/guide/doctor.md", "print(report.healthy, report.log_std_range)", check=_diagnosed),
    Shows("docs/guide/guarantees.md", "# all finite", check=_all_finite),
    # a healthy run: no stop, no event
    Shows("docs/guide/guard.md", "print(guard.stop_reason, guard.events)", printed="None []\n"),
    Shows("docs/guide/guard.md", "print(guard.stop_reason)  # ", check=_stalled, max_timesteps=1_000),
    # 2,048 steps, under the patience of 10,000: the block shows the call, no warning can come yet
    Shows("docs/guide/guard.md", "if issubclass(w.category, ExplorationWarning)", printed="[]\n"),
    Shows("docs/guide/install.md", "CUDA available:", printed=f"{th.__version__} CUDA available: {th.cuda.is_available()}\n"),
    Shows("docs/guide/policies.md", "model.policy.log_std.max().item() <= 2.0", printed="True True\n"),
    Shows("docs/guide/policies.md", "print(min_action_probability(6, 10.0))", check=_minimum_kept),
    Shows(
        "docs/guide/policies.md",
        "observation_normalizer.obs_var.sqrt()",
        check=_observations_in_raw_units,
        max_timesteps=2_000,
    ),
    Shows("docs/guide/policies.md", "except PolicyAlgorithmMismatchError as error:", check=_policy_refused),
    Shows("docs/guide/kl_ppo.md", 'KLAdaptivePPO.load("stock_ppo", env=env)', check=_stock_run_continued),
    Shows("docs/guide/quickstart.md", 'print(f"mean return', check=_evaluated),
    Shows("docs/guide/safe_a2c.md", "print(model.skipped_updates)", printed="0\n"),
]


def shows_of(block: Block) -> Shows | None:
    return next((shows for shows in SHOWS if shows.matches(block)), None)


def test_every_printing_block_is_checked() -> None:
    """A block's output is part of what it shows the reader; each entry of SHOWS names exactly one block."""
    python = [block for block in BLOCKS if block.language == "python" and block.checked is None]
    for shows in SHOWS:
        assert sum(shows.matches(block) for block in python) == 1, f"{shows.source}: {shows.code!r} names no single block"
    unchecked = [f"{b.name} line {b.line}" for b in python if "print(" in b.code and shows_of(b) is None]
    assert not unchecked, f"say in SHOWS what these blocks show: {unchecked}"


@pytest.mark.parametrize("block", block_params("python"))
def test_python_block(
    block: Block,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    fresh_gym_registry: None,
    capsys: pytest.CaptureFixture,
) -> None:
    shows = shows_of(block)
    apply_budget(monkeypatch.setattr, MAX_TIMESTEPS if shows is None else shows.max_timesteps)
    # Files the snippet saves (model.save, the guard's save_path, MuJoCo's log) go to the temporary folder
    monkeypatch.chdir(tmp_path)
    # Padded to the fence's line: a traceback names the file's own line
    code = compile("\n" * block.line + block.code, str(block.source), "exec")
    namespace: dict[str, Any] = {"__name__": "__main__"}
    capsys.readouterr()
    exec(code, namespace)
    if shows is not None:
        shows.assert_shown(capsys.readouterr().out, namespace)


# ----- bash blocks -----


def _set_option(args: list[str], names: tuple[str, ...], value: str) -> list[str]:
    """The option's value replaced, or the option added with the value."""
    args = list(args)
    for i, arg in enumerate(args):
        if arg in names:
            args[i + 1] = value
            return args
    return [*args, names[0], value]


def _option(args: list[str], names: tuple[str, ...]) -> str | None:
    return next((args[i + 1] for i, arg in enumerate(args[:-1]) if arg in names), None)


def budget_command(line: str, trials_needed: int, log_folder: Path | None) -> list[str]:
    """
    A command line of a block as argv, run by this environment's executables with a small budget.

    :param line: the command as the README or the documentation shows it
    :param trials_needed: for ``-optimize``: the study needs as many trials as the block's ``--trial-id`` reads
    :param log_folder: where to write the runs instead of the block's log folder (None: as the block says)
    :return: the argv
    """
    program, *args = shlex.split(line, comments=True)
    executables = {"sb3-safe": str(BIN / "sb3-safe"), "python": sys.executable}
    assert program in executables, f"no runner for {program!r}: teach budget_command this program"
    if program == "sb3-safe" and args[:1] == ["doctor"]:
        return [executables[program], *args]  # reads a saved model: nothing to cap
    zoo_command = "enjoy" if "enjoy" in args or "rl_zoo3.enjoy" in args else "train"
    args = _set_option(args, ("-n", "--n-timesteps"), COMMAND_TIMESTEPS)
    if zoo_command == "train":
        args = _set_option(args, ("--eval-episodes",), EVAL_EPISODES)
        if "-optimize" in args or "--optimize-hyperparameters" in args:
            n_trials = int(_option(args, ("--n-trials",)) or trials_needed)
            args = _set_option(args, ("--n-trials",), str(min(n_trials, trials_needed)))
        env_id = _option(args, ("--env",)) or ""
        if "NoFrameskip" in env_id or env_id.startswith("ALE/"):
            # Added to the command's --hyperparams if it has some: a second option would replace the first
            flag = next((arg for arg in args if arg in ("--hyperparams", "-params")), None)
            position = args.index(flag) + 1 if flag else len(args)
            args[position:position] = [f"n_envs:{ATARI_N_ENVS}"] if flag else ["--hyperparams", f"n_envs:{ATARI_N_ENVS}"]
    if log_folder is not None:
        args = _set_option(args, ("-f", "--log-folder", "--folder"), str(log_folder))
    return [executables[program], *args]


@pytest.fixture(scope="module")
def command_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The commands' environment: the budget override, one torch thread, rendering without a display."""
    folder = tmp_path_factory.mktemp("budget")
    (folder / "sitecustomize.py").write_text(SITECUSTOMIZE, encoding="utf-8")
    python_path = os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))
    # One thread, as conftest.py sets in-process: threads fighting over 2 cores slow small networks several times
    return {**os.environ, "PYTHONPATH": python_path, "OMP_NUM_THREADS": "1", "SDL_VIDEODRIVER": "dummy"}


@pytest.mark.parametrize("block", block_params("bash"))
def test_bash_block(block: Block, tmp_path: Path, command_env: dict[str, str]) -> None:
    # A command the block runs from the repository root (a relative path into the checkout) runs there, writing
    # its runs into the temporary folder; the others run in the temporary folder, where their relative paths
    # (the log folder an enjoy line reads from the train line before it, a study's database) work as written
    from_root = "repository root" in block.lead or "repository root" in block.code
    cwd = ROOT if from_root else tmp_path
    trial_ids = [int(trial) for trial in re.findall(r"--trial-id[ =](\d+)", block.code)]
    trials_needed = max([1, *trial_ids]) + 1
    for line in block.lines:
        argv = budget_command(line, trials_needed, tmp_path / "logs" if from_root else None)
        result = subprocess.run(argv, cwd=cwd, env=command_env, capture_output=True, text=True, timeout=COMMAND_TIMEOUT)
        ran = f"{block.name} line {block.line}: {line}\nran: {shlex.join(argv)}\nin: {cwd}\n"
        assert result.returncode == 0, (
            f"{ran}exit status {result.returncode}\n{result.stdout[-2000:]}\n{result.stderr[-6000:]}"
        )
        assert "Traceback" not in result.stderr, f"{ran}{result.stderr[-6000:]}"


# ----- blocks checked instead of run -----


def _setup_torch_pin() -> str:
    """The torch version scripts/setup.sh installs."""
    pins = re.findall(r'"torch==([^"]+)"', (ROOT / "scripts" / "setup.sh").read_text(encoding="utf-8"))
    assert len(pins) == 1, f"scripts/setup.sh should pin torch once, found {pins}"
    return pins[0]


def _extras() -> set[str]:
    with open(ROOT / "pyproject.toml", "rb") as file:
        return set(tomllib.load(file)["project"]["optional-dependencies"])


#: the wheel ``pip wheel . -w dist --no-deps`` builds, as the documentation names it (with extras, if any)
WHEEL = re.compile(r"dist/sb3_safe-(?P<version>[^-]+)-py3-none-any\.whl(?:\[(?P<extras>[\w,-]+)\])?")


def _check_requirement(requirement: str) -> None:
    """
    A pip argument: sb3-safe (from PyPI, this checkout or the wheel built from it) with existing extras, or torch
    (unpinned, or at the set-up script's pin).
    """
    local = re.fullmatch(r"\.(?:\[(?P<extras>[\w,-]+)\])?", requirement) or WHEEL.fullmatch(requirement)
    if local is not None and "version" in local.groupdict():
        assert local.group("version") == sb3_safe.__version__, f"{requirement!r}: not the wheel of this version"
    if local is not None:
        extras = set(filter(None, (local.group("extras") or "").split(",")))
    else:
        parsed = Requirement(requirement)
        assert parsed.name in ("sb3-safe", "torch"), f"install only sb3-safe and torch: {requirement!r}"
        if parsed.name == "torch":
            # Unpinned (a fresh environment: the newest build of the index named) or at the set-up script's pin
            allowed = ("", f"=={_setup_torch_pin()}")
            assert str(parsed.specifier) in allowed, f"{requirement!r}: unpinned or scripts/setup.sh's pin"
        extras = set(parsed.extras)
    assert extras <= _extras(), f"{requirement!r}: no such extra in pyproject.toml ({sorted(extras - _extras())})"


def check_install_command(line: str) -> None:
    """An install command of the documentation: the forms the installation page uses, with valid arguments."""
    program, *args = shlex.split(line)
    if [program, *args] == ["python3", "-m", "venv", ".venv"]:
        return
    if program == "bash":
        assert args and (ROOT / args[0]).is_file() and len(args) == 1, f"not a script of this repository: {line}"
        return
    if program.endswith("python") or program.endswith("python3"):
        assert args[:2] == ["-m", "pip"], f"unknown install command: {line}"
        args = args[2:]
    else:
        assert program == "pip", f"unknown install command: {line}"
    if args[:1] == ["wheel"]:
        # The wheel of this checkout, into the folder the install line reads it from
        assert args == ["wheel", ".", "-w", "dist", "--no-deps"], f"{line}: build the wheel as the install page does"
        return
    assert args[:1] == ["install"], f"unknown pip command: {line}"
    args = args[1:]
    while args:
        arg = args.pop(0)
        if arg == "--index-url":
            url = args.pop(0)
            assert url.startswith("https://download.pytorch.org/whl/"), f"{line}: PyTorch's own index only, got {url}"
        elif arg == "-e":
            assert args and args[0].startswith("."), f"{line}: -e installs this checkout"
        else:
            assert not arg.startswith("-"), f"{line}: unknown pip option {arg}"
            _check_requirement(arg)


def test_readme_install_commands_are_valid() -> None:
    # The README shows its install commands indented (a fence would be run), and the wheel's in its text
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    indented = [line.strip() for line in text.splitlines() if re.match(r"^ {4}pip ", line)]
    inline = re.findall(r"`(pip (?:install|wheel) [^`]+)`", text)
    assert indented and inline, "the README's install commands went missing"
    for line in indented + inline:
        check_install_command(line)


@pytest.mark.parametrize("block", [pytest.param(b, id=b.test_id) for b in BLOCKS if b.checked is not None])
def test_checked_block(block: Block) -> None:
    lines = [line.strip() for line in block.lines]
    assert lines, f"{block.name} line {block.line}: empty block"
    if block.checked == "install":
        for line in lines:
            check_install_command(line)
    elif block.checked == "tests/test_readme.py and .ci/run run these":
        quickstart = next(b for b in README_BLOCKS if is_quickstart(b))
        assert lines == [line.strip() for line in quickstart.lines], "not the README's Quickstart commands"
    elif block.checked == "the README's Quickstart runs this":
        # The Quickstart's first command after its set-up, without the progress bar: CI runs that training already
        quickstart = next(b for b in README_BLOCKS if is_quickstart(b))
        train = quickstart.lines[0].strip().split(" && ", 1)[1].removeprefix(".venv/bin/").removesuffix(" -P")
        assert lines == [train], f"not the README's Quickstart training: {train}"
    elif block.checked == "tests/test_tuning_postgres.py runs these":
        # That test reads its commands from this very block: a -optimize worker and a --trial-id run
        assert len(lines) == 2 and all(line.startswith("sb3-safe train ") for line in lines), lines
        assert "-optimize" in lines[0].split() and "--trial-id" in lines[1].split(), lines
    else:
        pytest.fail(f"no check for '% checked: {block.checked}'")
