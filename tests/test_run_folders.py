"""
``sb3-safe enjoy`` reads an rl-zoo run folder as data: a ``config.yml`` or ``args.yml`` that would run code (a
``!!python/...`` tag, a ``normalize`` string that calls something, a wrapper of another package, an alias bomb) is
refused with one line on stderr and exit status 2, before anything of the run is used, and the payload never runs
(it would create a marker file; the real entry point also runs under an audit hook). Runs ``sb3-safe train`` wrote,
with and without VecNormalize, play as before; ``--trust-folder`` restores rl_zoo3's behaviour.
"""

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sb3_safe.cli import EXIT_USAGE, main
from sb3_safe.zoo.run_folder import MAX_YAML_NODES, RunFolderError, load_run_yaml, parse_literal, saved_hyperparams

SB3_SAFE = str(Path(sys.executable).parent / "sb3-safe")
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
TIMEOUT = 300
MARKER = "PWNED"
# Runs the command under an audit hook that records what a payload would do: start a process, or evaluate a string
AUDITED = """
import sys
import sb3_safe.cli, sb3_safe.zoo  # imported before the hook: imports execute their modules' code
EVENTS = {"os.system", "subprocess.Popen", "os.exec", "os.posix_spawn", "os.spawn", "os.fork"}
def hook(event, args):
    if event in EVENTS or (event == "exec" and getattr(args[0], "co_filename", "") == "<string>"):
        with open("AUDIT", "a") as log:
            log.write(event + "\\n")
sys.addaudithook(hook)
sys.exit(sb3_safe.cli.main(sys.argv[1:]))
"""
ENJOY = ["--no-render", "-n", "20", "--num-threads", "1"]
TOUCH = f"touch {MARKER}"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``sb3-safe train`` runs: kl_ppo on CartPole (no VecNormalize), a2c on Pendulum (``normalize: true``)."""
    folder = tmp_path_factory.mktemp("runs")
    common = ["--seed", "1", "--num-threads", "1", "-f", str(folder), "--no-report"]
    assert main(["train", "--algo", "kl_ppo", "--env", "CartPole-v1", "-n", "256", *common]) == 0
    assert main(["train", "--algo", "a2c", "--env", "Pendulum-v1", "-n", "192", *common]) == 0
    return {"kl_ppo": folder / "kl_ppo" / "CartPole-v1_1", "a2c": folder / "a2c" / "Pendulum-v1_1"}


def copy_run(run: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of a run in ``tmp_path/logs``; returns the log folder and the run's ``<env>`` folder."""
    logs = tmp_path / "logs"
    copy = logs / run.parent.name / run.name
    shutil.copytree(run, copy)
    return logs, copy / run.name.rpartition("_")[0]


def enjoy_args(run: Path, logs: Path) -> list[str]:
    env = run.name.rpartition("_")[0]
    return ["enjoy", "--algo", run.parent.name, "--env", env, "-f", str(logs), *ENJOY]


def assert_refused(capsys: pytest.CaptureFixture, status: int, *fragments: str) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert status == EXIT_USAGE, err[-3000:]
    assert len(lines) == 1, err[-3000:]
    assert lines[0].startswith("sb3-safe enjoy: error: "), lines[0]
    assert "refused" in lines[0] and "--trust-folder" in lines[0], lines[0]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def append_field(params: Path, file: str, field: str, value: str) -> None:
    """Add a field to rl-zoo's OrderedDict document as rl-zoo writes it (a [key, value] pair)."""
    with open(params / file, "a") as handle:
        handle.write(f"  - - {field}\n    - {value}\n")


# The two findings, through the installed entry point


@pytest.mark.parametrize("algo", ["kl_ppo", "a2c"])
def test_normalize_payload_is_refused_by_the_entry_point(algo: str, runs: dict[str, Path], tmp_path: Path) -> None:
    logs, params = copy_run(runs[algo], tmp_path)
    config = params / "config.yml"
    # rl-zoo-issue-505's payload: evaluated, it runs a command and still gives rl_zoo3 a valid dict
    text = config.read_text().replace("  - - normalize\n    - true\n", "")
    config.write_text(text)
    append_field(params, "config.yml", "normalize", f"\"__import__('os').system('{TOUCH}') or dict(norm_obs=False)\"")
    result = subprocess.run(
        [sys.executable, "-c", AUDITED, *enjoy_args(runs[algo], logs)],
        cwd=tmp_path,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == EXIT_USAGE, result.stderr[-3000:]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert f"{config}: normalize: refused: " in lines[0] and "a call of __import__('os').system" in lines[0], lines[0]
    assert not (tmp_path / MARKER).exists()
    assert not (tmp_path / "AUDIT").exists(), (tmp_path / "AUDIT").read_text()


@pytest.mark.parametrize("file", ["args.yml", "config.yml"])
def test_python_tag_is_refused_by_the_entry_point(file: str, runs: dict[str, Path], tmp_path: Path) -> None:
    logs, params = copy_run(runs["kl_ppo"], tmp_path)
    append_field(params, file, "payload", f"!!python/object/apply:os.system ['{TOUCH}']")
    result = subprocess.run(
        [SB3_SAFE, *enjoy_args(runs["kl_ppo"], logs)], cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=TIMEOUT
    )
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == EXIT_USAGE, result.stderr[-3000:]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert f"{params / file}: refused: " in lines[0] and "python/object/apply:os.system" in lines[0], lines[0]
    assert not (tmp_path / MARKER).exists()


def test_the_audit_hook_sees_a_payload_run_with_trust_folder(runs: dict[str, Path], tmp_path: Path) -> None:
    # The check of the tests above, shown to work: --trust-folder is rl_zoo3's behaviour, and the payload runs
    logs, params = copy_run(runs["a2c"], tmp_path)
    config = params / "config.yml"
    config.write_text(config.read_text().replace("  - - normalize\n    - true\n", ""))
    append_field(params, "config.yml", "normalize", f"\"__import__('os').system('{TOUCH}') or dict(norm_obs=True)\"")
    result = subprocess.run(
        [sys.executable, "-c", AUDITED, *enjoy_args(runs["a2c"], logs), "--trust-folder"],
        cwd=tmp_path,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / MARKER).exists()
    assert "os.system" in (tmp_path / "AUDIT").read_text()


# Runs sb3-safe train wrote play as before


@pytest.mark.parametrize("algo", ["kl_ppo", "a2c"])
@pytest.mark.parametrize("trust_folder", [False, True])
def test_own_runs_enjoy_unchanged(algo: str, trust_folder: bool, runs: dict[str, Path], capsys: pytest.CaptureFixture) -> None:
    logs = runs[algo].parent.parent
    capsys.readouterr()
    status = main([*enjoy_args(runs[algo], logs), *(["--trust-folder"] if trust_folder else [])])
    out, err = capsys.readouterr()
    assert status == 0, err[-3000:]
    assert f"Loading {runs[algo] / runs[algo].name.rpartition('_')[0]}.zip" in out
    # The a2c run normalizes: its statistics are loaded, with the saved configuration's arguments
    assert ("Loading running average" in out) == (algo == "a2c")


def test_saved_hyperparams_of_own_runs_match_rl_zoo3(runs: dict[str, Path]) -> None:
    from rl_zoo3.utils import get_saved_hyperparams

    for run in runs.values():
        params = str(run / run.name.rpartition("_")[0])
        for norm_reward in (False, True):
            assert saved_hyperparams(params, norm_reward, test_mode=True) == get_saved_hyperparams(
                params, norm_reward, test_mode=True
            )


def test_rl_zoo3_forms_of_normalize_are_read(runs: dict[str, Path], tmp_path: Path) -> None:
    # rl-zoo's configurations write normalize as a bool, a dict(...) string or a dict literal
    _, params = copy_run(runs["a2c"], tmp_path)
    base = (params / "config.yml").read_text().replace("  - - normalize\n    - true\n", "")
    for value, kwargs in [
        ('"dict(norm_obs=True, norm_reward=False, gamma=0.99)"', {"norm_obs": True, "norm_reward": False, "gamma": 0.99}),
        ("\"{'norm_obs': True, 'norm_reward': True}\"", {"norm_obs": True, "norm_reward": False}),
        ("{norm_obs: true, norm_reward: false}", {"norm_obs": True, "norm_reward": False}),
        ("true", {"norm_obs": True, "norm_reward": False}),
    ]:
        (params / "config.yml").write_text(base)
        append_field(params, "config.yml", "normalize", value)
        assert saved_hyperparams(str(params), test_mode=True)[0]["normalize_kwargs"] == kwargs


def test_classes_rl_zoo3_writes_from_hyperparams_are_read() -> None:
    # -params policy_kwargs:"dict(activation_fn=nn.ReLU)": rl_zoo3 evaluates it and writes the class, and tuples
    from torch import nn

    document = yaml.dump({"policy_kwargs": {"activation_fn": nn.ReLU, "net_arch": (64, 64)}})
    assert load_run_yaml(document, "config.yml") == {"policy_kwargs": {"activation_fn": nn.ReLU, "net_arch": (64, 64)}}


# Hostile documents, one by one through the CLI

HOSTILE_CONFIG_FIELDS: dict[str, tuple[str, str, str]] = {
    # name: (field, value as written in the YAML file, what the message names)
    "apply os.system": ("payload", f"!!python/object/apply:os.system ['{TOUCH}']", "python/object/apply:os.system"),
    "apply subprocess": (
        "payload",
        f"!!python/object/apply:subprocess.check_output [['sh', '-c', '{TOUCH}']]",
        "python/object/apply:subprocess.check_output",
    ),
    "new": ("payload", f"!!python/object/new:subprocess.Popen [['sh', '-c', '{TOUCH}']]", "python/object/new"),
    "object": ("payload", "!!python/object:argparse.Namespace {a: 1}", "python/object:argparse.Namespace"),
    "name": ("payload", "!!python/name:os.system ''", "os.system"),
    "module": ("payload", "!!python/module:os ''", "python/module:os"),
    "OrderedDict misused": (
        "payload",
        f"!!python/object/apply:collections.OrderedDict {{args: [], state: !!python/object/apply:os.system ['{TOUCH}']}}",
        "OrderedDict",
    ),
    "normalize call": ("normalize", f"\"exec('import os; os.system(\\\\'{TOUCH}\\\\')')\"", "a call of exec"),
    "normalize attribute": ("normalize", '"dict(norm_obs=os.path)"', "attribute access os.path"),
    "normalize lambda": ("normalize", '"(lambda: dict())()"', "a call of lambda"),
    "normalize comprehension": ("normalize", "\"{k: True for k in ['norm_obs']}\"", "a comprehension"),
    "normalize name": ("normalize", '"dict(norm_obs=True, gamma=GAMMA)"', "the name GAMMA"),
    "normalize star": ("normalize", '"dict(**globals())"', "normalize"),
    "normalize not a dict": ("normalize", '"[1, 2]"', "not a dict"),
    "normalize syntax": ("normalize", '"dict(norm_obs=True"', "not a Python expression"),
    "env_wrapper os": ("env_wrapper", "os.system", "os.system is not a class of gymnasium"),
    "env_wrapper kwargs": ("env_wrapper", "[{subprocess.Popen: {args: ['sh']}}]", "subprocess.Popen is not a class"),
    "env_wrapper function": ("env_wrapper", "rl_zoo3.utils.get_wrapper_class", "is not a gymnasium.core.Wrapper"),
    "vec_env_wrapper": ("vec_env_wrapper", "gymnasium.wrappers.TimeLimit", "is not a stable_baselines3"),
    "frame_stack": ("frame_stack", "'4; rm -rf'", "frame_stack"),
}


@pytest.mark.parametrize("name", HOSTILE_CONFIG_FIELDS)
def test_hostile_config_field_is_refused(
    name: str, runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    field, value, named = HOSTILE_CONFIG_FIELDS[name]
    logs, params = copy_run(runs["kl_ppo"], tmp_path)
    append_field(params, "config.yml", field, value)
    capsys.readouterr()
    assert_refused(capsys, main(enjoy_args(runs["kl_ppo"], logs)), str(params / "config.yml"), named)
    assert not (tmp_path / MARKER).exists()


def billion_laughs(levels: int, width: int) -> str:
    lines = ["a0: &a0 [lol]"]
    for level in range(1, levels):
        lines.append(f"a{level}: &a{level} [{', '.join([f'*a{level - 1}'] * width)}]")
    return "\n".join(lines) + "\n"


HOSTILE_DOCUMENTS: dict[str, tuple[str, str]] = {
    # name: (the whole file, what the message names)
    "billion laughs": (billion_laughs(10, 10), f"more than {MAX_YAML_NODES} values"),
    "wide laughs": (billion_laughs(3, 400), f"more than {MAX_YAML_NODES} values"),
    "recursive alias": ("a: &a [*a]\n", "an alias to the value it is part of"),
    "deep nesting": ("a: " + "[" * 200 + "]" * 200 + "\n", "nested"),
    "not a mapping": ("- 1\n- 2\n", "not a mapping"),
    "invalid": ("a: [\n", "invalid YAML"),
    "top-level apply": (f"!!python/object/apply:os.system ['{TOUCH}']\n", "python/object/apply:os.system"),
    "key apply": (f"? !!python/object/apply:os.system ['{TOUCH}']\n: 1\n", "python/object/apply:os.system"),
}


@pytest.mark.parametrize("file", ["config.yml", "args.yml"])
@pytest.mark.parametrize("name", HOSTILE_DOCUMENTS)
def test_hostile_document_is_refused(
    name: str,
    file: str,
    runs: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    document, named = HOSTILE_DOCUMENTS[name]
    logs, params = copy_run(runs["kl_ppo"], tmp_path)
    (params / file).write_text(document)
    capsys.readouterr()
    assert_refused(capsys, main(enjoy_args(runs["kl_ppo"], logs)), str(params / file), named)
    assert not (tmp_path / MARKER).exists()


def test_hostile_args_env_kwargs_is_refused(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    logs, params = copy_run(runs["kl_ppo"], tmp_path)
    args = params / "args.yml"
    args.write_text(args.read_text().replace("  - - env_kwargs\n    - null\n", "  - - env_kwargs\n    - 'render_mode'\n"))
    capsys.readouterr()
    assert_refused(capsys, main(enjoy_args(runs["kl_ppo"], logs)), f"{args}: env_kwargs: refused: a str, not a mapping")


# Generated hostile input, read directly (the same reader the CLI uses)

_TAGS = st.sampled_from(
    [
        "!!python/object/apply:{target}",
        "!!python/object/new:{target}",
        "!!python/object:{target}",
        "!!python/name:{target}",
        "!!python/module:{target}",
        "!<tag:yaml.org,2002:python/object/apply:{target}>",
    ]
)
_TARGETS = st.sampled_from(["os.system", "subprocess.Popen", "builtins.eval", "builtins.exec", "posix.system", "pty.spawn"])
_CODE_TEMPLATES = [
    "__import__('os').system('{cmd}')",
    "exec('{cmd}')",
    "eval('1')",
    "open('{cmd}', 'w')",
    "dict(norm_obs=__import__('os'))",
    "dict(norm_obs=(lambda: 1)())",
    "dict(norm_obs=[x for x in range(3)])",
    "dict(norm_obs=().__class__.__bases__)",
    "{{'norm_obs': globals()}}",
    "dict(norm_obs=True) if __import__('os') else {{}}",
    "dict(norm_obs=True, **{{}})",
    "getattr(dict, 'fromkeys')(['norm_obs'])",
]
_CODE = st.sampled_from(_CODE_TEMPLATES)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    tag=_TAGS,
    target=_TARGETS,
    argument=st.sampled_from(["[]", "['x']", "{args: ['x']}", "''", "[[a, b]]"]),
    depth=st.integers(0, 3),
)
def test_generated_python_tags_are_refused(tag: str, target: str, argument: str, depth: int) -> None:
    value = f"{tag.format(target=target)} {argument}"
    for _ in range(depth):
        value = f"{{key: [{value}]}}"
    with pytest.raises(RunFolderError, match=r"config\.yml: refused: (the tag !!python/|the name |an OrderedDict)"):
        load_run_yaml(f"payload: {value}\n", "config.yml")


@settings(max_examples=60, deadline=None)
@given(code=_CODE, padding=st.text(alphabet=" \t", max_size=3), cmd=st.text(alphabet="abc ;/", max_size=10))
def test_generated_normalize_code_is_refused(code: str, padding: str, cmd: str) -> None:
    with pytest.raises(ValueError, match=r"not a literal|not a Python expression"):
        parse_literal(padding + code.format(cmd=cmd) + padding)


@settings(max_examples=40, deadline=None)
@given(levels=st.integers(4, 12), width=st.integers(6, 30))
def test_generated_alias_bombs_are_refused_or_small(levels: int, width: int) -> None:
    document = billion_laughs(levels, width)
    expanded = sum(width**level for level in range(levels)) * 2
    read: Callable[[], object] = lambda: load_run_yaml(document, "config.yml")  # noqa: E731
    if expanded > 2 * MAX_YAML_NODES:
        with pytest.raises(RunFolderError, match="values with its aliases expanded"):
            read()
    elif expanded < MAX_YAML_NODES // 2:
        assert isinstance(read(), dict)


# Generated hostile documents with real payloads, through the CLI

PAYLOADS = [
    f"!!python/object/apply:os.system ['{TOUCH}']",
    f"!!python/object/apply:subprocess.call [['sh', '-c', '{TOUCH}']]",
    f"!!python/object/new:tuple [[!!python/object/apply:os.system ['{TOUCH}']]]",
    f"!!python/object/apply:builtins.exec ['import os; os.system(\"{TOUCH}\")']",
    f'!!python/object/apply:builtins.eval [\'__import__("os").system("{TOUCH}")\']',
]


@pytest.mark.parametrize("payload", PAYLOADS)
def test_the_payloads_run_under_yaml_unsafe_loader(payload: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # What the generated documents below would do in rl_zoo3: the marker proves a payload ran
    monkeypatch.chdir(tmp_path)
    yaml.load(f"payload: {payload}\n", Loader=yaml.UnsafeLoader)
    assert (tmp_path / MARKER).exists()


def _placed(payload: str, place: str) -> str:
    # The payload as a field of rl-zoo's OrderedDict, nested in a value, or as a mapping key
    if place == "field":
        return f"  - - payload\n    - {payload}\n"
    if place == "nested":
        return f"  - - env_kwargs\n    - {{a: [1, {{b: {payload}}}]}}\n"
    return f"  - - env_kwargs\n    - {{? {payload} : 1}}\n"


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    payload=st.sampled_from(PAYLOADS),
    place=st.sampled_from(["field", "nested", "key"]),
    file=st.sampled_from(["config.yml", "args.yml"]),
    normalize=st.sampled_from([None, *[code.format(cmd=TOUCH) for code in _CODE_TEMPLATES]]),
)
def test_generated_hostile_run_folders_are_refused_by_enjoy(
    payload: str,
    place: str,
    file: str,
    normalize: str | None,
    runs: dict[str, Path],
    tmp_path_factory: pytest.TempPathFactory,
    capsys: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tmp_path = tmp_path_factory.mktemp("hostile")
    monkeypatch.chdir(tmp_path)
    logs, params = copy_run(runs["kl_ppo"], tmp_path)
    if normalize is None:
        with open(params / file, "a") as handle:
            handle.write(_placed(payload, place))
    else:
        # A JSON string is a YAML double-quoted scalar
        append_field(params, "config.yml", "normalize", json.dumps(normalize))
    capsys.readouterr()
    named = f"{params / file}: refused: the tag !!python/" if normalize is None else "config.yml: normalize: refused: "
    assert_refused(capsys, main(enjoy_args(runs["kl_ppo"], logs)), named)
    assert not (tmp_path / MARKER).exists()


def test_wrappers_of_your_own_need_trust(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A configuration naming a wrapper of the user's own module: train builds it and reports; enjoy asks for --trust
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "my_wrappers.py").write_text("import gymnasium as gym\n\n\nclass Same(gym.Wrapper):\n    pass\n")
    (tmp_path / "conf.yml").write_text(
        "CartPole-v1:\n  n_timesteps: 64\n  policy: MlpPolicy\n  n_steps: 32\n  batch_size: 32\n"
        "  env_wrapper: my_wrappers.Same\n"
    )
    train = ["train", "--algo", "ppo", "--env", "CartPole-v1", "-conf", "conf.yml", "--eval-episodes", "1"]
    assert main([*train, "--seed", "1", "--num-threads", "1"]) == 0
    assert "evaluation over 1 episodes" in capsys.readouterr().out
    run = tmp_path / "logs" / "ppo" / "CartPole-v1_1"
    args = enjoy_args(run, tmp_path / "logs")
    assert_refused(capsys, main(args), "env_wrapper: refused: my_wrappers.Same is not a class of gymnasium")
    assert main([*args, "--trust", "my_wrappers"]) == 0
