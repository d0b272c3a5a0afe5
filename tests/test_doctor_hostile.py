"""
``sb3-safe doctor`` on files it must not trust, built from a real saved model: pickles that run code when loaded
(in ``data``, in ``policy.pth``, in ``pytorch_variables.pth``, hidden behind the memo, computed names, attribute
paths, SB3's own classes), malformed entries, decompression bombs, truncated and foreign files. Nothing runs (the
payloads' canary file is never created; the same payloads do create it when loaded), no traceback, exit 1 naming
the global for code, exit 2 with one line for what cannot be read, bounded memory for the bombs.
"""

import contextlib
import io
import json
import os
import pickle
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cloudpickle
import gymnasium as gym
import numpy as np
import pytest
import torch as th
from stable_baselines3 import PPO, SAC
from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize
from zip_builders import (
    BUILD,
    EMPTY_DICT,
    EXT1,
    MEMOIZE,
    NONE,
    POP,
    PROTO_2,
    PROTO_4,
    REDUCE,
    SETITEM,
    STACK_GLOBAL,
    STOP,
    TUPLE1,
    TUPLE2,
    Reduce,
    binget,
    binint1,
    duplicate_entry,
    global_opcode,
    model_with_policy,
    rewrite_zip,
    serialized,
    shell_command,
    torch_bytes,
    torch_zip_of_zeros,
    touch_code,
    unicode,
)

from sb3_safe.cli import main
from sb3_safe.doctor import EXIT_HEALTHY, EXIT_UNHEALTHY, EXIT_UNREADABLE, SizeLimits, diagnose, run_doctor
from sb3_safe.doctor.allowlist import Allowlist
from sb3_safe.doctor.budget import ReadingBudget
from sb3_safe.doctor.pickles import PickleReport, scan_torch_entry

SYSTEM = f"{os.system.__module__}.system"  # posix.system: the name pickle stores for os.system


@pytest.fixture(scope="module")
def model_zip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model = PPO("MlpPolicy", "Pendulum-v1", n_steps=16, batch_size=16, n_epochs=1, policy_kwargs=dict(net_arch=[8]))
    model.learn(16)
    path = tmp_path_factory.mktemp("hostile") / "model.zip"
    model.save(path)
    return path


def _payload(kind: str, canary: Path) -> Reduce:
    """A pickled object that creates ``canary`` when loaded."""
    command = [sys.executable, "-c", touch_code(canary)]
    return {
        "os.system": lambda: Reduce(os.system, shell_command(canary)),
        "subprocess.Popen": lambda: Reduce(subprocess.Popen, command),
        "subprocess.check_call": lambda: Reduce(subprocess.check_call, command),
        "builtins.eval": lambda: Reduce(eval, touch_code(canary)),
    }[kind]()


PAYLOAD_GLOBALS = {
    "os.system": SYSTEM,
    "subprocess.Popen": "subprocess.Popen",
    "subprocess.check_call": "subprocess.check_call",
    "builtins.eval": "builtins.eval",
}
#: Where a booby trap goes, and how doctor names that place
PLACES = {
    "data": 'data["lr_schedule"]',
    "policy.pth": "policy.pth",
    "pytorch_variables.pth": "pytorch_variables.pth (legacy format, pickle 4)",
}


def _booby_trap(model_zip: Path, target: Path, place: str, payload: Reduce) -> Path:
    if place == "data":
        return rewrite_zip(model_zip, target, data=lambda data: data | {"lr_schedule": serialized(pickle.dumps(payload))})
    if place == "policy.pth":
        # The real weights, and one more entry
        with zipfile.ZipFile(model_zip) as archive:
            state_dict = th.load(archive.open("policy.pth"), weights_only=True)
        return rewrite_zip(model_zip, target, replace={"policy.pth": torch_bytes(state_dict | {"extra": payload})})
    # torch's legacy format, which torch.load also reads
    return rewrite_zip(model_zip, target, replace={"pytorch_variables.pth": torch_bytes({"x": payload}, legacy=True)})


#: Audit events by which a payload would start to run: a process, a shell command, code compiled, a file opened
_RUN_EVENTS = frozenset({"subprocess.Popen", "os.system", "os.posix_spawn", "os.exec", "os.spawn", "compile", "open"})
#: For each canary watched: the audit events of this process that named it since
_SEEN: dict[str, list[str]] = {}


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if _SEEN and event in _RUN_EVENTS:
        text = repr(args)
        for canary, seen in _SEEN.items():
            if canary in text:
                seen.append(f"{event}{text}")


sys.addaudithook(_audit)  # (for good: audit hooks cannot be removed; it does nothing while no canary is watched)


def _watched(canary: Path) -> Path:
    """Start recording the audit events that name ``canary``: every payload names it, and raises one when it runs."""
    _SEEN[str(canary)] = []
    return canary


def _ran(canary: Path) -> list[str]:
    """Stop watching ``canary``: the audit events that named it."""
    return _SEEN.pop(str(canary))


def _assert_never_created(canary: Path) -> None:
    """
    No payload ran since ``_watched(canary)``: deterministic, with no wait for a child process that might still create
    the canary, since starting one (``subprocess.Popen``, ``os.system``) raises its audit event in this process first.
    """
    assert _ran(canary) == []
    assert not canary.exists()


def _doctor(path: Path, capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    status = main(["doctor", *args, str(path)])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err
    return status, captured.out, captured.err


@pytest.mark.parametrize("place", PLACES)
@pytest.mark.parametrize("kind", PAYLOAD_GLOBALS)
def test_code_running_pickles_are_named_and_nothing_runs(
    kind: str, place: str, model_zip: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    canary = _watched(tmp_path / "canary")
    path = _booby_trap(model_zip, tmp_path / "trap.zip", place, _payload(kind, canary))
    status, out, err = _doctor(path, capsys)
    assert status == EXIT_UNHEALTHY and err == ""
    assert f"  {PLACES[place]}: loading this file would run code from {PAYLOAD_GLOBALS[kind]} (the pickle calls it" in out
    assert "UNSAFE" in out and "Healthy" not in out
    _assert_never_created(canary)


@pytest.mark.parametrize("kind", PAYLOAD_GLOBALS)
def test_the_audit_sees_each_payload_run(kind: str, tmp_path: Path) -> None:
    """The check of the tests above fails where a payload runs: its audit event comes before the canary exists."""
    canary = _watched(tmp_path / "canary")
    ran = pickle.loads(pickle.dumps(_payload(kind, canary)))
    seen = _ran(canary)
    if isinstance(ran, subprocess.Popen):
        ran.wait()
    assert seen and seen[0].startswith(("subprocess.Popen", "os.system", "compile")), seen


def test_the_payloads_run_when_loaded(model_zip: Path, tmp_path: Path) -> None:
    """The traps are live: SB3's load runs the one in data; torch.load without weights_only the ones in .pth."""
    canary = tmp_path / "canary"
    trap = _booby_trap(model_zip, tmp_path / "data.zip", "data", _payload("builtins.eval", canary))
    with contextlib.suppress(Exception):  # the payload replaced the schedule: load may fail after running it
        PPO.load(trap, device="cpu")
    assert canary.exists()
    for place in ("policy.pth", "pytorch_variables.pth"):
        canary.unlink()
        trap = _booby_trap(model_zip, tmp_path / f"{place}.zip", place, _payload("builtins.eval", canary))
        # SB3's load reads .pth entries with weights_only=True, which refuses the global: doctor says so
        with pytest.raises(pickle.UnpicklingError):
            PPO.load(trap, device="cpu")
        assert not canary.exists()
        with zipfile.ZipFile(trap) as archive:
            th.load(archive.open(place), weights_only=False)
        assert canary.exists()


def test_every_data_item_booby_trapped(model_zip: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """The issue's file: every pickled item of data calls os.system. Each is named; the policy class is not shown."""
    canary = _watched(tmp_path / "canary")
    trap = pickle.dumps(_payload("os.system", canary))
    with zipfile.ZipFile(model_zip) as archive:
        pickled = [
            key for key, item in json.loads(archive.read("data")).items() if isinstance(item, dict) and ":serialized:" in item
        ]
    assert len(pickled) >= 10
    path = rewrite_zip(model_zip, tmp_path / "trap.zip", data=lambda data: data | {key: serialized(trap) for key in pickled})
    status, out, _ = _doctor(path, capsys)
    assert status == EXIT_UNHEALTHY
    assert out.count(f"loading this file would run code from {SYSTEM}") == len(pickled)
    assert out.splitlines()[0] == f"{path} (16 timesteps)"  # no "posix.system" as the policy class
    assert "Healthy" not in out
    report = diagnose(path)
    assert not report.healthy and {finding.target for finding in report.unsafe} == {SYSTEM}
    _assert_never_created(canary)


def _crafted(canary: Path) -> dict[str, tuple[bytes, str, bool]]:
    """
    Pickles no object pickles to, each as (pickle, what doctor must say, whether loading it creates the canary).
    """
    command = unicode(shell_command(canary))
    logger = unicode("stable_baselines3.common.logger") + unicode("HumanOutputFormat") + STACK_GLOBAL
    system = SYSTEM.split(".")
    return {
        # STACK_GLOBAL's strings come from the memo, stored long before
        "memo": (
            PROTO_4 + unicode(system[0]) + MEMOIZE + POP + unicode(system[1]) + MEMOIZE + POP
            + binget(0) + binget(1) + STACK_GLOBAL + command + TUPLE1 + REDUCE + STOP,
            f"loading this file would run code from {SYSTEM} (the pickle calls it)",
            True,
        ),
        # the module name is computed while loading: cannot be resolved statically
        "computed name": (
            PROTO_4 + global_opcode("builtins", "str") + unicode(system[0]) + TUPLE1 + REDUCE
            + unicode(system[1]) + STACK_GLOBAL + command + TUPLE1 + REDUCE + STOP,
            "a STACK_GLOBAL that cannot be resolved statically",
            True,
        ),
        # an attribute path through a module of SB3 (protocol 4 resolves dotted names)
        "attribute path": (
            PROTO_4 + unicode("stable_baselines3.common.save_util") + unicode("os.system") + STACK_GLOBAL
            + command + TUPLE1 + REDUCE + STOP,
            "loading this file would run code from stable_baselines3.common.save_util.os.system (the pickle calls it)",
            True,
        ),
        # a class of SB3 that model files name but never build: it opens (truncates) the file it is given
        "SB3 class called": (
            PROTO_4 + logger + unicode(str(canary)) + TUPLE1 + REDUCE + STOP,
            "loading this file would run code from stable_baselines3.common.logger.HumanOutputFormat (the pickle calls it)",
            True,
        ),
        # an allowed numpy reconstructor handed that class, which it calls
        "passed to a reconstructor": (
            PROTO_4 + unicode("numpy.random._pickle") + unicode("__generator_ctor") + STACK_GLOBAL
            + unicode(str(canary)) + logger + TUPLE2 + REDUCE + STOP,
            "stable_baselines3.common.logger.HumanOutputFormat (the pickle passes it to "
            "numpy.random._pickle.__generator_ctor, which calls it)",
            True,
        ),
        # importing sb3-safe's __main__ runs the CLI; rl_zoo3.benchmark runs a benchmark on import
        "__main__ module": (PROTO_2 + global_opcode("sb3_safe.__main__", "main") + STOP, "sb3_safe.__main__.main", False),
        "script module": (PROTO_2 + global_opcode("rl_zoo3.benchmark", "args") + STOP, "rl_zoo3.benchmark.args", False),
        "extension code": (PROTO_2 + EXT1 + b"\x07" + STOP, "extension code 7 (copyreg registry)", False),
        # BUILD on a class sets its attributes: here FloatSchedule.__call__ (never loaded by this test)
        "class changed": (
            PROTO_4 + unicode("stable_baselines3.common.utils") + unicode("FloatSchedule") + STACK_GLOBAL
            + NONE + EMPTY_DICT + unicode("__call__") + binint1(1) + SETITEM + TUPLE2 + BUILD + STOP,
            "stable_baselines3.common.utils.FloatSchedule (the pickle changes it",
            False,
        ),
    }  # fmt: skip


@pytest.mark.parametrize(
    "case",
    [
        "memo",
        "computed name",
        "attribute path",
        "SB3 class called",
        "passed to a reconstructor",
        "__main__ module",
        "script module",
        "extension code",
        "class changed",
    ],
)
def test_crafted_pickles(case: str, model_zip: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    canary = _watched(tmp_path / "canary")
    pickled, expected, live = _crafted(canary)[case]
    path = rewrite_zip(model_zip, tmp_path / "trap.zip", data=lambda data: data | {"lr_schedule": serialized(pickled)})
    modules = set(sys.modules)
    status, out, _ = _doctor(path, capsys)
    assert status == EXIT_UNHEALTHY and expected in out and "Healthy" not in out
    _assert_never_created(canary)
    # doctor imported none of the modules the file names outside what it checks
    assert not {"sb3_safe.__main__", "rl_zoo3.benchmark"} & (set(sys.modules) - modules)
    if live:  # the same bytes do run when unpickled
        with contextlib.suppress(Exception):  # HumanOutputFormat is no bit generator: numpy fails after calling it
            pickle.loads(pickled)
        assert canary.exists()


def test_nested_torch_bytes_are_scanned(model_zip: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """torch.storage._load_from_bytes (ARS's weights) runs torch.load(weights_only=False) on bytes of the pickle."""
    canary = _watched(tmp_path / "canary")
    inner = torch_bytes(_payload("builtins.eval", canary), legacy=True)
    outer = pickle.dumps(Reduce(th.storage._load_from_bytes, inner))
    path = rewrite_zip(model_zip, tmp_path / "trap.zip", data=lambda data: data | {"weights": serialized(outer)})
    status, out, _ = _doctor(path, capsys)
    assert status == EXIT_UNHEALTHY
    assert (
        'data["weights"] > bytes loaded by torch.storage._load_from_bytes (legacy format, pickle 4): loading this '
        "file would run code from builtins.eval (the pickle calls it)" in out
    )
    _assert_never_created(canary)
    pickle.loads(outer)
    assert canary.exists()


def _torch_bytes_4(obj: Any, legacy: bool = False) -> bytes:
    """``th.save`` of ``obj`` at pickle protocol 4, whose bytes objects are literals (protocol 2 computes them)."""
    buffer = io.BytesIO()
    th.save(obj, buffer, _use_new_zipfile_serialization=not legacy, pickle_protocol=4)
    return buffer.getvalue()


def _nested_loads(levels: int, payload: Reduce, legacy: bool = False) -> Any:
    """An object whose pickle loads a torch file by torch.storage._load_from_bytes, which loads another, ``levels`` deep."""
    nested: Any = payload
    for _ in range(levels):
        nested = Reduce(th.storage._load_from_bytes, _torch_bytes_4(nested, legacy=legacy))
    return nested


def _nested_torch_files(levels: int, payload: Reduce, legacy: bool) -> bytes:
    """A pickle that loads a torch file by torch.storage._load_from_bytes, which loads another, ``levels`` deep."""
    return pickle.dumps(_nested_loads(levels, payload, legacy))


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy"])
@pytest.mark.parametrize("levels", [4, 5])
def test_torch_files_are_scanned_four_deep_and_deeper_nesting_is_named(
    model_zip: Path, tmp_path: Path, capsys: pytest.CaptureFixture, levels: int, legacy: bool
) -> None:
    """
    Promise: doctor scans torch files nested by _load_from_bytes down to 4 levels (names the code the deepest would
    run, exit 1), and refuses a file nested deeper as unreadable (exit 2, naming the depth) instead of following it
    without end.
    """
    canary = _watched(tmp_path / "canary")
    outer = _nested_torch_files(levels, _payload("builtins.eval", canary), legacy)
    path = rewrite_zip(model_zip, tmp_path / "nested.zip", data=lambda data: data | {"weights": serialized(outer)})
    _assert_found_at_4_refused_deeper(_doctor(path, capsys), levels, canary)


def test_a_pth_entry_whose_nested_torch_file_runs_code_is_not_loaded(
    model_zip: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """
    Promise: a ``.pth`` entry is loaded for its tensors only when nothing in it would run code, nested torch files
    included: one whose pickle loads a torch file that runs code is named and left unloaded.
    """
    canary = _watched(tmp_path / "canary")
    with zipfile.ZipFile(model_zip) as archive:
        state_dict = th.load(archive.open("policy.pth"), weights_only=True)
    extra = Reduce(th.storage._load_from_bytes, _torch_bytes_4(_payload("builtins.eval", canary)))
    policy = _torch_bytes_4(state_dict | {"x": extra})  # its own pickle clean: the bytes it loads are literal
    path = rewrite_zip(model_zip, tmp_path / "nested.zip", replace={"policy.pth": policy})
    status, out, _ = _doctor(path, capsys)
    assert status == EXIT_UNHEALTHY and "would run code from builtins.eval" in out
    assert "policy.pth: its pickle is not one SB3 writes, so its tensors are not loaded" in out
    # The command it suggests disassembles the entry's own pickle (the nested file's name is no shell argument)
    assert f"sb3-safe doctor --dis policy.pth {path} " in out
    _assert_never_created(canary)


def test_serialized_text_that_is_no_utf8_is_unreadable(model_zip: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """
    Promise: an item whose ``:serialized:`` text cannot be encoded (a lone surrogate, which JSON can write) is named as
    not base64, as any undecodable item is: doctor reports the file unreadable rather than failing.
    """
    item = {":type:": "<class 'object'>", ":serialized:": "gASV\ud800"}
    path = rewrite_zip(model_zip, tmp_path / "surrogate.zip", data=lambda data: data | {"lr_schedule": item})
    status, out, err = _doctor(path, capsys)
    assert status == EXIT_UNREADABLE
    assert "':serialized:' is not base64" in out + err


def test_a_lambda_learning_rate_is_code_in_the_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """
    cloudpickle stores a lambda's code: loading builds it (exit 1). SB3 documents lambda schedules, so the report
    says what the function is, that this is expected for a schedule the user wrote, and how to load without it.
    """
    path = tmp_path / "lambda.zip"
    # Saved by a script, as a user saves it: the lambda is defined in __main__ (SB3's documented schedule)
    script = (
        "from stable_baselines3 import PPO\n"
        "model = PPO('MlpPolicy', 'CartPole-v1', learning_rate=lambda progress: 3e-4 * progress, n_steps=16)\n"
        f"model.save({str(path)!r})\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    status, out, _ = _doctor(path, capsys)
    assert status == EXIT_UNHEALTHY
    assert "UNSAFE" not in out and "loading this file would run code from" not in out
    assert "CODE: these items hold functions stored with their code, which loading runs:" in out
    # learning_rate and lr_schedule (SB3's FloatSchedule holding the lambda), one line each
    assert "  learning_rate: <lambda>, a function defined in __main__ (the script that saved the model)" in out
    assert "  lr_schedule: <lambda>, a function defined in __main__" in out
    assert "Expected for a learning rate or schedule you wrote as a lambda or a function of your script" in out
    replacements = '{"learning_rate": 0.0, "lr_schedule": 0.0}'
    assert f"PPO.load({str(path)!r}, custom_objects={replacements}) to predict" in out
    # The line's advice works: the items are replaced unread, and the model predicts
    loaded = PPO.load(path, custom_objects={"learning_rate": 0.0, "lr_schedule": 0.0}, device="cpu")
    loaded.predict(np.zeros(4, dtype=np.float32))
    assert f"sb3-safe doctor --dis 'data[\"learning_rate\"]' {path}" in out
    status, out, _ = _doctor(path, capsys, "--json")
    stored = json.loads(out)["stored_functions"]
    assert stored == [{"key": key, "module": "__main__", "qualname": "<lambda>"} for key in ("learning_rate", "lr_schedule")]


def test_a_stored_function_of_a_module_and_other_code_beside_it(
    model_zip: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A function defined in a module is named by its module; code beside a stored function is still UNSAFE."""

    def make_schedule(start: float):
        return lambda progress: start * progress

    schedule = make_schedule(3e-4)
    schedule.__module__ = "my_project.schedules"  # as if defined there: cloudpickle stores the module it names
    pickled = cloudpickle.dumps(schedule)
    system_call = pickle.dumps(Reduce(os.system, "true"))
    path = rewrite_zip(
        model_zip,
        tmp_path / "closure.zip",
        data=lambda data: data | {"clip_range": serialized(pickled), "extra": serialized(system_call)},
    )
    status, out, _ = _doctor(path, capsys)
    assert status == EXIT_UNHEALTHY
    assert "CODE: this item holds a function stored with its code, which loading runs:" in out
    qualname = f"{test_a_stored_function_of_a_module_and_other_code_beside_it.__name__}.<locals>.make_schedule.<locals>"
    assert f"  clip_range: {qualname}.<lambda>, a function defined in my_project.schedules\n" in out
    assert 'custom_objects={"clip_range": 0.0}' in out
    assert "UNSAFE: loading this file would run code that SB3 / sb3-contrib / sb3-safe model files never need (1 " in out
    assert f'data["extra"]: loading this file would run code from {SYSTEM}' in out


def test_trusted_module_and_dis(model_zip: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A class of the user's own is named (exit 1) unless trusted; --dis shows the opcodes without loading."""
    pickled = PROTO_2 + global_opcode("my_project.networks", "Extractor") + STOP
    path = rewrite_zip(model_zip, tmp_path / "own.zip", data=lambda data: data | {"extractor": serialized(pickled)})
    status, out, _ = _doctor(path, capsys)
    assert status == EXIT_UNHEALTHY
    assert 'data["extractor"]: loading this file would run code from my_project.networks.Extractor' in out
    assert "sb3-safe doctor --dis 'data[\"extractor\"]'" in out
    status, out, _ = _doctor(path, capsys, "--trust", "my_project")
    assert status == EXIT_HEALTHY and "Healthy" in out
    status, out, _ = _doctor(path, capsys, "--dis", 'data["extractor"]')
    assert status == EXIT_HEALTHY and "GLOBAL     'my_project.networks Extractor'" in out
    assert "my_project" not in sys.modules


def test_json_report_lists_the_findings(model_zip: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    canary = tmp_path / "canary"
    path = _booby_trap(model_zip, tmp_path / "trap.zip", "policy.pth", _payload("os.system", canary))
    status, out, _ = _doctor(path, capsys, "--json")
    report = json.loads(out)
    assert status == EXIT_UNHEALTHY and report["healthy"] is False and report["tensors_checked"] is False
    (finding,) = report["unsafe"]
    assert finding["entry"] == "policy.pth" and finding["target"] == SYSTEM
    assert "weights_only=True) refuses it" in finding["detail"]


def _json_list(data: dict) -> bytes:
    return b"[1, 2]"


def _optimizer(model_zip: Path, change: Callable[[dict], None]) -> bytes:
    with zipfile.ZipFile(model_zip) as archive:
        state = th.load(archive.open("policy.optimizer.pth"), weights_only=True)
    change(state)
    return torch_bytes(state)


def _set(key: str, value: object) -> Callable[[dict], None]:
    return lambda state: state.__setitem__(key, value)


def _torch_zip_without_pickle() -> bytes:
    import io

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("archive/version", b"3\n")
    return buffer.getvalue()


#: (how to build it from the model zip and a target path, what the one line must say)
MALFORMED: dict[str, tuple[Callable[[Path, Path], Path], str]] = {
    "data a JSON list": (
        lambda src, dst: rewrite_zip(src, dst, data=_json_list),
        "data: expected a JSON object (the model's attributes), got a list",
    ),
    "data nested 100,000 levels": (
        lambda src, dst: rewrite_zip(src, dst, data=lambda _: b"[" * 100_000 + b"]" * 100_000),
        "data: JSON nested too deeply to read",
    ),
    "data not UTF-8": (lambda src, dst: rewrite_zip(src, dst, data=lambda _: b"\xff\xfe{}"), "data: expected UTF-8"),
    "data not JSON": (lambda src, dst: rewrite_zip(src, dst, data=lambda _: b"{policy"), "data: expected JSON"),
    "serialized not text": (
        lambda src, dst: rewrite_zip(src, dst, data=lambda data: data | {"policy_class": {":serialized:": [1]}}),
        "data[\"policy_class\"]: ':serialized:' is a list, expected base64 text",
    ),
    "serialized a truncated pickle": (
        lambda src, dst: rewrite_zip(src, dst, data=lambda d: d | {"lr_schedule": serialized(pickle.dumps([1.0] * 9)[:12])}),
        'data["lr_schedule"]: not a valid pickle',
    ),
    "policy.pth a list": (
        lambda src, dst: rewrite_zip(src, dst, replace={"policy.pth": torch_bytes([th.zeros(2)])}),
        "policy.pth: expected a state dict (names to tensors), got a list",
    ),
    "policy.pth a bare tensor": (
        lambda src, dst: rewrite_zip(src, dst, replace={"policy.pth": torch_bytes(th.zeros(2))}),
        "policy.pth: expected a state dict (names to tensors), got a tensor",
    ),
    "policy.pth not a torch file": (
        lambda src, dst: rewrite_zip(src, dst, replace={"policy.pth": b"\x00garbage"}),
        "policy.pth: not a torch file",
    ),
    "policy.pth a torch zip without its pickle": (
        lambda src, dst: rewrite_zip(src, dst, replace={"policy.pth": _torch_zip_without_pickle()}),
        "policy.pth: a torch zip file without archive/data.pkl",
    ),
    "pytorch_variables.pth a list": (
        lambda src, dst: rewrite_zip(src, dst, replace={"pytorch_variables.pth": torch_bytes([1, 2])}),
        "pytorch_variables.pth: expected a dict of tensors (names to tensors), got a list",
    ),
    "optimizer param_groups a string": (
        lambda src, dst: rewrite_zip(src, dst, replace={"policy.optimizer.pth": _optimizer(src, _set("param_groups", "lr"))}),
        "policy.optimizer.pth: expected an optimizer state dict (state: a dict of dicts, param_groups: a list of "
        "dicts with params), got param_groups of type str",
    ),
    "optimizer state a list": (
        lambda src, dst: rewrite_zip(src, dst, replace={"policy.optimizer.pth": _optimizer(src, _set("state", []))}),
        "got state of type list",
    ),
    "a tensor larger than its storage": (
        lambda src, dst: rewrite_zip(src, dst, replace={"policy.pth": torch_bytes({"w": th.zeros(1).expand(10**10)})}),
        "policy.pth: tensor w has 10000000000 values over a storage of 4 bytes",
    ),
    "no policy.pth": (lambda src, dst: rewrite_zip(src, dst, drop=("policy.pth",)), "a zip archive without policy.pth"),
    "no data": (lambda src, dst: rewrite_zip(src, dst, drop=("data",)), "a zip archive without data"),
    "two entries named data": (lambda src, dst: duplicate_entry(src, dst, "data"), "two entries named data"),
    # cut in policy.pth: the directory found at the end is that of the torch zip stored in it
    "truncated zip": (
        lambda src, dst: dst.write_bytes(src.read_bytes()[: src.stat().st_size // 2]) and dst,
        "a truncated or damaged zip archive (the directory found at its end describes a zip starting at byte",
    ),
    "truncated zip, no directory left": (
        lambda src, dst: dst.write_bytes(src.read_bytes()[:2000]) and dst,
        "a truncated zip archive (it starts as one, its directory at the end is missing)",
    ),
    "not a zip": (lambda src, dst: dst.write_bytes(b"\x89PNG not a zip") and dst, "not a zip archive"),
    "an empty file": (lambda src, dst: dst.write_bytes(b"") or dst, "not a zip archive"),
}


@pytest.mark.parametrize("case", MALFORMED)
def test_malformed_files_exit_2_with_one_line(
    case: str, model_zip: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    build, expected = MALFORMED[case]
    path = build(model_zip, tmp_path / "bad.zip")
    status, out, err = _doctor(path, capsys)
    assert status == EXIT_UNREADABLE and out == ""
    assert err.startswith(f"sb3-safe doctor: error: {path}: ") and err.count("\n") == 1
    assert expected in err
    assert "an error in doctor" not in err


def test_a_corrupted_entry_is_named(model_zip: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    raw = bytearray(model_zip.read_bytes())
    with zipfile.ZipFile(model_zip) as archive:
        info = archive.getinfo("data")
    raw[info.header_offset + 30 + len(info.filename) + 5] ^= 0xFF  # one byte of the stored JSON
    (tmp_path / "crc.zip").write_bytes(bytes(raw))
    status, _, err = _doctor(tmp_path / "crc.zip", capsys)
    assert status == EXIT_UNREADABLE and "cannot read entry data (BadZipFile: Bad CRC-32" in err


def test_size_limits_refuse_before_reading(model_zip: Path, capsys: pytest.CaptureFixture) -> None:
    """The flags move the limits both ways: a real model passes the defaults, and is refused under tiny ones."""
    assert _doctor(model_zip, capsys)[0] == EXIT_HEALTHY
    with zipfile.ZipFile(model_zip) as archive:
        data_size = archive.getinfo("data").file_size
    status, _, err = _doctor(model_zip, capsys, "--max-entry-mb", "0.001")
    assert status == EXIT_UNREADABLE
    assert (
        f"entry data is {data_size / 1024:.1f} KiB uncompressed, beyond the limit of 1.0 KiB per entry (--max-entry-mb" in err
    )
    status, _, err = _doctor(model_zip, capsys, "--max-total-mb", "0.01")
    assert status == EXIT_UNREADABLE and "would hold more than its budget of 10.2 KiB" in err and "--max-total-mb" in err


_PEAK_SCRIPT = """
import json, resource, sys
from sb3_safe.cli import main

def peak():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux

baseline = peak()
statuses = [main(["doctor", path]) for path in sys.argv[1:]]
print(json.dumps({"statuses": statuses, "grew": peak() - baseline}))
"""


@pytest.mark.skipif(sys.platform != "linux", reason="ru_maxrss is in KiB on Linux")
def test_decompression_bombs_are_refused_with_bounded_memory(model_zip: Path, tmp_path: Path) -> None:
    """
    A ~1 MB zip whose policy.pth inflates to a torch file of a 1 GB zero tensor: refused from the sizes the central
    directory declares; when the directory lies, zipfile stops at the declared size; a bomb in the torch zip inside
    policy.pth is refused from its own directory. Peak memory stays far below the gigabyte.
    """
    numel = 250_000_000  # 1 GB of float32 zeros
    honest = model_with_policy(model_zip, tmp_path / "bomb.zip", torch_zip_of_zeros(numel), deflate=True)
    lying = model_with_policy(model_zip, tmp_path / "lying.zip", torch_zip_of_zeros(numel), deflate=True, declared=2**21)
    nested = model_with_policy(
        model_zip, tmp_path / "nested.zip", torch_zip_of_zeros(numel, deflate_record=True), deflate=False
    )
    assert honest.stat().st_size < 2e6 and nested.stat().st_size < 2e6
    result = subprocess.run(
        [sys.executable, "-c", _PEAK_SCRIPT, str(honest), str(lying), str(nested)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "Traceback" not in result.stderr, result.stderr
    measured = json.loads(result.stdout.splitlines()[-1])
    assert measured["statuses"] == [EXIT_UNREADABLE] * 3
    errors = result.stderr.splitlines()
    assert len(errors) == 3
    assert errors[0].endswith(
        "bomb.zip: entry policy.pth is 953.7 MiB uncompressed, beyond the limit of 512.0 MiB per entry "
        "(--max-entry-mb raises it)"
    )
    assert "lying.zip: cannot read entry policy.pth (BadZipFile: Bad CRC-32" in errors[1]
    assert errors[2].endswith(
        "nested.zip: policy.pth: entry archive/data/0 is 953.7 MiB uncompressed, beyond the limit of 512.0 MiB per "
        "entry (--max-entry-mb raises it)"
    )
    assert measured["grew"] < 64 * 2**20, f"peak memory grew by {measured['grew'] / 2**20:.0f} MiB"


def test_bomb_builder_writes_what_torch_reads(tmp_path: Path) -> None:
    """The bombs above are real: the same builder, for 10 values, is a torch file of 10 zeros (stored or deflated)."""
    from benchmarks.zip_writer import write_segments

    for deflate in (False, True):
        path = write_segments(tmp_path / f"small_{deflate}.pth", torch_zip_of_zeros(10, deflate_record=deflate))
        assert th.equal(th.load(path, weights_only=True)["weight"], th.zeros(10))


def test_a_closed_pipe_is_quiet(model_zip: Path) -> None:
    """``sb3-safe doctor model.zip | head -1``: no BrokenPipeError traceback, and the status still says healthy."""
    process = subprocess.Popen(
        [sys.executable, "-m", "sb3_safe", "doctor", str(model_zip)], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # the reader is gone before doctor writes
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=60) == EXIT_HEALTHY
    assert stderr == ""


def test_all_nan_log_std_is_reported_once(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    model = PPO("MlpPolicy", "Pendulum-v1", policy_kwargs=dict(net_arch=[8]))
    with th.no_grad():
        model.policy.log_std.fill_(np.nan)
    model.save(tmp_path / "nan.zip")
    status, out, _ = _doctor(tmp_path / "nan.zip", capsys)
    assert status == EXIT_UNHEALTHY
    assert "  policy.log_std: 1 NaN, 0 inf of 1" in out
    assert "log-std: no finite value (see the NaN / inf above)" in out
    assert "no log_std parameter" not in out


def test_hostile_file_end_to_end(model_zip: Path, tmp_path: Path) -> None:
    """As a user runs it: python -m sb3_safe doctor on a booby-trapped file."""
    canary = _watched(tmp_path / "canary")
    path = _booby_trap(model_zip, tmp_path / "trap.zip", "data", _payload("os.system", canary))
    result = subprocess.run([sys.executable, "-m", "sb3_safe", "doctor", str(path)], capture_output=True, text=True)
    assert result.returncode == EXIT_UNHEALTHY and result.stderr == ""
    assert f"loading this file would run code from {SYSTEM}" in result.stdout
    # (in the doctor's own process, which has ended: os.system would have created the canary before returning)
    _assert_never_created(canary)


def test_help_documents_the_exit_statuses(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        main(["doctor", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "Exit status: 0 healthy; 1 unhealthy (code beyond what SB3 model files need, a lambda learning rate" in text
    assert "stored with its code included, NaN / inf" in text
    assert "2 not a readable SB3 model" in text and "--max-entry-mb" in text


def test_vecnormalize_and_replay_buffer_pickles(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """The plain pickles SB3 writes besides model zips (rl_zoo3's enjoy unpickles vecnormalize.pkl in full)."""
    env = VecNormalize(DummyVecEnv([lambda: gym.make("Pendulum-v1")]))
    env.reset()
    env.save(tmp_path / "vecnormalize.pkl")
    model = SAC("MlpPolicy", "Pendulum-v1", learning_starts=8, buffer_size=32, batch_size=8, policy_kwargs=dict(net_arch=[8]))
    model.learn(16)
    model.save_replay_buffer(tmp_path / "buffer.pkl")
    for name in ("vecnormalize.pkl", "buffer.pkl"):
        status, out, _ = _doctor(tmp_path / name, capsys)
        assert status == EXIT_HEALTHY and "Healthy: the pickle names only what SB3 files hold" in out
    canary = _watched(tmp_path / "canary")
    (tmp_path / "trap.pkl").write_bytes(pickle.dumps(_payload("builtins.eval", canary)))
    status, out, _ = _doctor(tmp_path / "trap.pkl", capsys)
    assert status == EXIT_UNHEALTHY and "trap.pkl: loading this file would run code from builtins.eval" in out
    _assert_never_created(canary)
    with contextlib.suppress(Exception):
        VecNormalize.load(str(tmp_path / "trap.pkl"), DummyVecEnv([lambda: gym.make("Pendulum-v1")]))
    assert canary.exists()  # VecNormalize.load runs it
    (tmp_path / "cut.pkl").write_bytes((tmp_path / "vecnormalize.pkl").read_bytes()[:100])
    status, _, err = _doctor(tmp_path / "cut.pkl", capsys)
    assert status == EXIT_UNREADABLE and "cut.pkl: not a valid pickle" in err


def test_names_from_the_file_cannot_drive_the_terminal(model_zip: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A global named with control characters (a new line, a screen clear) is printed escaped, on its one line."""
    name = "system\x1b[2J\nHealthy: all fine"
    pickled = PROTO_4 + unicode("os") + unicode(name) + STACK_GLOBAL + STOP
    path = rewrite_zip(model_zip, tmp_path / "ansi.zip", data=lambda data: data | {"x\ny": serialized(pickled)})
    status, out, _ = _doctor(path, capsys)
    assert status == EXIT_UNHEALTHY and "\x1b" not in out and "\nHealthy" not in out
    assert '  data["x\\ny"]: loading this file would run code from os.system\\x1b[2J\\nHealthy: all fine' in out


def test_a_pickle_beyond_the_opcode_limit_is_never_healthy(
    model_zip: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """The file's pickles pass its budget of opcodes: the file is refused (exit 2), never healthy."""
    canary = _watched(tmp_path / "canary")
    padding = (NONE + POP) * 600  # 1200 harmless opcodes before the payload
    pickled = PROTO_4 + padding + unicode("builtins") + unicode("eval") + STACK_GLOBAL
    pickled += unicode(touch_code(canary)) + TUPLE1 + REDUCE + STOP
    path = rewrite_zip(model_zip, tmp_path / "long.zip", data=lambda data: data | {"lr_schedule": serialized(pickled)})
    status, out, err = _doctor(path, capsys, "--max-opcodes", "1000")
    assert status == EXIT_UNREADABLE and out == ""
    assert "the file's pickles have more than its budget of 1000 opcodes" in err
    _assert_never_created(canary)


def test_a_call_with_a_huge_argument_is_not_checked_so_not_healthy(
    model_zip: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    items = b"(" + NONE * 10_001 + b"t"  # MARK, 10,001 Nones, TUPLE
    pickled = PROTO_4 + unicode("collections") + unicode("OrderedDict") + STACK_GLOBAL + items + TUPLE1 + REDUCE + STOP
    path = rewrite_zip(model_zip, tmp_path / "wide.zip", data=lambda data: data | {"lr_schedule": serialized(pickled)})
    status = run_doctor(str(path), limits=SizeLimits(values=10_000))
    _, err = capsys.readouterr()
    assert status == EXIT_UNREADABLE and "its calls' arguments hold more than the file's budget of 10000 values" in err


def _state_dict(model_zip: Path) -> dict[str, th.Tensor]:
    with zipfile.ZipFile(model_zip) as archive:
        return th.load(archive.open("policy.pth"), weights_only=True)


def test_weights_in_torchs_legacy_format_are_healthy(model_zip: Path, tmp_path: Path) -> None:
    """
    Promise: torch's legacy format, which torch.load reads, is read as five pickles and the raw storages after them:
    a policy.pth saved in it with clean weights is healthy, its tensors loaded and checked.
    """
    legacy = torch_bytes(_state_dict(model_zip), legacy=True)
    path = rewrite_zip(model_zip, tmp_path / "legacy.zip", replace={"policy.pth": legacy})
    report = diagnose(path)
    assert report.healthy and report.unsafe == [] and report.unchecked == []
    assert report.tensors_checked and report.n_tensors > 0


def test_code_in_the_fifth_pickle_of_torchs_legacy_format_is_named(
    model_zip: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """
    Promise: all five pickles of torch's legacy format are scanned, the last (the storage keys, which torch.load
    without weights_only unpickles in full) included.
    """
    canary = _watched(tmp_path / "canary")
    clean = io.BytesIO(torch_bytes({}, legacy=True))
    for _ in range(4):  # magic number, protocol version, system info, the object
        pickle.load(clean)
    raw = clean.getvalue()[: clean.tell()] + pickle.dumps(_payload("builtins.eval", canary))
    path = rewrite_zip(model_zip, tmp_path / "keys.zip", replace={"pytorch_variables.pth": raw})
    status, out, _ = _doctor(path, capsys)
    assert status == EXIT_UNHEALTHY
    assert "pytorch_variables.pth (legacy format, pickle 5): loading this file would run code from builtins.eval" in out
    _assert_never_created(canary)
    with contextlib.suppress(Exception):  # torch fails after running it: the payload returns no storage keys
        th.load(io.BytesIO(raw), weights_only=False)
    assert canary.exists()


def test_torchs_legacy_format_is_read_up_to_its_first_invalid_pickle(
    model_zip: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """
    Promise: doctor reads the legacy format as torch.load does, which stops at the first invalid pickle: that pickle
    is named (unreadable, exit 2), and code in the bytes after it, which never runs, is not reported as code.
    """
    canary = _watched(tmp_path / "canary")
    magic = io.BytesIO(torch_bytes({}, legacy=True))
    pickle.load(magic)
    raw = magic.getvalue()[: magic.tell()] + b"\xff" + pickle.dumps(_payload("builtins.eval", canary))
    path = rewrite_zip(model_zip, tmp_path / "cut.zip", replace={"pytorch_variables.pth": raw})
    status, out, err = _doctor(path, capsys)
    assert status == EXIT_UNREADABLE and out == ""
    assert "pytorch_variables.pth (legacy format, pickle 2): not a valid pickle" in err
    with pytest.raises(pickle.UnpicklingError):
        th.load(io.BytesIO(raw), weights_only=False)
    _assert_never_created(canary)


@pytest.mark.parametrize("levels", [4, 5])
@pytest.mark.parametrize("place", ["pickle file", "policy.pth"])
def test_the_nesting_limit_holds_in_pickle_files_and_pth_entries(
    place: str, levels: int, model_zip: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """
    Promise: as for data items, torch files nested by _load_from_bytes in a plain pickle file (vecnormalize.pkl) or
    in a .pth entry are scanned 4 levels deep (the code of the deepest named, exit 1), and deeper nesting is
    refused as unreadable (exit 2), not followed.
    """
    canary = _watched(tmp_path / "canary")
    nested = _nested_loads(levels, _payload("builtins.eval", canary))
    if place == "pickle file":
        path = tmp_path / "vecnormalize.pkl"
        path.write_bytes(pickle.dumps(nested))
    else:
        policy = _torch_bytes_4(_state_dict(model_zip) | {"x": nested})
        path = rewrite_zip(model_zip, tmp_path / "nested.zip", replace={"policy.pth": policy})
    _assert_found_at_4_refused_deeper(_doctor(path, capsys), levels, canary)


def _unsafe_pth(canary: Path) -> dict[str, bytes]:
    """.pth entries with code or a problem in them, by what is wrong."""
    payload = _payload("builtins.eval", canary)
    return {
        "code in the legacy format's pickle": torch_bytes({"x": payload}, legacy=True),
        "code in a torch file the legacy format's pickle loads": _torch_bytes_4({"x": _nested_loads(1, payload)}, legacy=True),
        "torch files nested more than 4 deep": _torch_bytes_4({"x": _nested_loads(5, payload)}),
        "a torch zip without its pickle": _torch_zip_without_pickle(),
        "not a torch file": b"\x00garbage",
    }


@pytest.mark.parametrize(
    "case",
    [
        "code in the legacy format's pickle",
        "code in a torch file the legacy format's pickle loads",
        "torch files nested more than 4 deep",
        "a torch zip without its pickle",
        "not a torch file",
    ],
)
def test_a_pth_entry_with_code_or_a_problem_is_never_loaded(case: str, tmp_path: Path) -> None:
    """
    Promise: a .pth entry in which doctor finds code, or which it cannot read through (not a torch file, a torch zip
    without its pickle, nesting too deep), is marked unsafe: doctor never hands it to torch.load for its tensors.
    """
    canary = _watched(tmp_path / "canary")
    report = PickleReport()
    scan_torch_entry(_unsafe_pth(canary)[case], "policy.pth", Allowlist(), ReadingBudget(), report)
    assert report.findings or report.problems
    assert report.unsafe_entries == {"policy.pth"}
    _assert_never_created(canary)


@pytest.mark.parametrize("kind", ["Generator", "RandomState"])
def test_numpy_1_random_generator_pickles_are_allowed(
    kind: str, model_zip: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """
    Promise: numpy's Generator and RandomState pickled as numpy 1.x writes them (the bit generator's class and
    constructor passed to numpy's ctor, which builds them) are allowed: a space's random generator saved then.
    """
    from numpy.random import _pickle as numpy_pickle

    ctor = numpy_pickle.__generator_ctor if kind == "Generator" else numpy_pickle.__randomstate_ctor
    pickled = pickle.dumps(Reduce(ctor, np.random.PCG64, numpy_pickle.__bit_generator_ctor), protocol=2)
    assert b"numpy.random._pcg64\nPCG64" in pickled  # the class itself, passed by name
    assert type(pickle.loads(pickled)).__name__ == kind  # numpy 2 still loads it
    path = rewrite_zip(model_zip, tmp_path / "rng.zip", data=lambda data: data | {"np_random": serialized(pickled)})
    status, out, _ = _doctor(path, capsys)
    assert status == EXIT_HEALTHY and "Healthy" in out, out


_RMSPROP_MODULE = "stable_baselines3.common.sb2_compat.rmsprop_tf_like"


def test_a_class_of_an_sb3_module_not_yet_imported_is_allowed(
    model_zip: Path, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """
    Promise: a model naming SB3's RMSpropTFLike as its optimizer (SB3's documented A2C option) is healthy when
    doctor runs in a process that has not imported that module yet (as ``sb3-safe doctor`` does): doctor imports
    the trusted module to check the class.
    """
    from stable_baselines3.common.sb2_compat.rmsprop_tf_like import RMSpropTFLike

    policy_kwargs = cloudpickle.dumps({"net_arch": [8], "optimizer_class": RMSpropTFLike})
    path = rewrite_zip(
        model_zip, tmp_path / "rmsprop.zip", data=lambda data: data | {"policy_kwargs": serialized(policy_kwargs)}
    )
    monkeypatch.delitem(sys.modules, _RMSPROP_MODULE)  # as in a fresh process (restored after the test)
    status, out, _ = _doctor(path, capsys)
    assert status == EXIT_HEALTHY and "Healthy" in out, out
    assert _RMSPROP_MODULE in sys.modules


def test_a_name_no_module_of_a_trusted_package_has_is_named(
    model_zip: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Promise: a class of a module SB3 does not have (stable_baselines3.no_such_module) is named as code, exit 1."""
    pickled = PROTO_2 + global_opcode("stable_baselines3.no_such_module", "Policy") + STOP
    path = rewrite_zip(model_zip, tmp_path / "missing.zip", data=lambda data: data | {"policy_class": serialized(pickled)})
    status, out, err = _doctor(path, capsys)
    assert status == EXIT_UNHEALTHY and err == ""
    assert 'data["policy_class"]: loading this file would run code from stable_baselines3.no_such_module.Policy' in out


@pytest.mark.parametrize(
    "module, name",
    [
        ("stable_baselines3.common.save_util", "save_to_zip_file"),  # a function of SB3, not a class: it writes files
        ("stable_baselines3.common.logger", "HumanOutputFormat"),  # a class of SB3 of no kind SB3 builds: opens files
        ("numpy", "memmap"),  # a numpy class that is no scalar type: it opens (creates) files
        ("torch", "load"),  # torch's top module: only dtypes and storage classes
    ],
)
def test_names_a_file_may_not_hold_are_named(
    module: str, name: str, model_zip: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """
    Promise: a file may name (for SB3 to call after loading, e.g. as its policy class) only classes of the kinds
    SB3 builds, numpy's scalar types, torch's dtypes and storages: any other name from SB3, numpy or torch, even
    unused while loading, is named as code (exit 1).
    """
    pickled = PROTO_2 + global_opcode(module, name) + STOP
    path = rewrite_zip(model_zip, tmp_path / "named.zip", data=lambda data: data | {"policy_class": serialized(pickled)})
    status, out, err = _doctor(path, capsys)
    assert status == EXIT_UNHEALTHY and err == ""
    assert f'data["policy_class"]: loading this file would run code from {module}.{name}' in out


@pytest.mark.parametrize("called", [False, True], ids=["named", "called"])
def test_a_class_a_file_may_name_may_not_be_called_while_loading(
    called: bool, model_zip: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """
    Promise: naming a policy class is allowed (SB3 builds it after loading, from its own arguments), calling it
    while loading, with arguments from the file, is not: the call is named as code (exit 1).
    """
    pickled = PROTO_2 + global_opcode("stable_baselines3.common.policies", "ActorCriticPolicy")
    pickled += (b")" + REDUCE if called else b"") + STOP  # EMPTY_TUPLE, REDUCE: ActorCriticPolicy()
    path = rewrite_zip(model_zip, tmp_path / "policy.zip", data=lambda data: data | {"policy_class": serialized(pickled)})
    status, out, _ = _doctor(path, capsys)
    assert status == (EXIT_UNHEALTHY if called else EXIT_HEALTHY), out
    finding = (
        'data["policy_class"]: loading this file would run code from stable_baselines3.common.policies.ActorCriticPolicy '
        "(the pickle calls it"
    )
    assert (finding in out) == called


def _assert_found_at_4_refused_deeper(result: tuple[int, str, str], levels: int, canary: Path) -> None:
    """Nested 4 deep: the payload is named (exit 1); deeper: the file is refused as too deep (exit 2); nothing ran."""
    status, out, err = result
    found = "would run code from builtins.eval" in out
    too_deep = "torch files nested more than 4 deep" in out + err
    expected = (EXIT_UNHEALTHY, True, False) if levels == 4 else (EXIT_UNREADABLE, False, True)
    assert (status, found, too_deep) == expected, out + err
    _assert_never_created(canary)
