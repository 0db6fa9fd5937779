"""Read a SentencePiece `tokenizer.model` without the sentencepiece package.

Why not the package: the converter needs only the piece table (text, score, type) and one normalizer
flag, which are plain protobuf fields; the sentencepiece wheel is a compiled C++ library that would
become a runtime dependency for those few fields. The file is a serialized `ModelProto`
(sentencepiece_model.proto):
  ModelProto:      1 pieces (repeated SentencePiece), 2 trainer_spec, 3 normalizer_spec, ...
  SentencePiece:   1 piece (string), 2 score (float), 3 type (enum: 1 NORMAL, 2 UNKNOWN, 3 CONTROL,
                   4 USER_DEFINED, 5 UNUSED, 6 BYTE; default NORMAL) — the same numbers as GGUF token types
  NormalizerSpec:  3 add_dummy_prefix (bool, default true)
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

from .errors import ConversionError


@dataclass
class Piece:
    text: str
    score: float
    kind: int


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise ValueError("truncated varint")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def fields(buf: bytes):
    """Yield (field number, wire type, value) of one message: ints for varints and fixed32/64 raw
    bytes, bytes for length-delimited fields."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 1:
            value, pos = buf[pos:pos + 8], pos + 8
        elif wire == 2:
            length, pos = _varint(buf, pos)
            value, pos = buf[pos:pos + length], pos + length
        elif wire == 5:
            value, pos = buf[pos:pos + 4], pos + 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
        if pos > len(buf):
            raise ValueError("truncated field")
        yield number, wire, value


def _piece(buf: bytes) -> Piece:
    text, score, kind = "", 0.0, 1
    for number, wire, value in fields(buf):
        if number == 1 and wire == 2:
            text = value.decode("utf-8")
        elif number == 2 and wire == 5:
            (score,) = struct.unpack("<f", value)
        elif number == 3 and wire == 0:
            kind = int(value)
    return Piece(text, float(score), kind)


def read_model(path: Path) -> tuple[list[Piece], bool]:
    """(pieces in id order, add_dummy_prefix) of a tokenizer.model."""
    data = Path(path).read_bytes()
    pieces: list[Piece] = []
    add_dummy_prefix = True
    try:
        for number, wire, value in fields(data):
            if number == 1 and wire == 2:
                pieces.append(_piece(value))
            elif number == 3 and wire == 2:
                for n, w, v in fields(value):
                    if n == 3 and w == 0:
                        add_dummy_prefix = bool(v)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConversionError(f"{path}: not a SentencePiece model ({exc})") from None
    if not pieces:
        raise ConversionError(f"{path}: no pieces (not a SentencePiece model?)")
    return pieces, add_dummy_prefix
