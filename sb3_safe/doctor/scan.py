"""
What a pickle would import and call when loaded, read from its opcodes without loading it (the approach of
picklescan and fickling).

:func:`scan_pickle` runs the pickle machine symbolically over ``pickletools.genops``: strings and globals are
tracked through the stack and the memo, so ``STACK_GLOBAL`` is resolved as the unpickler resolves it, and each
``REDUCE`` / ``NEWOBJ`` / ``OBJ`` / ``INST`` is known to call a named global (or something the pickle built, which
cannot be checked statically). Whether a global may be imported or called is :mod:`sb3_safe.doctor.allowlist`'s
decision. Nothing is imported, nothing is unpickled.
"""

import _compat_pickle
import pickletools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, Any, Protocol

_STRING_OPCODES = frozenset(
    {"STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE", "SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8"}
)
_BYTES_OPCODES = frozenset({"BINBYTES", "SHORT_BINBYTES", "BINBYTES8"})
#: Opcodes that push a number, a bool or None: a plain value, not an object built by a call
_CONSTANT_OPCODES = frozenset(
    {"INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4", "FLOAT", "BINFLOAT", "NONE", "NEWTRUE", "NEWFALSE"}
)
_GET_OPCODES = frozenset({"GET", "BINGET", "LONG_BINGET"})
_PUT_OPCODES = frozenset({"PUT", "BINPUT", "LONG_BINPUT"})
#: Opcodes that call a method of the object below the mark / the value: append, extend, __setitem__, add
_MUTATING_OPCODES = {"APPEND": 2, "APPENDS": None, "SETITEM": 3, "SETITEMS": None, "ADDITEMS": None}
#: Attributes the unpickler looks up on an object and calls: ``__setstate__`` (BUILD), ``append`` / ``extend``
#: (APPEND(S) on what is not a list), ``add`` (ADDITEMS on what is not a set). BUILD's state sets attributes on the
#: object it builds, so a dict with such a key can make loading call any global the pickle names, allowed or not
_CALLED_ATTRIBUTES = frozenset({"__setstate__", "append", "extend", "add"})
#: The items of a function's state that say where it was defined
_FUNCTION_NAMES = ("__module__", "__qualname__")


#: Most opcodes read from one pickle: a real one has at most a few million (torch's pickle of 100,000 tensors);
#: beyond, the scan stops and the file is not reported healthy
MAX_OPCODES = 10_000_000
#: Most values of a call's arguments searched for globals (a real call has a handful)
_MAX_ARGUMENT_VALUES = 10_000


def printable(text: str) -> str:
    """``text`` with control characters escaped: names from a file must not move the terminal's cursor or add lines."""
    return text if text.isprintable() else text.encode("unicode_escape").decode("ascii")


@dataclass(frozen=True)
class PickleGlobal:
    """
    A global a pickle names (``GLOBAL``, ``STACK_GLOBAL``, ``INST``): loading imports ``module`` and looks ``name`` up.

    :param module: the module the unpickler imports
    :param name: the attribute it looks up there (dots: an attribute path)
    """

    module: str
    name: str

    def __str__(self) -> str:
        return f"{self.module}.{self.name}"


class ScanRules(Protocol):
    """What a pickle may do with a global (:class:`sb3_safe.doctor.allowlist.Allowlist`)."""

    def may_reference(self, found: PickleGlobal) -> bool:
        """Whether loading may import and look up ``found`` (to hold it)."""

    def may_call(self, found: PickleGlobal) -> bool:
        """Whether loading may call ``found``."""

    def may_pass(self, callee: PickleGlobal, passed: PickleGlobal) -> bool:
        """Whether ``callee`` may be given ``passed`` as an argument (it may call it)."""

    def loads_bytes(self, found: PickleGlobal) -> bool:
        """Whether calling ``found`` loads its bytes argument as a torch file."""

    def describe(self, found: PickleGlobal) -> str | None:
        """What loading does with ``found``, where that says more than "the pickle calls it"; None otherwise."""


@dataclass(frozen=True)
class Finding:
    """
    Something a pickle would do on loading that an SB3 model file never needs.

    :param entry: where the pickle is, e.g. ``data["policy_class"]`` or ``policy.pth``
    :param target: what would run: ``module.name``, or a description when it has no static name
    :param detail: how: the pickle calls it, imports it, ...
    :param builds_code: whether the global builds a function from code stored in the file (cloudpickle)
    """

    entry: str
    target: str
    detail: str
    builds_code: bool = False

    def __post_init__(self) -> None:
        # The names come from the file
        for name in ("entry", "target", "detail"):
            object.__setattr__(self, name, printable(getattr(self, name)))

    def __str__(self) -> str:
        return f"{self.entry}: loading this file would run code from {self.target} ({self.detail})"


@dataclass
class PickleScan:
    """
    What :func:`scan_pickle` read from one pickle.

    :param entry: where the pickle is
    :param references: every global it names, in order of appearance (repeats removed)
    :param calls: the globals it calls (to build objects), in order (repeats removed)
    :param findings: what it would do that an SB3 file never needs
    :param nested: pickles carried inside it as bytes and loaded by a call (``torch.storage._load_from_bytes``),
        as (entry, bytes): to be scanned as torch files too
    :param error: why the opcodes stop being a valid pickle, if they do (the unpickler stops there too)
    :param function_names: the first ``__module__`` and ``__qualname__`` items of the pickle's dicts: where a
        function stored with its code says it was defined (cloudpickle's state of the function), as the file says
    """

    entry: str
    references: list[PickleGlobal] = field(default_factory=list)
    calls: list[PickleGlobal] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    nested: list[tuple[str, bytes]] = field(default_factory=list)
    error: str | None = None
    function_names: dict[str, str] = field(default_factory=dict)


class _Mark:
    """The unpickler's mark."""


class _Built:
    """An object the pickle built by a call (or a container): calling it is not statically checkable."""


class _Constant:
    """A number, a bool or None."""


_MARK = _Mark()
_BUILT = _Built()
_CONSTANT = _Constant()


class _MalformedPickle(Exception):
    """The opcodes are not a valid pickle from here on; the unpickler would raise here too."""


class _Machine:
    """The pickle machine's stack and memo, with only what the scan needs: strings, bytes, tuples, globals."""

    def __init__(self, scan: PickleScan, rules: ScanRules):
        self.scan = scan
        self.rules = rules
        self.stack: list[Any] = []
        self.memo: dict[int, Any] = {}
        #: the PROTO opcode's protocol: below 3 the unpickler maps Python 2 names (``__builtin__``) to Python 3's
        self.protocol = 0

    def pop(self) -> Any:
        if not self.stack:
            raise _MalformedPickle("stack underflow")
        return self.stack.pop()

    def pop_to_mark(self) -> list[Any]:
        items: list[Any] = []
        while True:
            item = self.pop()
            if item is _MARK:
                return items[::-1]
            items.append(item)

    def top(self) -> Any:
        if not self.stack:
            raise _MalformedPickle("stack underflow")
        return self.stack[-1]

    def name_global(self, module: Any, name: Any) -> Any:
        if not (isinstance(module, str) and isinstance(name, str)):
            # The unpickler requires both to be str: it raises, unless computed at load time by a call
            what = "module and name" if module is _BUILT or name is _BUILT else "a module or name that is not a string"
            self.flag("a STACK_GLOBAL that cannot be resolved statically", f"{what} computed while loading")
            return _BUILT
        if self.protocol < 3:
            if (module, name) in _compat_pickle.NAME_MAPPING:
                module, name = _compat_pickle.NAME_MAPPING[(module, name)]
            elif module in _compat_pickle.IMPORT_MAPPING:
                module = _compat_pickle.IMPORT_MAPPING[module]
        found = PickleGlobal(module, name)
        if found not in self.scan.references:
            self.scan.references.append(found)
        return found

    def call(self, callee: Any, args: Any) -> None:
        if not isinstance(callee, PickleGlobal):
            self.flag(_BUILT_CALL, "not a named global, cannot be checked statically")
            return
        if callee not in self.scan.calls:
            self.scan.calls.append(callee)
        for passed in _globals_in(args):
            if not self.rules.may_pass(callee, passed):
                self.flag(str(passed), f"the pickle passes it to {callee}, which calls it")
        if self.rules.loads_bytes(callee):
            if isinstance(args, tuple) and len(args) == 1 and isinstance(args[0], bytes):
                self.scan.nested.append((f"{self.scan.entry} > bytes loaded by {callee}", args[0]))
            else:
                self.flag(f"{callee} of data computed while loading", "cannot be checked statically")

    def mutate(self, target: Any) -> None:
        if isinstance(target, PickleGlobal):
            # APPEND / SETITEM / BUILD on a class or function: its methods run, its attributes change
            self.flag(str(target), "the pickle changes it (appends to it, sets items or attributes)")

    def read_items(self, items: list[Any]) -> None:
        """Check the keys of a dict's items; keep the names a stored function gives itself."""
        self.check_keys(items[0::2])
        for key, value in zip(items[0::2], items[1::2], strict=False):
            if key in _FUNCTION_NAMES and isinstance(value, str):
                self.scan.function_names.setdefault(key, printable(value))

    def check_keys(self, keys: list[Any]) -> None:
        """Flag dict keys that can set an attribute the unpickler calls (through BUILD's state)."""
        for key in keys:
            if isinstance(key, str) and (key in _CALLED_ATTRIBUTES or (key.startswith("__") and key.endswith("__"))):
                self.flag(f"attribute {key}", _ATTRIBUTE_KEY)
            elif key is _BUILT:  # a str subclass built by a call names attributes as a str does
                self.flag(_COMPUTED_KEY, "cannot be checked statically (it can name an attribute)")

    def global_findings(self) -> list[Finding]:
        """The globals loading may not import, or may import but not call (in order of appearance)."""
        findings = []
        for found in self.scan.references:
            called = found in self.scan.calls
            described = self.rules.describe(found)
            if not self.rules.may_reference(found):
                detail = described or ("the pickle calls it" if called else "the pickle imports it, for SB3 to call")
            elif called and not self.rules.may_call(found):
                # A class SB3 files name (policy_class, activation_fn, ...) but never build while loading
                detail = "the pickle calls it"
            else:
                continue
            findings.append(Finding(self.scan.entry, str(found), detail, builds_code=described is not None))
        return findings

    def flag(self, target: str, detail: str) -> None:
        finding = Finding(self.scan.entry, target, detail)
        if finding not in self.scan.findings:
            self.scan.findings.append(finding)

    def step(self, opcode: pickletools.OpcodeInfo, arg: Any) -> None:
        name = opcode.name
        if name in _STRING_OPCODES or name in _BYTES_OPCODES:
            self.stack.append(arg)
        elif name in _CONSTANT_OPCODES:
            self.stack.append(_CONSTANT)
        elif name in ("GLOBAL", "INST"):
            module, _, attribute = str(arg).partition(" ")
            found = self.name_global(module, attribute)
            if name == "INST":
                self.call(found, tuple(self.pop_to_mark()))
                self.stack.append(_BUILT)
            else:
                self.stack.append(found)
        elif name == "STACK_GLOBAL":
            attribute = self.pop()
            self.stack.append(self.name_global(self.pop(), attribute))
        elif name == "REDUCE" or name == "NEWOBJ":
            args = self.pop()
            self.call(self.pop(), args)
            self.stack.append(_BUILT)
        elif name == "NEWOBJ_EX":
            self.pop()  # kwargs
            args = self.pop()
            self.call(self.pop(), args)
            self.stack.append(_BUILT)
        elif name == "OBJ":
            items = self.pop_to_mark()
            if not items:
                raise _MalformedPickle("OBJ without a class")
            self.call(items[0], tuple(items[1:]))
            self.stack.append(_BUILT)
        elif name == "BUILD":
            self.pop()  # the state
            self.mutate(self.top())
        elif name in _MUTATING_OPCODES:
            depth = _MUTATING_OPCODES[name]
            items = self.pop_to_mark() if depth is None else [self.pop() for _ in range(depth - 1)][::-1]
            if name.startswith("SETITEM"):
                self.read_items(items)
            self.mutate(self.top())
        elif name == "DICT":
            self.read_items(self.pop_to_mark())
            self.stack.append(_BUILT)
        elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
            items = [self.pop() for _ in range(int(name[-1]))]
            self.stack.append(tuple(items[::-1]))
        elif name == "TUPLE":
            self.stack.append(tuple(self.pop_to_mark()))
        elif name == "EMPTY_TUPLE":
            self.stack.append(())
        elif name == "MEMOIZE":
            self.memo[len(self.memo)] = self.top()
        elif name in _PUT_OPCODES:
            self.memo[int(arg)] = self.top()
        elif name in _GET_OPCODES:
            if int(arg) not in self.memo:
                raise _MalformedPickle(f"memo key {arg} was never stored")
            self.stack.append(self.memo[int(arg)])
        elif name == "DUP":
            self.stack.append(self.top())
        elif name in ("EXT1", "EXT2", "EXT4"):
            # copyreg's extension registry maps the code to a global only the loading process knows
            self.flag(f"extension code {arg} (copyreg registry)", "a global that cannot be resolved statically")
            self.stack.append(_BUILT)
        elif name == "MARK":
            self.stack.append(_MARK)
        elif name == "PROTO":
            self.protocol = int(arg)
        else:
            self._generic(opcode)

    def _generic(self, opcode: pickletools.OpcodeInfo) -> None:
        before = opcode.stack_before
        if pickletools.markobject in before:
            self.pop_to_mark()
            for _ in range(before.index(pickletools.markobject)):
                self.pop()
        else:
            for _ in before:
                self.pop()
        self.stack.extend(_MARK if item is pickletools.markobject else _BUILT for item in opcode.stack_after)


def _globals_in(value: Any) -> Iterator[PickleGlobal]:
    """The globals in a call's arguments, in tuples too (without recursion: a pickle can nest tuples deeply)."""
    pending = [value]
    seen = 0
    while pending:
        item = pending.pop()
        seen += 1
        if seen > _MAX_ARGUMENT_VALUES:
            # A pickle can hand one huge tuple (from the memo) to each of many calls
            raise _MalformedPickle(f"a call with more than {_MAX_ARGUMENT_VALUES} argument values, not checked")
        if isinstance(item, PickleGlobal):
            yield item
        elif isinstance(item, tuple):
            pending.extend(item)


def scan_pickle(data: bytes | IO[bytes], entry: str, rules: ScanRules) -> PickleScan:
    """
    Read the globals a pickle would import and call, without loading it.

    :param data: the pickle, or a binary file positioned at its start (left just after its ``STOP``: torch's
        legacy format is several pickles in a row); what follows ``STOP`` is ignored, as the unpickler ignores it
    :param entry: where it is, for the findings (``data["policy_class"]``, ``policy.pth``)
    :param rules: what loading may do with each global
    :return: what it names, calls, and would do beyond an SB3 file's needs; ``error`` says where it stops being
        a pickle (what comes before still runs when loaded, so its findings stand)
    """
    scan = PickleScan(entry)
    machine = _Machine(scan, rules)
    stopped = False
    try:
        for count, (opcode, arg, position) in enumerate(pickletools.genops(data)):
            if count >= MAX_OPCODES:
                raise _MalformedPickle(f"more than {MAX_OPCODES} opcodes, beyond what doctor reads (from byte {position})")
            try:
                machine.step(opcode, arg)
            except _MalformedPickle as error:
                raise _MalformedPickle(f"{error} at byte {position} ({opcode.name})") from None
            if opcode.name == "STOP":
                stopped = True
    except _MalformedPickle as error:
        scan.error = str(error)
    except Exception as error:  # pickletools reports truncated or unknown opcodes as ValueError, others are rarer
        message = str(error).strip()
        scan.error = message.splitlines()[0] if message else type(error).__name__
    else:
        if not stopped:
            scan.error = "the pickle ends without STOP"
    scan.findings[:0] = machine.global_findings()
    scan.findings = _merge_code_findings(scan.findings)
    return scan


_BUILT_CALL = "an object the pickle builds and then calls"
_ATTRIBUTE_KEY = "a dict key BUILD's state can set on an object, which the unpickler may call"
_COMPUTED_KEY = "a dict key computed while loading"


def _merge_code_findings(findings: list[Finding]) -> list[Finding]:
    """
    One finding for a function pickled by value (cloudpickle's machinery names several globals and calls what it
    builds), with the findings that name anything else.
    """
    code = [finding for finding in findings if finding.builds_code]
    if not code:
        return findings
    # cloudpickle's globals, and the attributes of the function it builds (__globals__, __qualname__, ...)
    machinery = {
        finding.target for finding in findings if finding.target.startswith("cloudpickle.") or finding.detail == _ATTRIBUTE_KEY
    } | {_BUILT_CALL, _COMPUTED_KEY}
    return [code[0]] + [finding for finding in findings if finding not in code and finding.target not in machinery]
