"""Numpy-aware msgpack codec for the wire protocol: one msgpack header frame plus one raw frame per array.

A message is any tree of dicts (str keys), lists, str, bytes, int, float, bool, None, numpy arrays of a
supported dtype, numpy scalars and numpy string arrays. Arrays travel as a small msgpack extension (type 1:
``dtype code u8, ndim u8, frame index u32, shape u64 x ndim``, little-endian; the dtype code indexes
:data:`SUPPORTED_DTYPES`) in the header and their bytes in a separate ZMQ frame (the array itself, little-endian,
C order; the sockets send it without a copy from :data:`~policylink.adapters.channel.COPY_THRESHOLD` bytes up).
Anything else (object arrays, pickles, sets, custom classes) is refused at encode time with :class:`CodecError`;
nothing is ever pickled (DESIGN.md section 3).
"""

from __future__ import annotations

import math
import struct
import threading
from collections.abc import Sequence
from typing import Any

import msgpack
import numpy as np
import zmq

from policylink.adapters.schema import NUMERIC_DTYPES

SUPPORTED_DTYPES: tuple[str, ...] = NUMERIC_DTYPES
_WIRE_DTYPES = {name: np.dtype(name).newbyteorder("<") for name in SUPPORTED_DTYPES}
_WIRE_CODE = {dt: code for code, dt in enumerate(_WIRE_DTYPES.values())}  # wire dtype -> its code in the header
_EXT_ARRAY = 1  # payload: struct <dtype code u8, ndim u8, frame index u32, shape u64 x ndim>; data in frame 1+index
_EXT_STR_ARRAY = 2  # payload: msgpack [shape, flat list of str]
_EXT_SCALAR = 3  # payload: msgpack [dtype name, little-endian bytes]
_MAX_NDIM = 32
_ARRAY_HEAD = struct.Struct("<BBI")
_SHAPES = [struct.Struct(f"<{n}Q") for n in range(_MAX_NDIM + 1)]
_NATIVE = [(np.dtype(dt.name) if dt.isnative else dt, dt.kind == "b", dt.isnative) for dt in _WIRE_DTYPES.values()]
# Array extensions repeat message after message (same dtypes, shapes and frame order), so each is built and checked
# once: (dtype code, shape, frame index) -> extension when encoding, extension payload -> its fields when decoding.
_CACHE_SIZE = 1024
_ENCODED_HEADS: dict[tuple[int, tuple[int, ...], int], msgpack.ExtType] = {}
_DECODED_HEADS: dict[bytes, tuple[np.dtype, tuple[int, ...], int, int, bool, bool]] = {}

Frame = bytes | memoryview | np.ndarray
_BYTE_BUFFERS = frozenset((bytes, zmq.Frame))  # frames msgpack reads as they are


class CodecError(ValueError):
    """A value cannot be encoded, or received frames cannot be decoded (the message names the problem)."""


def encode(message: Any, *, check_keys: bool = True) -> list[Frame]:
    """Encode ``message`` into ZMQ frames: ``[header, array_0, array_1, ...]``.

    Array frames are the arrays themselves (C-contiguous, little-endian; a copy is made only when the
    input is not), so ``socket.send_multipart(frames, copy=False)`` sends them without copying.

    Args:
        message: the tree to encode.
        check_keys: refuse a map key that is not a str (msgpack itself would pack it, and the receiver's decoder
            would then refuse the message). ``False`` is for callers whose every map either was built by this
            library with str keys or went through :func:`check_keys` already.

    Raises:
        CodecError: a value of an unsupported type or dtype, naming its path in the message
            (e.g. ``body.observation.x: object arrays are not supported``).
    """
    try:
        packer, arrays = _THREAD.encoder
    except AttributeError:
        packer, arrays = _THREAD.encoder = _new_encoder()
    try:
        if check_keys and type(message) in _CONTAINERS and not _str_keys(message):
            raise TypeError("map key")
        header = packer.pack(message)
        frames = [header, *arrays]
    except (TypeError, ValueError, OverflowError) as e:
        path, why = _find_unencodable(message, "message")
        raise CodecError(f"{path}: {why}" if path else f"message: cannot encode ({e})") from None
    finally:
        arrays.clear()  # the thread's list holds no array past this call, sent or refused
    if len(header) > _MAX_KEPT_HEADER:  # the packer's buffer grew to fit it: let it go rather than keep it
        del _THREAD.encoder
    return frames


_THREAD = threading.local()  # .encoder: this thread's (msgpack.Packer, its list of array frames)
_MAX_KEPT_HEADER = 2**20


def _new_encoder() -> tuple[msgpack.Packer, list[np.ndarray]]:
    """A msgpack ``Packer`` whose ``default`` hook turns arrays into extensions and collects them as frames, and that
    frame list. One per thread that encodes (its 256 KiB buffer kept), made once: ``msgpack.packb`` builds a
    ``Packer`` and allocates that buffer on every call; a ``Packer`` resets its buffer after each message and after a
    failed one."""
    arrays: list[np.ndarray] = []

    def default(obj: Any) -> msgpack.ExtType:
        # msgpack calls this for every value it cannot pack itself: arrays (the common case: already wire-ready,
        # sent as they are) and anything else (_wire_form converts or refuses it)
        code = _WIRE_CODE.get(obj.dtype) if type(obj) is np.ndarray else None
        if code is None or not obj.flags.c_contiguous or obj.ndim > _MAX_NDIM:
            obj = _wire_form(obj)
            if type(obj) is msgpack.ExtType:
                return obj
            code = _WIRE_CODE[obj.dtype]
        arrays.append(obj)
        return _array_ext(code, obj.shape, len(arrays) - 1)

    return msgpack.Packer(default=default, use_bin_type=True, strict_types=False), arrays


def check_keys(obj: Any, path: str = "message") -> None:
    """Check that every map inside ``obj`` (through maps and lists) has str keys only.

    Raises:
        CodecError: naming the first offending value, e.g. ``observation[3]: map keys must be str, received int``.
    """
    if type(obj) in _CONTAINERS and not _str_keys(obj):
        where, why = _find_unencodable(obj, path)
        raise CodecError(f"{where}: {why}")


def decode(frames: Sequence[Any]) -> Any:
    """Decode frames produced by :func:`encode` (``bytes``, ``memoryview`` or ``zmq.Frame``).

    Arrays are zero-copy views of writable ZMQ frame buffers (frames received with ``copy=False``), so a receiver
    may normalise them in place; when a frame is read-only (``bytes``) the array is a writable copy.

    Raises:
        CodecError: malformed msgpack, an unknown extension, a frame whose size does not match its
            ``dtype`` x ``shape``, an unsupported dtype, non-str map keys, or unused/missing frames.
    """
    if not frames:
        raise CodecError("frames: expected at least one (the msgpack header), received none")
    used: set[int] = set()
    n_arrays = len(frames) - 1

    def ext_hook(code: int, data: bytes) -> Any:
        if code == _EXT_ARRAY:  # the common case, inlined: the header's fields, checked once per payload
            head = _DECODED_HEADS.get(data) or _array_head(data)
            dt, shape, index, size, is_bool, native = head
            if index in used or not 0 <= index < n_arrays:
                raise CodecError(f"array: frame index {index} is out of range or reused ({n_arrays} array frame(s))")
            used.add(index)
            buf = frames[1 + index]
            if type(buf) is not zmq.Frame:  # a received frame is a writable byte buffer already
                buf = _writable_buffer(buf)
            if len(buf) != size:
                raise CodecError(
                    f"array frame {index}: expected {size} bytes for {dt.name} {list(shape)}, received {len(buf)}"
                )
            arr = np.ndarray(shape, dt, buf)  # a view of the frame
            if is_bool and arr.size and arr.view(np.uint8).max() > 1:
                raise CodecError(f"array frame {index}: bool array holds bytes other than 0 and 1")
            return arr if native else arr.astype(dt.newbyteorder("="))
        if code == _EXT_STR_ARRAY:
            return _decode_str_array(data)
        if code == _EXT_SCALAR:
            name, raw = _unpack_list(data, 2, "scalar")
            dt = _dtype_from_name(name)
            if not isinstance(raw, bytes) or len(raw) != dt.itemsize:
                raise CodecError(f"scalar: expected {dt.itemsize} bytes of {name}, received {raw!r:.40}")
            return np.frombuffer(raw, dtype=dt)[0].astype(dt.newbyteorder("="))
        raise CodecError(f"header: unknown msgpack extension type {code} (expected 1, 2 or 3)")

    header = frames[0]
    try:
        if type(header) not in _BYTE_BUFFERS:
            header = _buffer_of(header)
        message = msgpack.unpackb(header, ext_hook=ext_hook)  # defaults: raw=False, strict_map_key, use_list
    except CodecError:
        raise
    except Exception as e:  # msgpack raises several types (ExtraData, FormatError, ValueError...)
        raise CodecError(f"header: invalid msgpack ({type(e).__name__}: {e})") from None
    if len(used) != len(frames) - 1:
        raise CodecError(f"frames: {len(frames) - 1} array frame(s) sent, {len(used)} referenced by the header")
    return message


def nbytes(frames: Sequence[Any]) -> int:
    """Total payload size of ``frames`` in bytes (header + array frames)."""
    return sum(memoryview(f).nbytes for f in frames)


def _buffer_of(frame: Any) -> memoryview:
    """A 1-D byte view of ``frame`` (a ``zmq.Frame``'s is writable; a ``bytes``' read-only).

    Raises:
        TypeError: ``frame`` has no buffer (e.g. a str).
    """
    view = memoryview(frame)
    if view.format == "B" and view.ndim == 1:
        return view
    return view.cast("B") if view.nbytes else memoryview(b"")


def _wire_form(obj: Any) -> np.ndarray | msgpack.ExtType:
    """What :func:`encode` sends for a value msgpack cannot pack itself and that is not a wire-ready array: the
    array as a C-contiguous little-endian copy, or the extension of a string array or numpy scalar.

    Raises:
        TypeError: the value's type or dtype is not supported (the message says which).
    """
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind == "U":
            payload = [list(obj.shape), obj.ravel().tolist()]
            return msgpack.ExtType(_EXT_STR_ARRAY, msgpack.packb(payload))
        if obj.ndim > _MAX_NDIM:
            raise TypeError(f"arrays of more than {_MAX_NDIM} dims are not supported")
        return np.asarray(obj, dtype=_wire_dtype(obj.dtype), order="C")  # keeps 0-d arrays 0-d
    if isinstance(obj, np.generic):
        wire = _wire_dtype(obj.dtype)
        return msgpack.ExtType(_EXT_SCALAR, msgpack.packb([wire.name, np.asarray(obj, wire).tobytes()]))
    raise TypeError(type(obj).__name__)


def _wire_dtype(dtype: np.dtype) -> np.dtype:
    if dtype.kind == "O":
        raise TypeError("object arrays are not supported (only bool, int8-64, uint8-64, float16/32/64, str)")
    name = np.dtype(dtype).newbyteorder("=").name
    if name not in _WIRE_DTYPES:
        raise TypeError(f"dtype {dtype} is not supported; expected one of {list(SUPPORTED_DTYPES)}")
    return _WIRE_DTYPES[name]


def _dtype_from_name(name: Any) -> np.dtype:
    if not isinstance(name, str) or name not in _WIRE_DTYPES:
        raise CodecError(f"dtype: expected one of {list(SUPPORTED_DTYPES)}, received {name!r:.40}")
    return _WIRE_DTYPES[name]


def _unpack_list(data: bytes, n: int, what: str) -> list:
    try:
        items = msgpack.unpackb(data, raw=False, use_list=True)
    except Exception as e:
        raise CodecError(f"{what}: invalid extension payload ({type(e).__name__})") from None
    if not isinstance(items, list) or len(items) != n:
        raise CodecError(f"{what}: expected a {n}-item header, received {items!r:.60}")
    return items


def _check_shape(shape: Any, what: str) -> tuple[int, ...]:
    if (
        not isinstance(shape, list)
        or len(shape) > _MAX_NDIM
        or not all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s < 2**48 for s in shape)
    ):
        raise CodecError(f"{what}: expected a shape of non-negative ints, received {shape!r:.60}")
    return tuple(shape)


def _array_ext(code: int, shape: tuple[int, ...], index: int) -> msgpack.ExtType:
    """The extension of an array of dtype ``code`` and ``shape`` whose bytes travel in array frame ``index``."""
    key = (code, shape, index)
    ext = _ENCODED_HEADS.get(key)
    if ext is None:
        if len(_ENCODED_HEADS) >= _CACHE_SIZE:
            _ENCODED_HEADS.clear()
        head = _ARRAY_HEAD.pack(code, len(shape), index) + _SHAPES[len(shape)].pack(*shape)
        ext = _ENCODED_HEADS[key] = msgpack.ExtType(_EXT_ARRAY, head)
    return ext


def _writable_buffer(frame: Any) -> memoryview:
    """A writable 1-D byte view of ``frame``: its own for a writable buffer, a copy's for a read-only one (bytes)."""
    buf = _buffer_of(frame)
    return memoryview(bytearray(buf)) if buf.readonly else buf


def _array_head(data: bytes) -> tuple[np.dtype, tuple[int, ...], int, int, bool, bool]:
    """The checked fields of an array extension's payload: ``(dtype, shape, frame index, byte size, is bool,
    is native)``; remembered for the next message carrying the same payload.

    Raises:
        CodecError: a payload too short, of an unknown dtype code, or whose length does not match its ndim.
    """
    if len(data) < _ARRAY_HEAD.size:
        raise CodecError(f"array: header of {len(data)} bytes is too short")
    code, ndim, index = _ARRAY_HEAD.unpack_from(data)
    if code >= len(SUPPORTED_DTYPES) or ndim > _MAX_NDIM or len(data) != _ARRAY_HEAD.size + 8 * ndim:
        raise CodecError(f"array: invalid header (dtype code {code}, {ndim} dims, {len(data)} bytes)")
    dt, is_bool, native = _NATIVE[code]
    shape = _SHAPES[ndim].unpack_from(data, _ARRAY_HEAD.size)
    head = (dt, shape, index, math.prod(shape) * dt.itemsize, is_bool, native)
    if len(_DECODED_HEADS) >= _CACHE_SIZE:
        _DECODED_HEADS.clear()
    _DECODED_HEADS[bytes(data)] = head
    return head


def _decode_str_array(data: bytes) -> np.ndarray:
    shape, items = _unpack_list(data, 2, "string array")
    shape = _check_shape(shape, "string array shape")
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise CodecError("string array: expected a flat list of str")
    if len(items) != math.prod(shape):
        raise CodecError(f"string array: shape {list(shape)} does not match {len(items)} items")
    return np.array(items, dtype=str).reshape(shape)


def _str_keys(obj: Any) -> bool:
    """True when every map inside ``obj`` (through maps and lists) has str keys only."""
    if type(obj) is dict:
        for k, v in obj.items():
            if type(k) is not str or (type(v) in _CONTAINERS and not _str_keys(v)):
                return False
        return True
    for v in obj:
        if type(v) in _CONTAINERS and not _str_keys(v):
            return False
    return True


_CONTAINERS = frozenset((dict, list, tuple))


def _find_unencodable(obj: Any, path: str) -> tuple[str | None, str]:
    """Walk ``obj`` and return ``(path, reason)`` of the first value :func:`encode` refuses."""
    if obj is None or isinstance(obj, (bool, float, str, bytes)):
        return None, ""
    if isinstance(obj, int):
        return (None, "") if -(2**63) <= obj < 2**64 else (path, f"int {obj} does not fit in 64 bits")
    if isinstance(obj, np.ndarray | np.generic):
        if isinstance(obj, np.ndarray) and obj.dtype.kind == "U":
            return None, ""
        try:
            _wire_dtype(obj.dtype)
        except TypeError as e:
            return path, str(e)
        return None, ""
    if isinstance(obj, dict):
        for k, v in obj.items():
            if not isinstance(k, str):
                return f"{path}[{k!r}]", f"map keys must be str, received {type(k).__name__}"
            found = _find_unencodable(v, f"{path}.{k}")
            if found[0]:
                return found
        return None, ""
    if isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            found = _find_unencodable(v, f"{path}[{i}]")
            if found[0]:
                return found
        return None, ""
    return path, f"type {type(obj).__name__} is not supported (no pickling on the wire)"
