"""Bounded reads of the files a user names: JSON, JSON Lines, YAML and text, gzip or not.

A file a user passes (a sweep spec, a config.json, a table, a run folder's meta.json and rows, a points or peer
file, a histogram, a CSV) is read here, within bounds, so no file can hang a command, exhaust its memory or
reach a parser's own failure (a RecursionError, Python's integer digit limit) as a traceback:

- only a regular file is opened (a FIFO or a device blocks ``open`` or never ends), checked before opening;
- at most ``MAX_BYTES`` are read, and a gzip file is decompressed in chunks to at most ``MAX_BYTES`` (a bomb of
  a few MB stops there, never read whole); a YAML file is smaller still (``MAX_YAML_BYTES``);
- values nest at most ``MAX_DEPTH`` deep, integers have at most ``MAX_INT_DIGITS`` digits, and numbers are
  finite (JSON's NaN and Infinity, YAML's .nan and .inf, and overflowing literals are refused);
- YAML aliases are refused (an alias chain of a few hundred bytes expands to gigabytes).

Every refusal is one ``Refused`` line, ``<file>: <why>``, that quotes at most a short prefix of what it found.
"""

from __future__ import annotations

import json
import math
import os
import stat
import zlib
from pathlib import Path
from typing import Any

import yaml

from moebench.errors import UserError, short

MAX_BYTES = 64 << 20  # 14x the largest rows a committed tune holds (4.5 MB decompressed)
MAX_YAML_BYTES = 1 << 20  # a sweep spec is a few hundred bytes; pure-Python YAML parses about 1 MB a second
MAX_DEPTH = 32  # moebench's own files nest at most 6 deep; the parsers recurse per level
MAX_INT_DIGITS = 40  # 2**128 has 39 digits; Python refuses ints past 4300 digits with a long message
CHUNK = 1 << 20  # gzip is decompressed this much at a time, so the bound holds on what is kept


class Refused(UserError):
    """A file refused by a bound, or not of the kind expected: ``<file>: <why>``; ``why`` is the reason alone."""

    def __init__(self, name: object, why: str):
        super().__init__(f"{name}: {why}")
        self.why = why


class NotJSON(Refused):
    """Text that is not JSON at all (a syntax error, as a line cut short is); ``why`` says where."""


class _Bound(Exception):
    """Raised from inside a parser's hooks: a value past a bound; caught here and made a ``Refused``."""


# ---- bytes and text ------------------------------------------------------------------------------------

def check_regular(path: Path | str) -> os.stat_result:
    """``path``'s stat, where it is a regular file (symbolic links followed); ``Refused`` where it is missing, a
    folder, a FIFO, a device or a socket. Nothing is opened."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise Refused(path, "no such file") from None
    except OSError as e:
        raise Refused(path, f"cannot read it ({e.strerror or type(e).__name__})") from None
    if not stat.S_ISREG(st.st_mode):
        kind = ("a folder" if stat.S_ISDIR(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode)
                else "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "a socket")
        raise Refused(path, f"{kind}, not a regular file")
    return st


def read_bytes(path: Path | str, gz: bool | None = None, limit: int = MAX_BYTES) -> bytes:
    """The bytes of a regular file, at most ``limit``; a gzip file (``gz``; by default a ``.gz`` name) decompressed,
    at most ``limit`` of them."""
    st = check_regular(path)
    if st.st_size > limit:
        raise Refused(path, f"{st.st_size} bytes, more than the {limit} read")
    gz = str(path).endswith(".gz") if gz is None else gz
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise Refused(path, f"cannot read it ({e.strerror or type(e).__name__})") from None
    if len(data) > limit:  # grew since the stat
        raise Refused(path, f"more than the {limit} bytes read")
    return _gunzip(path, data, limit) if gz else data


def _gunzip(path: Path | str, data: bytes, limit: int) -> bytes:
    """``data`` (gzip, members one after another) decompressed in chunks; ``Refused`` past ``limit`` bytes."""
    out, size = [], 0
    try:
        while data:
            d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            while data and not d.eof:
                piece = d.decompress(data, CHUNK)
                data = d.unconsumed_tail
                size += len(piece)
                if size > limit:
                    raise Refused(path, f"decompresses to more than the {limit} bytes read")
                out.append(piece)
            if not d.eof:
                raise Refused(path, "not gzip (cut short)")
            data = d.unused_data
    except zlib.error:
        raise Refused(path, "not gzip") from None
    return b"".join(out)


def read_text(path: Path | str, gz: bool | None = None, limit: int = MAX_BYTES) -> str:
    """A regular file's UTF-8 text, within ``read_bytes``' bounds."""
    try:
        return read_bytes(path, gz, limit).decode("utf-8")
    except UnicodeDecodeError:
        raise Refused(path, "not UTF-8 text") from None


# ---- JSON ----------------------------------------------------------------------------------------------

def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise _Bound(f"an integer of {len(text.lstrip('-'))} digits ({short(text, 24)}), more than {MAX_INT_DIGITS}")
    return int(text)


def _parse_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Bound(f"a number past a float's range ({short(text, 24)})")
    return value


def _parse_constant(text: str) -> float:
    raise _Bound(f"{text} is not a finite number")


def parse_json(text: str | bytes, name: object) -> Any:
    """``text`` (one JSON value) within the bounds on nesting, integers and numbers; ``NotJSON`` for a syntax
    error, ``Refused`` for a bound, each naming ``name``."""
    try:
        value = json.loads(text, parse_int=_parse_int, parse_float=_parse_float, parse_constant=_parse_constant)
    except _Bound as e:
        raise Refused(name, str(e)) from None
    except RecursionError:
        raise Refused(name, f"nested deeper than {MAX_DEPTH}") from None
    except json.JSONDecodeError as e:
        raise NotJSON(name, f"not JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    except UnicodeDecodeError:
        raise Refused(name, "not UTF-8 text") from None
    _check_depth(value, name)
    return value


def read_json(path: Path | str, gz: bool | None = None) -> Any:
    """The JSON value in a regular file (``read_text``, ``parse_json``)."""
    return parse_json(read_text(path, gz), path)


def _check_depth(value: Any, name: object) -> None:
    """``Refused`` where ``value`` nests deeper than ``MAX_DEPTH`` or holds a float that is not finite."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, (dict, list)):
            if depth > MAX_DEPTH:
                raise Refused(name, f"nested deeper than {MAX_DEPTH}")
            stack.extend((c, depth + 1) for c in (v.values() if isinstance(v, dict) else v))
        elif isinstance(v, float) and not math.isfinite(v):
            raise Refused(name, f"{v} is not a finite number")
        elif isinstance(v, int) and not isinstance(v, bool) and v.bit_length() > 4 * MAX_INT_DIGITS:
            raise Refused(name, f"an integer of more than {MAX_INT_DIGITS} digits")


# ---- YAML ----------------------------------------------------------------------------------------------

class _Loader(yaml.SafeLoader):
    """yaml's SafeLoader without aliases, within ``MAX_DEPTH`` and ``MAX_INT_DIGITS``."""

    depth = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            raise yaml.MarkedYAMLError(problem="aliases (*name) are not read",
                                       problem_mark=self.peek_event().start_mark)
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                raise yaml.MarkedYAMLError(problem=f"nested deeper than {MAX_DEPTH}",
                                           problem_mark=self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_yaml_int(self, node):
        digits = sum(c.isalnum() for c in str(node.value))
        if digits > MAX_INT_DIGITS:
            raise yaml.MarkedYAMLError(problem=f"an integer of {digits} digits, more than {MAX_INT_DIGITS}",
                                       problem_mark=node.start_mark)
        return super().construct_yaml_int(node)


_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_yaml_int)


def parse_yaml(text: str, name: object) -> Any:
    """``text`` (one YAML document) within the bounds; ``Refused`` naming ``name`` and the line."""
    try:
        value = yaml.load(text, Loader=_Loader)  # noqa: S506 (a SafeLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark else ""
        problem = getattr(e, "problem", None)
        raise Refused(name, f"malformed YAML{where}" + (f": {short(problem, 80, quote=False)}" if problem else ""))\
            from None
    except (ValueError, TypeError, OverflowError, RecursionError) as e:  # a date out of range, a bad base64...
        raise Refused(name, f"malformed YAML ({type(e).__name__}: {short(str(e), 60, quote=False)})") from None
    _check_depth(value, name)
    return value


def read_yaml(path: Path | str) -> Any:
    """The YAML document in a regular file of at most ``MAX_YAML_BYTES``."""
    return parse_yaml(read_text(path, gz=False, limit=MAX_YAML_BYTES), path)
