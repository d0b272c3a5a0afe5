"""
``sb3_safe.load`` / ``load_vec_normalize`` / ``load_replay_buffer`` on files built to run code, from real saved files:
payloads (``os.system``, ``subprocess.Popen``, ``builtins.eval`` / ``exec`` / ``getattr`` / ``__import__``) in
``data``, ``policy.pth``, ``pytorch_variables.pth``, ``vecnormalize.pkl`` and a replay buffer, in every pickle
protocol; dangerous callables reached through allowed containers and reconstructors; truncated and malformed pickles.
Each is refused with :class:`~sb3_safe.RefusedFileError` naming the global, with no frame of the unpickler in the
error; the same payloads do run when loaded by SB3. That nothing runs is checked deterministically, with an audit hook
that records every process, code and import event while the file is loaded (none may occur), and the canary file.
"""

import collections
import functools
import io
import os
import pickle
import subprocess
import sys
import traceback
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import cloudpickle
import gymnasium as gym
import pytest
import torch as th
from stable_baselines3 import PPO, SAC
from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize
from zip_builders import (
    BUILD,
    EMPTY_DICT,
    PROTO_2,
    PROTO_4,
    REDUCE,
    SETITEM,
    STACK_GLOBAL,
    STOP,
    TUPLE1,
    TUPLE2,
    Reduce,
    global_opcode,
    rewrite_zip,
    serialized,
    shell_command,
    torch_bytes,
    touch_code,
    unicode,
)

import sb3_safe
from sb3_safe import RefusedFileError
from sb3_safe.doctor import diagnose

SYSTEM = f"{os.system.__module__}.system"  # posix.system: the name pickle stores for os.system

#: Audit events of running code: a process, code compiled or run, a module imported (a real load raises none)
_RUNNING = ("os.system", "subprocess.Popen", "os.posix_spawn", "os.exec", "os.fork", "os.spawn", "exec", "compile", "import")
_events: list[tuple[str, tuple[Any, ...]]] | None = None


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if _events is not None and (event in _RUNNING or event == "open"):
        _events.append((event, args))


@functools.cache
def _install_audit_hook() -> None:
    sys.addaudithook(_audit)  # hooks cannot be removed: this one records only inside _nothing_runs, once installed


@contextmanager
def _nothing_runs(canary: Path, opened: Path) -> Iterator[None]:
    """Inside: no process, no code run or compiled, no import, no file opened but ``opened``; and no canary after."""
    global _events
    _install_audit_hook()
    _events = []
    try:
        yield
    finally:
        events, _events = _events, None
    running = [event for event, _ in events if event != "open"]
    files = {Path(args[0]).resolve() for event, args in events if event == "open" and isinstance(args[0], str | Path)}
    assert running == [] and files <= {opened.resolve()}, (running, files)
    assert not canary.exists()


def _refused(load: Callable[[], Any], canary: Path, opened: Path) -> RefusedFileError:
    """The error ``load`` raises, checked to be one line, free of the unpickler's frames, with nothing run."""
    with _nothing_runs(canary, opened), pytest.raises(RefusedFileError) as caught:
        load()
    error = caught.value
    message = str(error)
    assert "\n" not in message and message.endswith(f"inspect it with: sb3-safe doctor {error.path}")
    assert error.__cause__ is None and (error.__context__ is None or error.__suppress_context__)
    frames = {Path(frame.filename).name for frame in traceback.extract_tb(error.__traceback__)}
    assert not frames & {"unpickler.py", "pickle.py", "serialization.py", "_weights_only_unpickler.py"}, frames
    return error


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A real model zip, its VecNormalize statistics and a SAC replay buffer."""
    folder = tmp_path_factory.mktemp("secure_load_hostile")
    model = PPO("MlpPolicy", "Pendulum-v1", n_steps=16, batch_size=16, n_epochs=1, policy_kwargs=dict(net_arch=[8]))
    model.learn(16)
    model.save(folder / "model.zip")
    env = VecNormalize(DummyVecEnv([lambda: gym.make("Pendulum-v1")]))
    env.reset()
    env.save(folder / "vecnormalize.pkl")
    sac = SAC("MlpPolicy", "Pendulum-v1", learning_starts=8, buffer_size=32, batch_size=8, policy_kwargs=dict(net_arch=[8]))
    sac.learn(16)
    sac.save_replay_buffer(folder / "buffer.pkl")
    return {"model": folder / "model.zip", "vecnormalize": folder / "vecnormalize.pkl", "buffer": folder / "buffer.pkl"}


@pytest.fixture(scope="module", autouse=True)
def _warm(saved: dict[str, Path]) -> None:
    """A first secure load of the real files: what loading imports on first use (zipfile's cp437 codec) is imported."""
    sb3_safe.load(PPO, saved["model"], device="cpu")
    sb3_safe.load_vec_normalize(saved["vecnormalize"], DummyVecEnv([lambda: gym.make("Pendulum-v1")]))


class _Callable(Reduce):
    """A Reduce that pickle accepts as the function of another (its result is called when loaded)."""

    def __call__(self, *args: Any) -> Any:
        raise AssertionError("never called: only pickled")


def _payload(kind: str, canary: Path) -> Reduce:
    """A pickled object that creates ``canary`` when loaded."""
    command = [sys.executable, "-c", touch_code(canary)]
    system = _Callable(getattr, _Callable(__import__, "os"), "system")
    return {
        "os.system": lambda: Reduce(os.system, shell_command(canary)),
        "subprocess.Popen": lambda: Reduce(subprocess.Popen, command),
        "builtins.eval": lambda: Reduce(eval, touch_code(canary)),
        "builtins.exec": lambda: Reduce(exec, touch_code(canary)),
        # getattr(__import__("os"), "system")(command): both named
        "builtins.getattr": lambda: Reduce(system, shell_command(canary)),
        "builtins.__import__": lambda: Reduce(system, shell_command(canary)),
    }[kind]()


PAYLOAD_GLOBALS = {
    "os.system": SYSTEM,
    "subprocess.Popen": "subprocess.Popen",
    "builtins.eval": "builtins.eval",
    "builtins.exec": "builtins.exec",
    "builtins.getattr": "builtins.getattr",
    "builtins.__import__": "builtins.__import__",
}
#: Where a payload goes in a model zip, and how the error names that place
ZIP_PLACES = {
    "data": 'data["lr_schedule"]',
    "policy.pth": "policy.pth",
    "pytorch_variables.pth": "pytorch_variables.pth (legacy format, pickle 4)",
}


def _trapped_zip(saved: dict[str, Path], target: Path, place: str, payload: Any, protocol: int = 4) -> Path:
    model = saved["model"]
    if place == "data":
        return rewrite_zip(
            model, target, data=lambda data: data | {"lr_schedule": serialized(pickle.dumps(payload, protocol))}
        )
    if place == "policy.pth":
        with zipfile.ZipFile(model) as archive:
            state_dict = th.load(archive.open("policy.pth"), weights_only=True)
        return rewrite_zip(model, target, replace={"policy.pth": torch_bytes(state_dict | {"extra": payload})})
    return rewrite_zip(model, target, replace={"pytorch_variables.pth": torch_bytes({"x": payload}, legacy=True)})


def _load_model(path: Path) -> Callable[[], Any]:
    return lambda: sb3_safe.load(PPO, path, device="cpu")


def _load_statistics(path: Path) -> Callable[[], Any]:
    return lambda: sb3_safe.load_vec_normalize(path, DummyVecEnv([lambda: gym.make("Pendulum-v1")]))


@pytest.mark.parametrize("place", [*ZIP_PLACES, "vecnormalize.pkl", "replay buffer"])
@pytest.mark.parametrize("kind", PAYLOAD_GLOBALS)
def test_payloads_are_refused_naming_the_global_and_nothing_runs(
    kind: str, place: str, saved: dict[str, Path], tmp_path: Path
) -> None:
    canary = tmp_path / "canary"
    payload = _payload(kind, canary)
    if place in ZIP_PLACES:
        path = _trapped_zip(saved, tmp_path / "trap.zip", place, payload)
        load, entry = _load_model(path), ZIP_PLACES[place]
    elif place == "vecnormalize.pkl":
        path = tmp_path / "vecnormalize.pkl"
        path.write_bytes(pickle.dumps(payload))
        load, entry = _load_statistics(path), "vecnormalize.pkl"
    else:
        path = tmp_path / "buffer.pkl"
        path.write_bytes(pickle.dumps(payload))
        sac = SAC("MlpPolicy", "Pendulum-v1", buffer_size=32, policy_kwargs=dict(net_arch=[8]))
        load, entry = (lambda: sb3_safe.load_replay_buffer(sac, path)), "buffer.pkl"
    error = _refused(load, canary, path)
    assert f"{PAYLOAD_GLOBALS[kind]} ({entry}: the pickle " in str(error)
    assert PAYLOAD_GLOBALS[kind] in {finding.target for finding in error.findings}
    assert str(error).startswith(f"{path}: refused: loading it would run code from ")


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_every_protocol(protocol: int, saved: dict[str, Path], tmp_path: Path) -> None:
    canary = tmp_path / "canary"
    payload = _payload("os.system", canary)
    path = _trapped_zip(saved, tmp_path / "trap.zip", "data", payload, protocol)
    assert f'{SYSTEM} (data["lr_schedule"]: the pickle calls it)' in str(_refused(_load_model(path), canary, path))
    statistics = tmp_path / "vecnormalize.pkl"
    statistics.write_bytes(pickle.dumps(payload, protocol))
    assert f"{SYSTEM} (vecnormalize.pkl: the pickle calls it)" in str(
        _refused(_load_statistics(statistics), canary, statistics)
    )


def test_the_payloads_are_live(saved: dict[str, Path], tmp_path: Path) -> None:
    """The same files run their payload when SB3 loads them (.pth: when torch loads them without weights_only)."""
    canary = tmp_path / "canary"
    for kind in PAYLOAD_GLOBALS:
        if kind == "subprocess.Popen":
            continue  # the child would create the canary after a while: the others show the traps are live
        with suppress(Exception):  # the payload replaced the schedule: load may fail after running it
            PPO.load(_trapped_zip(saved, tmp_path / "trap.zip", "data", _payload(kind, canary)), device="cpu")
        assert canary.exists(), kind
        canary.unlink()
    trap = _trapped_zip(saved, tmp_path / "trap.zip", "policy.pth", _payload("builtins.exec", canary))
    with zipfile.ZipFile(trap) as archive:
        th.load(archive.open("policy.pth"), weights_only=False)
    assert canary.exists()
    canary.unlink()
    (tmp_path / "vecnormalize.pkl").write_bytes(pickle.dumps(_payload("builtins.eval", canary)))
    with suppress(Exception):
        VecNormalize.load(str(tmp_path / "vecnormalize.pkl"), DummyVecEnv([lambda: gym.make("Pendulum-v1")]))
    assert canary.exists()


def _statistics_with(saved: dict[str, Path], payload: Any) -> bytes:
    """The real VecNormalize statistics, with ``payload`` as their obs_rms (a pickle of SB3's own classes)."""
    statistics = VecNormalize.load(str(saved["vecnormalize"]), DummyVecEnv([lambda: gym.make("Pendulum-v1")]))
    statistics.obs_rms = payload
    return pickle.dumps(statistics)


def _crafted(canary: Path) -> dict[str, tuple[bytes, str, bool]]:
    """
    Pickles that reach a dangerous callable through allowed globals, each as (pickle, the global the error must
    name, whether unpickling it creates the canary).
    """
    command = unicode(shell_command(canary))
    system = SYSTEM.split(".")
    load_from_bytes = unicode("torch.storage") + unicode("_load_from_bytes") + STACK_GLOBAL
    ordered_dict = unicode("collections") + unicode("OrderedDict") + STACK_GLOBAL + b")" + REDUCE  # OrderedDict()
    nested = torch_bytes(Reduce(os.system, shell_command(canary)), legacy=True)
    return {
        "functools.partial(os.system, ...)": (
            pickle.dumps(Reduce(functools.partial(os.system, shell_command(canary)))),
            "functools.partial",
            True,
        ),
        # OrderedDict() given the attribute append = _load_from_bytes, then APPEND of a torch file: the unpickler
        # calls the object's append (only allowed globals are named)
        "OrderedDict append attribute": (
            PROTO_4 + ordered_dict + EMPTY_DICT + unicode("append") + load_from_bytes + SETITEM + BUILD
            + unicode_bytes(nested) + b"a" + STOP,
            "attribute append",
            True,
        ),
        # the same through __setstate__: the unpickler calls the object's __setstate__ with the next BUILD's state
        "OrderedDict __setstate__ attribute": (
            PROTO_4 + ordered_dict + EMPTY_DICT + unicode("__setstate__") + load_from_bytes + SETITEM + BUILD
            + unicode_bytes(nested) + BUILD + STOP,
            "attribute __setstate__",
            True,
        ),
        # an OrderedDict (as state dicts are saved) whose value is built by a call
        "OrderedDict holding a call": (
            pickle.dumps(collections.OrderedDict(weight=Reduce(os.system, shell_command(canary)))),
            SYSTEM,
            True,
        ),
        # OrderedDict called with a callable it would iterate: the global is named
        "OrderedDict REDUCE given os.system": (
            PROTO_4 + unicode("collections") + unicode("OrderedDict") + STACK_GLOBAL
            + unicode(system[0]) + unicode(system[1]) + STACK_GLOBAL + TUPLE1 + REDUCE + STOP,
            SYSTEM,
            False,
        ),
        # torch's rebuild of a tensor subclass calls the function and class it is given
        "torch rebuild given os.system": (
            pickle.dumps(Reduce(th._tensor._rebuild_from_type_v2, os.system, th.Tensor, (shell_command(canary),), {})),
            "torch._tensor._rebuild_from_type_v2",
            True,
        ),
        # an allowed torch rebuild function handed a foreign class (as its backward hooks)
        "torch parameter rebuild given a foreign class": (
            pickle.dumps(Reduce(th._utils._rebuild_parameter, th.zeros(1), False, {"hook": subprocess.Popen})),
            "subprocess.Popen",
            False,
        ),
        # numpy's reconstructor, which builds the class it is given
        "numpy reconstructor given a foreign class": (
            PROTO_2 + global_opcode("numpy._core.multiarray", "_reconstruct") + global_opcode("subprocess", "Popen")
            + command + TUPLE2 + REDUCE + STOP,
            "subprocess.Popen",
            False,  # numpy checks that the class is an ndarray's before building it
        ),
        # torch.load(weights_only=False) of bytes in the pickle: what those bytes hold is named
        "a torch file in bytes": (pickle.dumps(Reduce(th.storage._load_from_bytes, nested)), SYSTEM, True),
    }  # fmt: skip


def unicode_bytes(raw: bytes) -> bytes:
    """SHORT_BINBYTES or BINBYTES of ``raw``."""
    return b"C" + bytes([len(raw)]) + raw if len(raw) < 256 else b"B" + len(raw).to_bytes(4, "little") + raw


CRAFTED = [
    "functools.partial(os.system, ...)",
    "OrderedDict append attribute",
    "OrderedDict __setstate__ attribute",
    "OrderedDict holding a call",
    "OrderedDict REDUCE given os.system",
    "torch rebuild given os.system",
    "torch parameter rebuild given a foreign class",
    "numpy reconstructor given a foreign class",
    "a torch file in bytes",
]


@pytest.mark.parametrize("case", CRAFTED)
def test_dangerous_callables_through_allowed_globals(case: str, saved: dict[str, Path], tmp_path: Path) -> None:
    canary = tmp_path / "canary"
    pickled, named, live = _crafted(canary)[case]
    path = rewrite_zip(saved["model"], tmp_path / "trap.zip", data=lambda data: data | {"lr_schedule": serialized(pickled)})
    error = _refused(_load_model(path), canary, path)
    assert f"{named} (" in str(error) and 'data["lr_schedule"]' in str(error)
    # doctor names the same global
    assert named in {finding.target for finding in diagnose(path).unsafe}
    statistics = tmp_path / "vecnormalize.pkl"
    statistics.write_bytes(pickled)
    assert f"{named} (" in str(_refused(_load_statistics(statistics), canary, statistics))
    if live:  # the same bytes do run when unpickled
        with suppress(Exception):
            pickle.loads(pickled)
        assert canary.exists()


def test_payload_inside_real_statistics(saved: dict[str, Path], tmp_path: Path) -> None:
    canary = tmp_path / "canary"
    path = tmp_path / "vecnormalize.pkl"
    path.write_bytes(_statistics_with(saved, _payload("builtins.eval", canary)))
    error = _refused(_load_statistics(path), canary, path)
    assert "builtins.eval (vecnormalize.pkl: the pickle calls it)" in str(error)


def test_statistics_that_are_not_statistics(saved: dict[str, Path], tmp_path: Path) -> None:
    path = tmp_path / "vecnormalize.pkl"
    path.write_bytes(pickle.dumps(collections.OrderedDict(a=1)))
    error = _refused(_load_statistics(path), tmp_path / "canary", path)
    assert "vecnormalize.pkl: holds a OrderedDict, not VecNormalize statistics" in str(error)


def _truncated_pickle(data: dict[str, Any]) -> dict[str, Any]:
    return data | {"lr_schedule": serialized(pickle.dumps([1.0] * 9)[:12])}


#: (how to build it from the saved files and a target path, what the one line must say)
MALFORMED: dict[str, tuple[Callable[[dict[str, Path], Path], Path], str]] = {
    "a truncated pickle in data": (
        lambda saved, dst: rewrite_zip(saved["model"], dst, data=_truncated_pickle),
        'data["lr_schedule"]: not a valid pickle',
    ),
    "a pickle without STOP in data": (
        lambda saved, dst: rewrite_zip(saved["model"], dst, data=lambda d: d | {"lr_schedule": serialized(PROTO_4 + b"N")}),
        'data["lr_schedule"]: not a valid pickle (pickle exhausted before seeing STOP)',
    ),
    "a stack underflow in data": (
        lambda saved, dst: rewrite_zip(
            saved["model"], dst, data=lambda d: d | {"lr_schedule": serialized(PROTO_4 + REDUCE + STOP)}
        ),
        'data["lr_schedule"]: not a valid pickle (stack underflow',
    ),
    "serialized not base64 text": (
        lambda saved, dst: rewrite_zip(saved["model"], dst, data=lambda d: d | {"policy_class": {":serialized:": [1]}}),
        "data[\"policy_class\"]: ':serialized:' is a list, expected base64 text",
    ),
    "data not JSON": (lambda saved, dst: rewrite_zip(saved["model"], dst, data=lambda _: b"{policy"), "data: expected JSON"),
    "policy.pth not a torch file": (
        lambda saved, dst: rewrite_zip(saved["model"], dst, replace={"policy.pth": b"\x00garbage"}),
        "policy.pth: not a torch file",
    ),
    "policy.pth truncated": (
        lambda saved, dst: rewrite_zip(
            saved["model"], dst, replace={"policy.pth": zipfile.ZipFile(saved["model"]).read("policy.pth")[:300]}
        ),
        "policy.pth: ",
    ),
    "truncated zip": (
        lambda saved, dst: dst.write_bytes(saved["model"].read_bytes()[: saved["model"].stat().st_size // 2]) and dst,
        "a truncated or damaged zip archive",
    ),
    "not a zip": (lambda saved, dst: dst.write_bytes(b"\x89PNG not a zip") and dst, "not a zip archive"),
    "truncated statistics": (
        lambda saved, dst: dst.write_bytes(saved["vecnormalize"].read_bytes()[:100]) and dst,
        "not a valid pickle",
    ),
    "truncated replay buffer": (
        lambda saved, dst: dst.write_bytes(saved["buffer"].read_bytes()[:1000]) and dst,
        "not a valid pickle",
    ),
}


@pytest.mark.parametrize("case", MALFORMED)
def test_malformed_files_are_refused_in_one_line(case: str, saved: dict[str, Path], tmp_path: Path) -> None:
    build, expected = MALFORMED[case]
    path = build(saved, tmp_path / ("bad.pkl" if "statistics" in case or "buffer" in case else "bad.zip"))
    if "statistics" in case:
        load = _load_statistics(path)
    elif "buffer" in case:
        sac = SAC("MlpPolicy", "Pendulum-v1", buffer_size=32, policy_kwargs=dict(net_arch=[8]))
        load = lambda: sb3_safe.load_replay_buffer(sac, path)  # noqa: E731
    else:
        load = _load_model(path)
    error = _refused(load, tmp_path / "canary", path)
    assert expected in str(error), str(error)


def test_every_data_item_is_named(saved: dict[str, Path], tmp_path: Path) -> None:
    """Every pickled item of data calls os.system: each is named in the one line, none is unpickled."""
    canary = tmp_path / "canary"
    trap = serialized(pickle.dumps(_payload("os.system", canary)))
    path = rewrite_zip(saved["model"], tmp_path / "trap.zip", data=lambda data: {
        key: trap if isinstance(item, dict) and ":serialized:" in item else item for key, item in data.items()
    })  # fmt: skip
    error = _refused(_load_model(path), canary, path)
    assert len(error.findings) >= 10 and str(error).count(f"{SYSTEM} (data[") == len(error.findings)


def test_a_class_of_your_own_is_trusted_by_module(saved: dict[str, Path], tmp_path: Path) -> None:
    """A class the user's module defines: refused with the way to trust it; loaded with trust= (as doctor --trust)."""
    module = tmp_path / "my_extractors.py"
    module.write_text(
        "from stable_baselines3.common.torch_layers import FlattenExtractor\n\n"
        "class MyExtractor(FlattenExtractor):\n    pass\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        from my_extractors import MyExtractor  # type: ignore[import-not-found]

        model = PPO(
            "MlpPolicy", "Pendulum-v1", n_steps=16, batch_size=16, policy_kwargs=dict(features_extractor_class=MyExtractor)
        )
        model.save(tmp_path / "own.zip")
        error = _refused(lambda: sb3_safe.load(PPO, tmp_path / "own.zip"), tmp_path / "canary", tmp_path / "own.zip")
        assert 'my_extractors.MyExtractor (data["policy_kwargs"]: the pickle imports it, for SB3 to call)' in str(error)
        assert "a class of your own: trust its module (trust=, sb3-safe's --trust MODULE)" in str(error)
        loaded = sb3_safe.load(PPO, tmp_path / "own.zip", trust=("my_extractors",))
        assert type(loaded.policy.features_extractor) is MyExtractor
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("my_extractors", None)


def test_a_stored_function_names_the_custom_objects(tmp_path: Path) -> None:
    model = PPO("MlpPolicy", "Pendulum-v1", learning_rate=lambda progress: 3e-4 * progress, n_steps=16, batch_size=16)
    model.save(tmp_path / "lambda.zip")
    error = _refused(lambda: sb3_safe.load(PPO, tmp_path / "lambda.zip"), tmp_path / "canary", tmp_path / "lambda.zip")
    assert error.findings and error.stored_functions == ["learning_rate", "lr_schedule"]
    assert (
        'data["learning_rate"], data["lr_schedule"] hold functions stored with their code (lambdas or closures), '
        'which are not rebuilt: replace them with custom_objects={"learning_rate": ..., "lr_schedule": ...}'
    ) in str(error)
    assert "loading it would run code" not in str(error)
    loaded = sb3_safe.load(PPO, tmp_path / "lambda.zip", custom_objects={"learning_rate": 1e-4, "lr_schedule": None})
    assert loaded.learning_rate == 1e-4 and loaded.lr_schedule(1.0) == 1e-4  # _setup_model rebuilds the schedule


def test_a_stored_function_in_a_pickle_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "vecnormalize.pkl"
    path.write_bytes(cloudpickle.dumps(lambda: 0))
    error = _refused(_load_statistics(path), tmp_path / "canary", path)
    assert "(vecnormalize.pkl: a function pickled by value, its code stored in the file" in str(error)


def test_outside_the_secure_context_sb3_reads_as_ever(saved: dict[str, Path], tmp_path: Path) -> None:
    """The routing is per context: after a secure load, SB3's own load still runs what the file holds."""
    canary = tmp_path / "canary"
    path = _trapped_zip(saved, tmp_path / "trap.zip", "data", _payload("builtins.eval", canary))
    _refused(_load_model(path), canary, path)
    with suppress(Exception):
        PPO.load(path, device="cpu")
    assert canary.exists()


def test_a_load_defined_elsewhere_is_refused(saved: dict[str, Path]) -> None:
    class OwnLoad(PPO):
        @classmethod
        def load(cls, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
            raise AssertionError("never called")

    with pytest.raises(ValueError, match=r"OwnLoad\.load is defined in test_secure_load_hostile, not in SB3"):
        sb3_safe.load(OwnLoad, saved["model"])


def test_a_file_object_is_read_from_its_start(saved: dict[str, Path]) -> None:
    buffer = io.BytesIO(saved["model"].read_bytes())
    buffer.seek(0, io.SEEK_END)
    assert sb3_safe.load(PPO, buffer, device="cpu").num_timesteps == 16


def test_the_audit_check_sees_what_runs(tmp_path: Path) -> None:
    """The check of _refused fails when a process starts or code is compiled, before any canary exists."""
    for run in (
        lambda: subprocess.Popen([sys.executable, "-c", "pass"]).wait(),
        lambda: os.system("true"),
        lambda: eval("1 + 1"),
    ):
        with pytest.raises(AssertionError), _nothing_runs(tmp_path / "canary", tmp_path / "model.zip"):
            run()
