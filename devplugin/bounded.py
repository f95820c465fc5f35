"""The one reader of values a tenant can write: annotations, labels and resource quantities.

Every annotation and quantity the project reads goes through here, so a hostile value is refused the same way
everywhere, with a message that names the field, what was wrong and what is accepted:

- text longer than the bound is refused before it is parsed;
- JSON numbers must be small non-negative integers: floats (`1.5`, `1e999`), negatives, `NaN`/`Infinity` and
  integers past MAX_INT are refused while the JSON is read (so nothing downstream meets an overflow), and
  booleans are not numbers;
- numbers written as text (assume times, GPU indexes, ACK's container and GPU keys) are ASCII digits only:
  `'²'`, `'¹'` or Arabic-Indic digits (which `str.isdigit()` or `int()` would take) are refused;
- resource quantities are read by the `kubernetes` client's parser, so `1e1`, `2M` and `1Ki` are the integers the
  apiserver says they are; fractions, negatives and values past the bound are refused.

Pure: no I/O. Every refusal is a RefusedValue (a ValueError) whose message is fit for a user.
"""

from __future__ import annotations

import json
import re
from decimal import Decimal, DecimalException
from typing import Any

from kubernetes.utils import parse_quantity

MAX_ANNOTATION_CHARS = 64 * 1024  # the apiserver allows 256 KiB for all of an object's annotations together
MAX_INT = 2**63 - 1  # the largest JSON integer read (a Unix time in nanoseconds fits)
MAX_AMOUNT = 2**31 - 1  # the largest amount of a resource (gpu-mem units, percent, GPUs) read anywhere
MAX_GPU_INDEX = 1023
MAX_NAME_CHARS = 253  # a DNS subdomain: the longest name Kubernetes gives anything
MAX_QUANTITY_CHARS = 64
_DIGITS = re.compile(r"[0-9]{1,19}")  # ASCII only: `re`'s \d would take every Unicode digit
# The apiserver's quantity grammar (k8s.io/apimachinery/pkg/api/resource): sign, digits, optional fraction,
# then an SI or binary suffix or a decimal exponent.
_QUANTITY = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+|[KMGTPE]i|[numkMGTPE])?")


class RefusedValue(ValueError):
    """A value that cannot be trusted; the message names it, says what was wrong and what is accepted."""


def load_json_object(text: object, what: str, max_chars: int = MAX_ANNOTATION_CHARS) -> dict[str, Any]:
    """A JSON object whose every number is an integer 0..MAX_INT; RefusedValue otherwise."""
    if not isinstance(text, str):
        raise RefusedValue(f"{what} must be text, not {type(text).__name__}")
    if len(text) > max_chars:
        raise RefusedValue(f"{what} is {len(text)} characters long; at most {max_chars} are read")
    try:
        doc = json.loads(text, parse_int=_json_int, parse_float=_json_float, parse_constant=_json_constant)
    except RefusedValue as exc:
        raise RefusedValue(f"{what}: {exc}") from None
    except RecursionError:
        raise RefusedValue(f"{what} is nested too deeply to be read") from None
    except ValueError as exc:
        raise RefusedValue(f"{what} is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise RefusedValue(f"{what} must be a JSON object, not {type(doc).__name__}")
    return doc


def _json_int(text: str) -> int:
    if text.startswith("-"):
        raise RefusedValue(f"the number {_clip(text)} is negative; only whole numbers 0..{MAX_INT} are read")
    if len(text) > 19 or int(text) > MAX_INT:
        raise RefusedValue(f"the number {_clip(text)} is larger than {MAX_INT}")
    return int(text)


def _json_float(text: str) -> int:
    raise RefusedValue(f"the number {_clip(text)} is not a whole number; only whole numbers 0..{MAX_INT} are read")


def _json_constant(text: str) -> int:
    raise RefusedValue(f"{text} is not a number JSON allows")


def nat(value: object, what: str, maximum: int = MAX_INT) -> int:
    """A JSON value that must be an integer 0..maximum (a boolean is not one)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise RefusedValue(f"{what} must be a whole number 0..{maximum}, not {_show(value)}")
    if not 0 <= value <= maximum:
        raise RefusedValue(f"{what} is {value}; it must be 0..{maximum}")
    return value


def nat_text(text: object, what: str, maximum: int = MAX_INT) -> int:
    """A number written as text (an assume time, a GPU index, a JSON key): ASCII digits only, 0..maximum."""
    if not isinstance(text, str) or not _DIGITS.fullmatch(text):
        raise RefusedValue(f"{what} is {_clip(repr(text))}; it must be a whole number 0..{maximum} "
                           "written in the digits 0-9")
    value = int(text)
    if value > maximum:
        raise RefusedValue(f"{what} is {value}; it must be 0..{maximum}")
    return value


def short_text(value: object, what: str, max_chars: int = MAX_NAME_CHARS) -> str:
    """A JSON value that must be a string of at most max_chars characters."""
    if not isinstance(value, str):
        raise RefusedValue(f"{what} must be text, not {_show(value)}")
    if len(value) > max_chars:
        raise RefusedValue(f"{what} is {len(value)} characters long; at most {max_chars} are allowed")
    return value


def flag(value: object, what: str) -> bool:
    """A JSON value that must be true or false."""
    if not isinstance(value, bool):
        raise RefusedValue(f"{what} must be true or false, not {_show(value)}")
    return value


def obj(value: object, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise RefusedValue(f"{what} must be a JSON object, not {_show(value)}")
    return value


def seq(value: object, what: str, max_items: int) -> list[Any]:
    if not isinstance(value, list):
        raise RefusedValue(f"{what} must be a JSON list, not {_show(value)}")
    if len(value) > max_items:
        raise RefusedValue(f"{what} has {len(value)} entries; at most {max_items} are allowed")
    return value


def whole_quantity(value: object, what: str, maximum: int = MAX_AMOUNT) -> int:
    """A resource quantity (`3`, `1e1`, `2M`, `1Ki`, as the apiserver keeps them) as a whole number 0..maximum."""
    if isinstance(value, bool):
        raise RefusedValue(f"{what}: {value!r} is not a quantity")
    if isinstance(value, int):
        number = Decimal(value)
    else:
        text = value.strip() if isinstance(value, str) else None
        if text is None or len(text) > MAX_QUANTITY_CHARS or not _QUANTITY.fullmatch(text):
            raise RefusedValue(f"{what}: {_clip(repr(value))} is not a Kubernetes quantity (for example 4, 1e1, "
                               "2k, 1Ki)")
        try:
            number = parse_quantity(text)
        except (ValueError, ArithmeticError, DecimalException):
            raise RefusedValue(f"{what}: {_clip(repr(value))} is not a Kubernetes quantity") from None
    if number < 0:
        raise RefusedValue(f"{what}: {value} is negative")
    if number > maximum:
        raise RefusedValue(f"{what}: {_clip(str(value))} is more than {maximum}")
    if number != number.to_integral_value():
        raise RefusedValue(f"{what}: {value} is not a whole number ({number.normalize():f}); extended resources "
                           "are counted in whole units")
    return int(number)


def _show(value: object) -> str:
    return _clip(json.dumps(value, default=repr))


def _clip(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[:limit] + "..."
