"""
The grammar of :mod:`benchmarks.hostile`'s files: each drawn from a seed (:func:`hostile_file`), a real model file or
VecNormalize statistics with one part replaced by a generated pickle program over the allowlist and beyond it
(globals that may be called, only named, or never; containers, memo reuse, every calling opcode, BUILD states with
dunder keys, persistent ids, calls repeated on one shared argument, torch files nested through
``torch.storage._load_from_bytes``: honest, with a large deflated record, in the legacy format with a declared size),
or with its archive damaged (cut, bytes flipped, an entry inflating far beyond its compressed size, a directory that
lies, duplicate and ``../`` entries). Payloads create a canary file.
"""

import base64
import io
import json
import pickle
import random
import struct
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from benchmarks.zip_writer import zip_segments

# ---------------------------------------------------------------------------------------------------------------
# The grammar: pickle programs as expression trees, serialized opcode by opcode


#: Globals a program draws from: may be called, only named, or never (each payload creates the canary)
_CALLABLE = (
    ("collections", "OrderedDict"),
    ("collections", "deque"),
    ("builtins", "set"),
    ("builtins", "frozenset"),
    ("builtins", "complex"),
    ("builtins", "slice"),
    ("_codecs", "encode"),
    ("numpy", "dtype"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "scalar"),
    ("numpy._core.numeric", "_frombuffer"),
    ("torch._utils", "_rebuild_tensor_v2"),
    ("torch", "Size"),
    ("torch", "device"),
    ("torch.storage", "_load_from_bytes"),
    ("stable_baselines3.common.utils", "FloatSchedule"),
    ("stable_baselines3.common.type_aliases", "TrainFrequencyUnit"),
    ("stable_baselines3.common.noise", "VectorizedActionNoise"),
    ("stable_baselines3.common.noise", "NormalActionNoise"),
    ("stable_baselines3.common.running_mean_std", "RunningMeanStd"),
    ("stable_baselines3.common.buffers", "ReplayBuffer"),
    ("gymnasium.spaces.box", "Box"),
    ("gymnasium.spaces.discrete", "Discrete"),
    ("sb3_safe.common.schedules", "ScaledSchedule"),
)
_NAMED = (
    ("numpy", "ndarray"),
    ("numpy", "float32"),
    ("torch", "float32"),
    ("torch", "FloatStorage"),
    ("stable_baselines3.common.policies", "ActorCriticPolicy"),
    ("torch.nn.modules.activation", "Tanh"),
    ("torch.optim.adam", "Adam"),
)
_NEVER = (
    ("builtins", "eval"),
    ("builtins", "exec"),
    ("builtins", "getattr"),
    ("builtins", "open"),
    ("os", "system"),
    ("posix", "system"),
    ("subprocess", "Popen"),
    ("functools", "partial"),
    ("copyreg", "_reconstructor"),
    ("pickle", "loads"),
    ("torch", "load"),
    ("numpy", "load"),
    ("torch._utils", "_rebuild_device_tensor_from_numpy"),
    ("stable_baselines3.common.logger", "Logger"),
    ("__main__", "anything"),
    ("os.path", "os.system"),
)
#: Dict keys a BUILD state may set: dunders and the attributes the unpickler calls
_KEYS = ("a", "value", "__class__", "__setstate__", "__reduce__", "append", "extend", "add", "__dict__", "shape")


@dataclass
class _Program:
    """A pickle program being written: its bytes, its memo count, and the canary its payloads create."""

    rng: random.Random
    canary: str
    out: bytearray
    memo: int = 0
    depth: int = 0

    def op(self, raw: bytes) -> None:
        self.out += raw

    def memoize(self) -> int:
        self.op(b"\x94")
        self.memo += 1
        return self.memo - 1

    def string(self, text: str) -> None:
        raw = text.encode("utf-8", "surrogatepass")
        self.op(b"\x8c" + bytes([len(raw)]) + raw if len(raw) < 256 else b"X" + struct.pack("<I", len(raw)) + raw)

    def binbytes(self, raw: bytes) -> None:
        self.op(b"B" + struct.pack("<I", len(raw)) + raw if len(raw) >= 256 else b"C" + bytes([len(raw)]) + raw)

    def get(self, index: int) -> None:
        self.op(b"h" + bytes([index]) if index < 256 else b"j" + struct.pack("<I", index))

    def constant(self) -> None:
        kind = self.rng.randrange(8)
        if kind == 0:
            self.op(b"N")
        elif kind == 1:
            self.op(self.rng.choice((b"\x88", b"\x89")))
        elif kind == 2:
            self.op(b"K" + bytes([self.rng.randrange(256)]))
        elif kind == 3:
            value = self.rng.choice((0, 1, 2**31 - 1, -(2**31), self.rng.randrange(-(2**31), 2**31)))
            self.op(b"J" + struct.pack("<i", value))
        elif kind == 4:
            raw = self.rng.randrange(1, 2**62).to_bytes(8, "little", signed=False)
            self.op(b"\x8a" + bytes([len(raw)]) + raw)
        elif kind == 5:
            self.op(b"G" + struct.pack(">d", self.rng.choice((0.0, 1.5, float("nan"), float("inf"), 1e308))))
        elif kind == 6:
            self.string(self.rng.choice(("f4", "O8", "<f8", "V16", "cpu", "latin1", "utf-32", f"open({self.canary!r}, 'w')")))
        else:
            self.binbytes(self.rng.randbytes(self.rng.choice((0, 1, 8, 64))))

    def global_(self, kind: str | None = None) -> tuple[str, str]:
        kind = kind or self.rng.choices(("callable", "named", "never"), (6, 2, 2))[0]
        module, name = self.rng.choice({"callable": _CALLABLE, "named": _NAMED, "never": _NEVER}[kind])
        if self.rng.random() < 0.5:
            self.op(b"c" + module.encode() + b"\n" + name.encode() + b"\n")
        else:
            self.string(module)
            self.string(name)
            self.op(b"\x93")
        return module, name

    def payload(self) -> None:
        """A call that creates the canary if it runs."""
        module, name = self.rng.choice((("builtins", "eval"), ("builtins", "exec"), ("os", "system"), ("posix", "system")))
        self.op(b"c" + module.encode() + b"\n" + name.encode() + b"\n")
        code = f"open({self.canary!r}, 'w').close()" if module == "builtins" else f"touch {self.canary}"
        self.string(code)
        self.op(b"\x85R")  # TUPLE1 REDUCE

    def expression(self) -> None:
        """Push one value."""
        self.depth += 1
        choices = ["constant", "global", "tuple", "list", "dict", "set", "call", "build", "get", "payload", "persid"]
        weights = [6, 3, 4, 3, 3, 1, 6, 2, 3, 1, 0.3]
        if self.depth > 4:
            choices, weights = ["constant", "get"], [4, 1]
        kind = self.rng.choices(choices, weights)[0]
        if kind == "get" and self.memo == 0:
            kind = "constant"
        if kind == "constant":
            self.constant()
        elif kind == "global":
            self.global_()
        elif kind == "payload":
            self.payload()
        elif kind == "get":
            self.get(self.rng.randrange(self.memo))
        elif kind == "persid":
            self.expression()
            self.op(b"Q")
        elif kind == "tuple":
            size = self.rng.choice((0, 1, 2, 3, 5))
            self.op(b"(")
            for _ in range(size):
                self.expression()
            self.op(b"t")
        elif kind in ("list", "dict", "set"):
            self.op({"list": b"]", "dict": b"}", "set": b"\x8f"}[kind])
            self.memoize()
            self.op(b"(")
            for _ in range(self.rng.choice((0, 1, 2, 4))):
                if kind == "dict":
                    self.string(self.rng.choice(_KEYS)) if self.rng.random() < 0.7 else self.expression()
                self.expression()
            self.op({"list": b"e", "dict": b"u", "set": b"\x90"}[kind])
        elif kind == "call":
            self.call()
        else:  # build: an object, then a state dict set on it
            self.call()
            self.op(b"}(")
            for _ in range(self.rng.choice((1, 2))):
                self.string(self.rng.choice(_KEYS))
                self.expression()
            self.op(b"ub")
        if kind in ("tuple", "call", "build") and self.rng.random() < 0.5:
            self.memoize()
        self.depth -= 1

    def arguments(self) -> None:
        """A tuple of arguments, sometimes the shapes and sizes the allocating constructors take."""
        if self.rng.random() < 0.3:
            size = self.rng.choice((0, 1, 10**3, 10**6, 10**9, 2**40))
            self.op(b"(J" + struct.pack("<i", size) if size < 2**31 else b"(\x8a\x06" + size.to_bytes(6, "little"))
            self.op(b"\x85t")  # a shape (size,) in a tuple
            return
        self.op(b"(")
        for _ in range(self.rng.choice((0, 1, 2, 3))):
            self.expression()
        self.op(b"t")

    def call(self) -> None:
        """A call of a global (sometimes of what the pickle built) by one of the calling opcodes."""
        opcode = self.rng.choices(("REDUCE", "NEWOBJ", "NEWOBJ_EX", "OBJ", "INST"), (6, 3, 1, 1, 1))[0]
        if opcode == "INST":
            module, name = self.rng.choice(_CALLABLE + _NEVER)
            self.op(b"(")
            for _ in range(self.rng.choice((0, 1, 2))):
                self.expression()
            self.op(b"i" + module.encode() + b"\n" + name.encode() + b"\n")
            return
        if opcode == "OBJ":
            self.op(b"(")
            self.global_()
            for _ in range(self.rng.choice((0, 1, 2))):
                self.expression()
            self.op(b"o")
            return
        self.global_() if self.rng.random() < 0.9 else self.expression()
        self.arguments()
        if opcode == "NEWOBJ_EX":
            self.op(b"}")
        self.op({"REDUCE": b"R", "NEWOBJ": b"\x81", "NEWOBJ_EX": b"\x92"}[opcode])

    def repeated_calls(self) -> None:
        """One shared argument (a long list, or a list of a shared list) handed to many calls: amplification."""
        self.global_("callable")
        callee = self.memoize()
        self.op(b"]")
        self.memoize()
        self.op(b"(")
        width = self.rng.choice((10, 1000, 30_000))
        self.op(b"N" * width)
        self.op(b"e")
        inner = self.memo - 1
        self.op(
            b"]("
            + (b"h" + bytes([inner]) if inner < 256 else b"j" + struct.pack("<I", inner)) * self.rng.choice((1, 100, 1000))
            + b"e"
        )
        argument = self.memoize()
        for _ in range(self.rng.choice((2, 40, 400, 4000))):
            self.get(callee)
            self.get(argument)
            self.op(b"\x85R0")  # TUPLE1 REDUCE POP
        self.op(b"N")

    def nested_torch(self, torch_file: bytes, times: int) -> None:
        """``torch.storage._load_from_bytes`` of a torch file, ``times`` times on one memoized bytes object."""
        self.op(b"ctorch.storage\n_load_from_bytes\n")
        callee = self.memoize()
        self.binbytes(torch_file)
        data = self.memoize()
        self.op(b"0")
        for _ in range(times):
            self.get(callee)
            self.get(data)
            self.op(b"\x85R0")
        self.op(b"N")


def pickle_program(rng: random.Random, canary: str, torch_file: bytes | None = None) -> bytes:
    """A generated pickle (protocol 4): statements, each value popped but the last."""
    program = _Program(rng, canary, bytearray(b"\x80\x04"))
    shape = rng.choices(("expressions", "repeated", "nested"), (8, 1, 1 if torch_file is not None else 0))[0]
    if shape == "repeated":
        program.repeated_calls()
    elif shape == "nested":
        assert torch_file is not None
        program.nested_torch(torch_file, rng.choice((1, 2, 8, 64)))
    else:
        for _ in range(rng.choice((1, 1, 2, 3))):
            program.expression()
            program.op(b"0")
        program.expression()
    return bytes(program.out) + b"."


# ---------------------------------------------------------------------------------------------------------------
# Torch files and archives


def _zip(entries: list[tuple[str, bytes, bool]], declared: dict[str, int] | None = None) -> bytes:
    """A zip of (name, content, deflated), with uncompressed sizes declared as ``declared`` says."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, content, deflated in entries:
            archive.writestr(name, content, zipfile.ZIP_DEFLATED if deflated else zipfile.ZIP_STORED)
    raw = bytearray(buffer.getvalue())
    for name, size in (declared or {}).items():
        for record in _records(bytes(raw), name):
            raw[record + 24 : record + 28] = struct.pack("<L", size)  # the central directory's uncompressed size
    return bytes(raw)


def _records(raw: bytes, name: str) -> Iterator[int]:
    position = raw.find(b"PK\x01\x02")
    while position >= 0:
        length = struct.unpack_from("<H", raw, position + 28)[0]
        if raw[position + 46 : position + 46 + length] == name.encode():
            yield position
        position = raw.find(b"PK\x01\x02", position + 4)


def _zip_with_zeros(entries: list[tuple[str, bytes]], zeros_name: str, zeros: int) -> bytes:
    """A zip of stored entries and one entry of ``zeros`` zero bytes, deflated (never held inflated)."""
    segments = zip_segments([*((name, False, [content]) for name, content in entries), (zeros_name, True, [zeros])])
    return b"".join(segment for segment in segments if isinstance(segment, bytes))


def _torch_pickle(numel: int) -> bytes:
    """torch's data.pkl for ``{"weight": a float32 tensor of numel values}`` (storage key "0")."""
    return (
        b"\x80\x02}q\x00X\x06\x00\x00\x00weightq\x01ctorch._utils\n_rebuild_tensor_v2\nq\x02((X\x07\x00\x00\x00storageq\x03"
        b"ctorch\nFloatStorage\nq\x04X\x01\x00\x00\x000q\x05X\x03\x00\x00\x00cpuq\x06J"
        + struct.pack("<i", numel)
        + b"tq\x07QK\x00J"
        + struct.pack("<i", numel)
        + b"\x85q\x08K\x01\x85q\tccollections\nOrderedDict\nq\n)Rq\x0btq\x0cRq\rs."
    )


def torch_file(rng: random.Random, canary: str) -> bytes:
    """A torch file: honest, a record inflating to hundreds of MiB, legacy with a declared size, or a program."""
    kind = rng.choice(("honest", "zeros", "legacy", "program"))
    records = [("archive/byteorder", b"little"), ("archive/version", b"3\n")]
    if kind == "honest":
        return _zip(
            [
                ("archive/data.pkl", _torch_pickle(4), False),
                *((n, c, False) for n, c in records),
                ("archive/data/0", bytes(16), False),
            ]
        )
    if kind == "zeros":
        numel = rng.choice((2**20, 2**26, 2**27, 2**28 - 2**20)) // 4
        return _zip_with_zeros([("archive/data.pkl", _torch_pickle(numel)), *records], "archive/data/0", numel * 4)
    if kind == "legacy":
        buffer = io.BytesIO()
        for value in (
            0x1950A86A20F9469CFC6C,
            1001,
            {"protocol_version": 1001, "little_endian": True, "type_sizes": {"short": 2, "int": 4, "long": 4}},
        ):
            pickle.dump(value, buffer, protocol=2)
        numel = rng.choice((4, 2**20, 2**28, 2**31 - 1))
        buffer.write(
            b"\x80\x02}X\x01\x00\x00\x00wctorch._utils\n_rebuild_tensor_v2\n((X\x07\x00\x00\x00storagectorch\nFloatStorage\n"
            b"X\x01\x00\x00\x000X\x03\x00\x00\x00cpuJ"
            + struct.pack("<i", numel)
            + b"NtQK\x00K\x04\x85K\x01\x85\x89ccollections\nOrderedDict\n)RtRs."
        )
        pickle.dump(["0"], buffer, protocol=2)
        buffer.write(struct.pack("<q", 4) + bytes(16))
        return buffer.getvalue()
    return _zip([("archive/data.pkl", pickle_program(rng, canary), False), *((n, c, False) for n, c in records)])


# ---------------------------------------------------------------------------------------------------------------
# Files


#: What a file changes in a real one, with its weight: a pickle program as a new or an existing item of ``data``, as
#: ``policy.pth`` (a torch file) or ``pytorch_variables.pth`` (legacy format), VecNormalize statistics; or the archive
KINDS = {
    "data item": 5,
    "data item replaced": 2,
    "policy.pth": 2,
    "variables legacy": 1,
    "statistics": 2,
    "archive": 2,
    "run folder yaml": 2,
}


@dataclass(frozen=True)
class HostileFile:
    """A generated file: where it is, how it was made, and the loader that reads it (``model`` or ``statistics``)."""

    path: Path
    kind: str
    reader: str


def _serialized(pickled: bytes) -> dict[str, str]:
    return {":type:": "<class 'object'>", ":serialized:": base64.b64encode(pickled).decode()}


def _rewrite(source: Path, target: Path, replace: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(source) as original, zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as copy:
        for name in original.namelist():
            copy.writestr(name, replace.pop(name, None) or original.read(name))
        for name, content in replace.items():
            copy.writestr(name, content)
    return target


def hostile_file(seed: int, bases: dict[str, Path], folder: Path, canary: str) -> HostileFile:
    """
    The file of ``seed``.

    :param bases: the real files to start from: ``model`` (a model zip), ``statistics`` (vecnormalize.pkl)
    :param folder: where to write it
    :param canary: the path every payload creates
    """
    rng = random.Random(seed)
    kind = rng.choices(list(KINDS), list(KINDS.values()))[0]
    target = folder / f"{seed}.{'pkl' if kind == 'statistics' else 'zip'}"
    model = bases["model"]
    if kind == "run folder yaml":
        folder_of_run = folder / f"{seed}-run"
        folder_of_run.mkdir()
        (folder_of_run / rng.choice(("config.yml", "args.yml"))).write_text(run_folder_yaml(rng, canary))
        return HostileFile(folder_of_run, kind, "run folder")
    if kind == "statistics":
        target.write_bytes(pickle_program(rng, canary, torch_file(rng, canary)))
        return HostileFile(target, kind, "statistics")
    if kind.startswith("data item"):
        with zipfile.ZipFile(model) as archive:
            data = json.loads(archive.read("data"))
        key = (
            rng.choice([key for key, item in data.items() if isinstance(item, dict) and ":serialized:" in item])
            if kind.endswith("replaced")
            else "_hostile"
        )
        data[key] = _serialized(pickle_program(rng, canary, torch_file(rng, canary)))
        _rewrite(model, target, {"data": json.dumps(data).encode()})
    elif kind == "policy.pth":
        _rewrite(model, target, {"policy.pth": torch_file(rng, canary)})
    elif kind == "variables legacy":
        _rewrite(model, target, {"pytorch_variables.pth": torch_file(rng, canary)})
    else:
        target.write_bytes(_damaged(rng, model.read_bytes()))
    return HostileFile(target, kind, "model")


#: YAML tags that build Python objects, and targets that run code (rl-zoo writes only its OrderedDict tag)
_YAML_TAGS = ("!!python/object/apply:", "!!python/object/new:", "!!python/object:", "!!python/name:", "!!python/module:")
_YAML_TARGETS = ("os.system", "subprocess.Popen", "builtins.eval", "builtins.exec", "posix.system", "builtins.open")


def _yaml_value(rng: random.Random, canary: str, depth: int = 0) -> str:
    """A YAML flow value: plain, rl-zoo's OrderedDict of pairs, a Python tag calling a target, a list or a mapping."""
    kind = rng.choices(("plain", "ordered", "tag", "list", "mapping"), (4, 2, 3, 1, 1) if depth < 3 else (1, 0, 1, 0, 0))[0]
    if kind == "plain":
        return rng.choice(("1", "0.99", "true", "null", "'CartPole-v1'", "[64, 64]", "'nn.ReLU'"))
    if kind == "tag":
        target = rng.choice(_YAML_TARGETS)
        return f"{rng.choice(_YAML_TAGS)}{target} [{json.dumps(f'touch {canary}')}]"
    items = [_yaml_value(rng, canary, depth + 1) for _ in range(rng.choice((1, 2, 3)))]
    if kind == "ordered":
        return (
            "!!python/object/apply:collections.OrderedDict [[" + ", ".join(f"[k{i}, {v}]" for i, v in enumerate(items)) + "]]"
        )
    if kind == "list":
        return "[" + ", ".join(items) + "]"
    return "{" + ", ".join(f"k{i}: {v}" for i, v in enumerate(items)) + "}"


def run_folder_yaml(rng: random.Random, canary: str) -> str:
    """A ``config.yml`` or ``args.yml``: hyperparameters with hostile values, ``normalize`` code, or an alias bomb."""
    shape = rng.choice(("fields", "normalize", "bomb", "wrapper"))
    if shape == "bomb":
        levels, width = rng.choice((3, 6, 9, 12)), rng.choice((2, 9, 30))
        lines = ["a0: &a0 [x]"] + [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]" for i in range(1, levels)]
        return "\n".join(lines) + "\n"
    if shape == "normalize":
        code = rng.choice(
            (
                f"__import__('os').system('touch {canary}') or dict(norm_obs=False)",
                "dict(norm_obs=True, gamma=0.99)",
                "open('x').read()",
                "(lambda: 1)()",
                "[x for x in ()]",
                "dict(**{'norm_obs': True})",
                "True",
            )
        )
        return f"!!python/object/apply:collections.OrderedDict\n- - - normalize\n    - {json.dumps(code)}\n"
    if shape == "wrapper":
        name = rng.choice(("os.system", "gymnasium.wrappers.TimeLimit", "builtins.eval", "sb3_safe.nothing"))
        return f"env_wrapper: {rng.choice(('', '!!python/name:'))}{name}\nn_timesteps: 1000\n"
    return "\n".join(f"key{i}: {_yaml_value(rng, canary)}" for i in range(rng.choice((1, 3, 6)))) + "\n"


def _damaged(rng: random.Random, raw: bytes) -> bytes:
    """The model zip with its archive damaged."""
    how = rng.choice(("cut", "flip", "bomb", "lying size", "duplicate", "dot dot"))
    if how == "cut":
        return raw[: rng.randrange(len(raw))]
    if how == "flip":
        damaged = bytearray(raw)
        for _ in range(rng.choice((1, 4, 32))):
            damaged[rng.randrange(len(damaged))] ^= 1 << rng.randrange(8)
        return bytes(damaged)
    with zipfile.ZipFile(io.BytesIO(raw)) as archive:
        entries = [(name, archive.read(name)) for name in archive.namelist()]
    if how == "bomb":
        kept = [(name, content) for name, content in entries if name != "policy.pth"]
        return _zip_with_zeros(
            kept, rng.choice(("policy.pth", "data", "extra.pth")), rng.choice((2**20, 2**28, 2**29 + 1, 2**31))
        )
    if how == "lying size":
        return _zip([(name, content, True) for name, content in entries], {rng.choice(entries)[0]: rng.choice((0, 1, 2**31))})
    if how == "duplicate":
        name, content = rng.choice(entries)
        return _zip([*((n, c, True) for n, c in entries), (name, content[::-1], True)])
    return _zip([*((n, c, True) for n, c in entries), ("../" * rng.randrange(1, 4) + "policy.pth", b"x", False)])
