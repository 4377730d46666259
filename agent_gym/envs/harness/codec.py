"""Built-in values as JSON lines between the test process and the solution process.

Only exact built-in types cross: ``None``, ``bool``, ``int``, ``float``, ``complex``, ``str``, ``bytes`` and
lists, tuples, sets, frozensets and dicts of them, nested at most ``MAX_DEPTH`` deep. Anything else (an
object whose ``==`` always answers ``True``, a subclass of ``float``...) is refused where it is encoded, so a
test never compares against a value the solution's code controls. Arguments may also carry instances of
classes the tests define (``objects=True``), rebuilt on the other side from their attributes.
Standard library only: this file is copied into both sandboxes.
"""

MAX_DEPTH = 100
_NATIVE = (bool, int, str)
_SEQUENCES = {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}


class _NotBuiltin(TypeError):
    """A value that is not a built-in one."""


class _Garbled(ValueError):
    """Data that :func:`encode` does not write (private: these scripts run in the sandbox, apart from agent-gym)."""


def encode(value, objects=False, depth=0):
    """``value`` as JSON-ready data; raises ``_NotBuiltin`` (a TypeError) for anything but built-in values."""
    kind = type(value)
    if value is None or kind in _NATIVE:
        return value
    if kind is float:
        return {"float": repr(value)}
    if kind is complex:
        return {"complex": [repr(value.real), repr(value.imag)]}
    if kind is bytes:
        return {"bytes": value.hex()}
    if depth >= MAX_DEPTH:
        raise _NotBuiltin(f"a value nested more than {MAX_DEPTH} deep (or holding itself)")
    if kind.__name__ in _SEQUENCES and _SEQUENCES[kind.__name__] is kind:
        return {kind.__name__: [encode(item, objects, depth + 1) for item in value]}
    if kind is dict:
        return {"dict": [[encode(key, objects, depth + 1), encode(item, objects, depth + 1)]
                         for key, item in value.items()]}
    if objects and kind.__module__ == "__tests__" and isinstance(getattr(value, "__dict__", None), dict):
        return {"object": [kind.__name__, encode(dict(vars(value)), objects, depth + 1)]}
    raise _NotBuiltin(f"got a {kind.__name__}; the tests accept built-in values only")


def decode(data, classes=None, depth=0):
    """The value ``data`` encodes; ``classes`` (name -> class) rebuilds objects. Raises ValueError on anything
    :func:`encode` does not write."""
    if data is None or type(data) in _NATIVE:
        return data
    if type(data) is not dict or len(data) != 1 or depth >= MAX_DEPTH:
        raise _Garbled("not an encoded value")
    ((tag, payload),) = data.items()
    try:
        if tag == "float" and type(payload) is str:
            return float(payload)
        if tag == "complex" and type(payload) is list and len(payload) == 2:
            return complex(float(payload[0]), float(payload[1]))
        if tag == "bytes" and type(payload) is str:
            return bytes.fromhex(payload)
        if tag in _SEQUENCES and type(payload) is list:
            return _SEQUENCES[tag](decode(item, classes, depth + 1) for item in payload)
        if tag == "dict" and type(payload) is list:
            return {decode(key, classes, depth + 1): decode(item, classes, depth + 1) for key, item in payload}
        if tag == "object" and classes is not None and type(payload) is list and payload[0] in classes:
            cls, attributes = classes[payload[0]], decode(payload[1], classes, depth + 1)
            instance = cls.__new__(cls)
            instance.__dict__.update(attributes)
            return instance
    except (TypeError, ValueError, IndexError, AttributeError) as error:
        raise _Garbled(f"not an encoded value: {error}") from None
    raise _Garbled(f"not an encoded value: {tag!r}")
