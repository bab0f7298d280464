"""A Jinja sandbox with a time and size budget, for chat templates that come from model files."""
from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment

# A real chat template renders a conversation in milliseconds and into at most a few MB; these limits
# stop the hostile ones (three nested range(100000) loops spun the engine for ever, 'x' * 1.5e9
# allocated gigabytes) long before they hurt, with room to spare for every real template.
MAX_ITEMS = 1_000_000  # str/list results of *, +, %, range(), filters and method calls
MAX_WIDTH_DIGITS = 7  # a format width like '%9999999d' or '{:>9999999}'
RENDER_SECONDS = 5.0  # per render; the probe at load time uses PROBE_SECONDS
PROBE_SECONDS = 2.0
_WIDE = re.compile(rf"\d{{{MAX_WIDTH_DIGITS},}}")


class TemplateBudgetError(SecurityError):
    """A template went over its time or size budget."""


def _size(value: Any) -> int:
    return len(value) if isinstance(value, (str, bytes, list, tuple, dict)) else 0


def _check_size(value: Any, what: str) -> Any:
    if _size(value) > MAX_ITEMS:
        raise TemplateBudgetError(f"{what} would make {_size(value)} items (limit {MAX_ITEMS})")
    return value


def _check_args(args: tuple[Any, ...], kwargs: dict[str, Any], what: str) -> None:
    for v in (*args, *kwargs.values()):
        if isinstance(v, int) and not isinstance(v, bool) and abs(v) > MAX_ITEMS:
            raise TemplateBudgetError(f"{what} called with {v} (limit {MAX_ITEMS})")
        if isinstance(v, float) and abs(v) > MAX_ITEMS:
            raise TemplateBudgetError(f"{what} called with {v} (limit {MAX_ITEMS})")


def _product_size(left: Any, right: Any) -> int:
    for seq, n in ((left, right), (right, left)):
        if _size(seq) and isinstance(n, int) and not isinstance(n, bool):
            return _size(seq) * max(n, 0)
    return 0


class GuardedEnvironment(ImmutableSandboxedEnvironment):
    """Jinja's immutable sandbox plus limits: sequence sizes from *, +, %, range(), filters and calls."""

    intercepted_binops = frozenset(["*", "+", "%", "**"])

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.globals["range"] = self._range
        self.filters = {name: self._guard_filter(name, f) for name, f in self.filters.items()}

    @staticmethod
    def _range(*args: int) -> range:
        r = range(*args)
        if len(r) > MAX_ITEMS:
            raise TemplateBudgetError(f"range of {len(r)} items (limit {MAX_ITEMS})")
        return r

    @staticmethod
    def _guard_filter(name: str, f: Callable[..., Any]) -> Callable[..., Any]:
        skip = 2 if hasattr(f, "jinja_pass_arg") else 1  # the context/environment, then the value

        def guarded(*args: Any, **kwargs: Any) -> Any:
            _check_args(args[skip:], kwargs, f"filter {name!r}")
            return _check_size(f(*args, **kwargs), f"filter {name!r}")

        for attr in ("jinja_pass_arg",):  # keep pass_context / pass_environment markers
            if hasattr(f, attr):
                setattr(guarded, attr, getattr(f, attr))
        return guarded

    def call_binop(self, context: Any, op: str, left: Any, right: Any) -> Any:
        if op == "*" and _product_size(left, right) > MAX_ITEMS:
            raise TemplateBudgetError(f"'*' would make {_product_size(left, right)} items (limit {MAX_ITEMS})")
        if op == "**" and isinstance(right, (int, float)) and abs(right) > 64:
            raise TemplateBudgetError(f"'**' with exponent {right} (limit 64)")
        if op == "%" and isinstance(left, str) and _WIDE.search(left):
            raise TemplateBudgetError("a '%' format with a width of millions")
        if op == "+" and _size(left) + _size(right) > MAX_ITEMS:
            raise TemplateBudgetError(f"'+' would make {_size(left) + _size(right)} items (limit {MAX_ITEMS})")
        result = super().call_binop(context, op, left, right)
        return _check_size(result, f"'{op}'")

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        name = getattr(__obj, "__name__", "a function")
        _check_args(args, kwargs, name)
        return _check_size(super().call(__context, __obj, *args, **kwargs), name)

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        wrapped = super().wrap_str_format(value)
        if wrapped is not None and _WIDE.search(value.__self__):
            def refuse(*args: Any, **kwargs: Any) -> str:
                raise TemplateBudgetError("a format with a width of millions")
            return refuse
        return wrapped


_T = TypeVar("_T")


def render_with_deadline(render: Callable[[], _T], seconds: float) -> _T:
    """Run render(), raising TemplateBudgetError if it takes longer than `seconds`.

    The check runs on every call and on every line executed in template code (Jinja compiles a
    template to Python whose code objects are named "<template>"), so even a loop with an empty
    body stops in time. sys.settrace is per thread; the previous tracer (a debugger, coverage)
    is put back afterwards.
    """
    deadline = time.monotonic() + seconds

    def on_line(frame: Any, event: str, arg: Any) -> Any:
        if time.monotonic() > deadline:
            raise TemplateBudgetError(f"rendering took more than {seconds:g} s")
        return on_line

    def on_call(frame: Any, event: str, arg: Any) -> Any:
        if time.monotonic() > deadline:
            raise TemplateBudgetError(f"rendering took more than {seconds:g} s")
        return on_line if frame.f_code.co_filename == "<template>" else None

    previous = sys.gettrace()
    sys.settrace(on_call)
    try:
        return render()
    finally:
        sys.settrace(previous)

