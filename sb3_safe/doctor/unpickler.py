"""
An unpickler that resolves only the globals of :class:`~sb3_safe.doctor.allowlist.Allowlist` and calls only those it
may call (Python's docs, "Restricting Globals", carried from ``find_class`` to every opcode that calls code).

Before a pickle gets here, :func:`~sb3_safe.doctor.scan.scan_pickle` has read it without running it and found nothing
to refuse; this unpickler does not rely on that reading and enforces the same rules on the objects themselves:

- ``GLOBAL`` / ``STACK_GLOBAL`` / ``INST`` resolve a name only if the allowlist lets a file name it;
- ``REDUCE`` / ``NEWOBJ`` / ``NEWOBJ_EX`` / ``OBJ`` / ``INST`` call only a resolved global the allowlist lets a file call
  (never an object the pickle built), and only with the globals that callee may be given; ``REDUCE`` / ``OBJ`` /
  ``INST`` (which run the callee with arguments, not only its ``__new__``) only a function, a builtin type or an enum;
  numpy's reconstructor only for an empty array;
- the calls and the values searched in their arguments are charged to a
  :class:`~sb3_safe.doctor.budget.ReadingBudget` (each object once per call), as the scan charges them;
- ``BUILD`` never changes a resolved global (a class or a function) and looks ``__setstate__`` up on the object's
  class, not on the object (whose attributes the pickle sets); other state is set as a plain dict, without dunder
  names (``__class__``); an array's state must hold as many values as its shape (numpy reads the objects of an
  object array past the end of a shorter list, and crashes);
- ``APPEND(S)`` / ``SETITEM(S)`` / ``ADDITEMS`` fill only lists, deques, dicts and sets, through their own methods;
- extension codes and persistent ids (which resolve through tables of the loading process) are refused;
- ``torch.storage._load_from_bytes`` (a tensor pickled by plain pickle, as ARS keeps its weights) is resolved to a
  loader of those bytes with ``torch.load(weights_only=True)``, not torch's own, which unpickles them in full.

It is :class:`pickle._Unpickler`, Python's own unpickler written in Python (the C one lets a subclass change only
``find_class``), with those opcodes replaced: slower, which matters little for the small pickles of a model's data.
"""

import importlib
import io
import math
import pickle
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch as th

from sb3_safe.doctor.allowlist import Allowlist
from sb3_safe.doctor.budget import ReadingBudget
from sb3_safe.doctor.scan import Finding, PickleGlobal, empty_shape_problem, python3_global

#: numpy's reconstructor of arrays, by name
_NUMPY_RECONSTRUCT = frozenset({"numpy._core.multiarray._reconstruct", "numpy.core.multiarray._reconstruct"})
#: What each filling opcode may fill: the exact types pickle fills that way for the objects SB3 files hold
_LIST_TYPES = (list, deque)
_DICT_TYPES = (dict, OrderedDict)
_BUILT_CALL = "an object the pickle builds and then calls"
#: Values that are neither a global nor a container: skipped first (a search can meet millions)
_PLAIN_VALUES = frozenset({type(None), bool, int, float, str, bytes})


class RefusedGlobal(Exception):
    """The pickle does something the allowlist does not allow; ``finding`` says what, as the scan would."""

    def __init__(self, finding: Finding) -> None:
        super().__init__(str(finding))
        self.finding = finding


def load_storage_from_bytes(data: bytes) -> Any:
    """``torch.storage._load_from_bytes`` with ``weights_only=True``: the storage a plain pickle of a tensor holds."""
    return th.load(io.BytesIO(data), weights_only=True)


class RestrictedUnpickler(pickle._Unpickler):
    """
    Unpickle one pickle of a file, refusing (:class:`RefusedGlobal`) what ``rules`` does not allow.

    :param data: the pickle
    :param entry: where it is, for the findings (``data["policy_class"]``, ``vecnormalize.pkl``)
    :param rules: the allowlist
    :param budget: charged with the calls and the values searched in their arguments
    """

    # pickle._Unpickler's own, undocumented (so not in typeshed)
    stack: list[Any]
    proto: int
    append: Callable[[Any], None]
    pop_mark: Callable[[], list[Any]]

    def __init__(self, data: bytes, entry: str, rules: Allowlist, budget: ReadingBudget) -> None:
        super().__init__(io.BytesIO(data))
        self.entry = entry
        self.rules = rules
        self.budget = budget
        #: the globals resolved so far, by id of the object (kept alive here, so that ids stay unique), with its names
        self.resolved: dict[int, tuple[Any, list[PickleGlobal]]] = {}

    def refuse(self, target: str, detail: str) -> RefusedGlobal:
        return RefusedGlobal(Finding(self.entry, target, detail))

    def find_class(self, module: str, name: str) -> Any:
        # As the unpickler maps Python 2's names (the scan checks the mapped names too)
        found = python3_global(module, name, self.proto)
        module, name = found.module, found.name
        if not self.rules.may_reference(found):
            raise self.refuse(str(found), self.rules.describe(found) or "the pickle imports it")
        # may_reference allows plain names only: no attribute path to follow
        value = load_storage_from_bytes if self.rules.loads_bytes(found) else getattr(importlib.import_module(module), name)
        names = self.resolved.setdefault(id(value), (value, []))[1]
        if found not in names:
            names.append(found)
        return value

    def _names(self, value: Any) -> list[PickleGlobal]:
        """The names under which the pickle resolved ``value`` (one object may have several); [] if none."""
        entry = self.resolved.get(id(value))
        return entry[1] if entry is not None and entry[0] is value else []

    def _check_call(self, callee: Any, *arguments: Any, initializes: bool = False) -> None:
        self.budget.charge_call(self.entry)
        names = self._names(callee)
        if not names:
            raise self.refuse(_BUILT_CALL, "not a global the file may call")
        callable_as = [found for found in names if self.rules.may_call(found)]
        if not callable_as:
            raise self.refuse(str(names[0]), "the pickle calls it")
        for passed in self._globals_in(arguments):
            if not any(self.rules.may_pass(found, name) for found in callable_as for name in passed):
                raise self.refuse(str(passed[0]), f"the pickle passes it to {callable_as[0]}, which calls it")
        if initializes and not any(self.rules.may_initialize(found) for found in callable_as):
            raise self.refuse(str(callable_as[0]), "the pickle calls it with arguments, not as its pickles build it")
        args = arguments[0]
        if {str(found) for found in callable_as} & _NUMPY_RECONSTRUCT:
            problem = empty_shape_problem(args[1] if len(args) > 1 else None)
            if problem is not None:
                raise self.refuse(f"{callable_as[0]} {problem}", "numpy's pickles never ask it")

    def _globals_in(self, arguments: tuple[Any, ...]) -> Iterator[list[PickleGlobal]]:
        """
        The names of each resolved global in a call's arguments, inside containers too (without recursion): each
        object once per call, every value searched charged to the budget (no more than the scan charged).
        """
        self.budget.charge_values(1, self.entry)
        pending: list[Any] = [arguments]
        searched: set[int] = set()
        while pending:
            item = pending.pop()
            if type(item) in _PLAIN_VALUES:
                continue
            names = self._names(item)
            if names:
                yield names
            elif isinstance(item, tuple | list | set | frozenset | deque | dict) and id(item) not in searched:
                searched.add(id(item))
                self.budget.charge_values(len(item) * (2 if isinstance(item, dict) else 1), self.entry)
                if isinstance(item, dict):
                    pending.extend(item.keys())
                    pending.extend(item.values())
                else:
                    pending.extend(item)

    def _refuse_change(self, target: Any) -> None:
        names = self._names(target)
        if names:
            raise self.refuse(str(names[0]), "the pickle changes it (appends to it, sets items or attributes)")

    # Opcodes that call code

    def load_reduce(self) -> None:
        args = self.stack.pop()
        function = self.stack[-1]
        if not isinstance(args, tuple):
            raise pickle.UnpicklingError("REDUCE's arguments are not a tuple")
        self._check_call(function, args, initializes=True)
        self.stack[-1] = function(*args)

    def load_newobj(self) -> None:
        args = self.stack.pop()
        cls = self.stack.pop()
        if not isinstance(args, tuple):
            raise pickle.UnpicklingError("NEWOBJ's arguments are not a tuple")
        self._check_call(cls, args)
        self.append(cls.__new__(cls, *args))

    def load_newobj_ex(self) -> None:
        kwargs = self.stack.pop()
        args = self.stack.pop()
        cls = self.stack.pop()
        if not (isinstance(args, tuple) and isinstance(kwargs, dict)):
            raise pickle.UnpicklingError("NEWOBJ_EX's arguments are not a tuple and a dict")
        self._check_call(cls, args, kwargs)
        self.append(cls.__new__(cls, *args, **kwargs))

    def _instantiate(self, klass: Any, args: list[Any]) -> None:
        # OBJ and INST, as pickle._Unpickler's
        self._check_call(klass, tuple(args), initializes=True)
        plain = not args and isinstance(klass, type) and not hasattr(klass, "__getinitargs__")
        self.append(klass.__new__(klass) if plain else klass(*args))

    def load_build(self) -> None:
        state = self.stack.pop()
        inst = self.stack[-1]
        self._refuse_change(inst)
        if isinstance(inst, np.ndarray):
            _check_array_state(state)
        # On the class: an attribute of the object is the file's (an earlier BUILD can set one)
        setstate = getattr(type(inst), "__setstate__", None)
        if setstate is not None:
            setstate(inst, state)
            return
        slotstate = None
        if isinstance(state, tuple) and len(state) == 2:
            state, slotstate = state
        for items in (state, slotstate):
            if items and not isinstance(items, dict):
                raise pickle.UnpicklingError(f"BUILD's state is a {type(items).__name__}, not a dict")
            for key in items or ():
                if not isinstance(key, str) or (key.startswith("__") and key.endswith("__")):
                    raise self.refuse(f"attribute {key!r} of a {type(inst).__name__}", "the pickle sets it")
        if state:
            inst.__dict__.update(state)
        for key, value in (slotstate or {}).items():
            setattr(inst, key, value)

    # Opcodes that fill containers: through the container type's own methods

    def _fill(self, target: Any, types: tuple[type, ...]) -> Any:
        self._refuse_change(target)
        if type(target) not in types:
            raise self.refuse(f"a {type(target).__name__}", "the pickle fills it as a container")
        return type(target)

    def load_append(self) -> None:
        value = self.stack.pop()
        self._fill(self.stack[-1], _LIST_TYPES).append(self.stack[-1], value)

    def load_appends(self) -> None:
        items = self.pop_mark()
        self._fill(self.stack[-1], _LIST_TYPES).extend(self.stack[-1], items)

    def load_setitem(self) -> None:
        value = self.stack.pop()
        key = self.stack.pop()
        self._fill(self.stack[-1], _DICT_TYPES).__setitem__(self.stack[-1], key, value)

    def load_setitems(self) -> None:
        items = self.pop_mark()
        target = self.stack[-1]
        setitem = self._fill(target, _DICT_TYPES).__setitem__
        for index in range(0, len(items), 2):
            setitem(target, items[index], items[index + 1])

    def load_additems(self) -> None:
        items = self.pop_mark()
        self._fill(self.stack[-1], (set,)).update(self.stack[-1], items)

    # Opcodes that resolve through tables of the loading process

    def get_extension(self, code: int) -> None:
        raise self.refuse(f"extension code {code} (copyreg registry)", "a global that cannot be resolved statically")

    def persistent_load(self, pid: Any) -> None:
        raise self.refuse("a persistent id", "resolved by the loading program, not by the file")

    _replaced: dict[int, Callable[[Any], None]] = {
        pickle.REDUCE[0]: load_reduce,
        pickle.NEWOBJ[0]: load_newobj,
        pickle.NEWOBJ_EX[0]: load_newobj_ex,
        pickle.BUILD[0]: load_build,
        pickle.APPEND[0]: load_append,
        pickle.APPENDS[0]: load_appends,
        pickle.SETITEM[0]: load_setitem,
        pickle.SETITEMS[0]: load_setitems,
        pickle.ADDITEMS[0]: load_additems,
    }
    dispatch = dict(pickle._Unpickler.dispatch)
    dispatch.update(_replaced)


def _check_array_state(state: Any) -> None:
    """
    Refuse an array's state (``ndarray.__setstate__``: version, shape, dtype, Fortran order, values) whose values are
    not as many as its shape: numpy checks the bytes of plain arrays, not the list of an object array.
    """
    if not (isinstance(state, tuple) and len(state) == 5 and isinstance(state[2], np.dtype)):
        raise pickle.UnpicklingError("an array's state is not (version, shape, dtype, order, values)")
    shape, dtype, values = state[1], state[2], state[4]
    if not (isinstance(shape, tuple) and all(isinstance(size, int) and size >= 0 for size in shape)):
        raise pickle.UnpicklingError("an array's shape is not a tuple of sizes")
    if dtype.hasobject and not (isinstance(values, list) and len(values) == math.prod(shape)):
        count = len(values) if isinstance(values, list) else f"a {type(values).__name__} of"
        raise pickle.UnpicklingError(f"an array of objects of shape {shape} whose state holds {count} values")


def restricted_loads(data: bytes, entry: str, rules: Allowlist, budget: ReadingBudget) -> Any:
    """
    Unpickle ``data`` with :class:`RestrictedUnpickler`.

    :param data: the pickle
    :param entry: where it is, for the findings
    :param rules: the allowlist
    :param budget: charged with the calls and the values searched in their arguments
    :return: the object
    :raises RefusedGlobal: for what the allowlist does not allow; BudgetExceeded beyond the budget; other errors
        for a pickle that is not valid
    """
    return RestrictedUnpickler(data, entry, rules, budget).load()
