"""Bounded decompression of record batch payloads: gzip, snappy, lz4 and zstd as Kafka frames them.

Each decoder stops as soon as the output would pass `bytes_max`, so a small batch that inflates
to gigabytes costs at most `bytes_max` bytes of memory (kafka-python's own codec functions, which
the rest of this package builds on, decompress without a bound, hence this module). Formats:
gzip may be several members (Java's GZIPInputStream reads them all); snappy is either the xerial
framing the Java client writes (a 16-byte header, then size-prefixed raw snappy blocks) or one
raw snappy block (librdkafka); lz4 is one LZ4 frame; zstd may be several frames.

Failures raise `DecompressionError` with `too_large` saying which limit or fault it was; the
record batch codec turns it into MESSAGE_TOO_LARGE or CORRUPT_MESSAGE.
"""

from __future__ import annotations

import io
import struct
import zlib

import cramjam
import lz4.frame
import zstandard

from bookkeeper.errors import ProtocolError

NONE, GZIP, SNAPPY, LZ4, ZSTD = 0, 1, 2, 3, 4
CODEC_NAMES = {NONE: "none", GZIP: "gzip", SNAPPY: "snappy", LZ4: "lz4", ZSTD: "zstd"}

_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER_BYTES = 16
_BLOCK_SIZE = struct.Struct(">i")
_READ_CHUNK_BYTES = 1 << 16
_ZSTD_WINDOW_BYTES_MAX = 1 << 27  # zstd's own default limit; a smaller bytes_max lowers it


class DecompressionError(ProtocolError):
    """A compressed record batch payload that does not decompress within its bound."""

    code = 650

    def __init__(self, message: str, *, too_large: bool = False) -> None:
        super().__init__(message)
        self.too_large = too_large


def decompress(codec: int, data: bytes, bytes_max: int) -> bytes:
    """`data` compressed with `codec` -> the decompressed bytes, at most `bytes_max` of them."""
    if codec == GZIP:
        return _gzip(data, bytes_max)
    if codec == SNAPPY:
        return _snappy(data, bytes_max)
    if codec == LZ4:
        return _lz4(data, bytes_max)
    if codec == ZSTD:
        return _zstd(data, bytes_max)
    raise DecompressionError(f"unknown compression codec {codec} (known: 0-4)")


def _too_large(codec: str, bytes_max: int) -> DecompressionError:
    return DecompressionError(f"{codec} records decompress to more than {bytes_max} bytes "
                              "(batch_decompressed_bytes_max)", too_large=True)


def _gzip(data: bytes, bytes_max: int) -> bytes:
    output = bytearray()
    remaining = memoryview(data)
    while remaining:
        member = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
        try:
            output += member.decompress(remaining, bytes_max + 1 - len(output))
        except zlib.error as exc:
            raise DecompressionError(f"gzip records do not decompress: {exc}") from exc
        if len(output) > bytes_max or member.unconsumed_tail:
            raise _too_large("gzip", bytes_max)
        if not member.eof:
            raise DecompressionError("gzip records end inside a gzip member")
        remaining = memoryview(member.unused_data)
    return bytes(output)


def _snappy(data: bytes, bytes_max: int) -> bytes:
    if not data.startswith(_XERIAL_MAGIC):
        return _snappy_block(data, bytes_max)
    output = bytearray()
    position = _XERIAL_HEADER_BYTES
    while position < len(data):
        if position + _BLOCK_SIZE.size > len(data):
            raise DecompressionError("snappy (xerial) records end inside a block size")
        (size,) = _BLOCK_SIZE.unpack_from(data, position)
        position += _BLOCK_SIZE.size
        if size < 0 or position + size > len(data):
            raise DecompressionError(f"snappy (xerial) block of {size} bytes runs past the records")
        output += _snappy_block(data[position: position + size], bytes_max - len(output))
        position += size
    return bytes(output)


def _snappy_block(block: bytes, bytes_max: int) -> bytes:
    try:
        # a raw snappy block starts with its decompressed length: check it before allocating
        declared = cramjam.snappy.decompress_raw_len(block)
        if declared > bytes_max:
            raise _too_large("snappy", bytes_max)
        output = bytes(cramjam.snappy.decompress_raw(block))
    except cramjam.DecompressionError as exc:
        raise DecompressionError(f"snappy records do not decompress: {exc}") from exc
    if len(output) != declared:
        raise DecompressionError(f"snappy block declared {declared} bytes and held {len(output)}")
    return output


def _lz4(data: bytes, bytes_max: int) -> bytes:
    decompressor = lz4.frame.LZ4FrameDecompressor()
    try:
        output: bytes = decompressor.decompress(data, max_length=bytes_max + 1)
    except RuntimeError as exc:  # the lz4 package reports a bad frame as RuntimeError
        raise DecompressionError(f"lz4 records do not decompress: {exc}") from exc
    if len(output) > bytes_max:
        raise _too_large("lz4", bytes_max)
    if not decompressor.eof:
        raise DecompressionError("lz4 records end inside their LZ4 frame")
    if decompressor.unused_data:
        raise DecompressionError(f"lz4 records have {len(decompressor.unused_data)} bytes after "
                                 "their LZ4 frame")
    return output


def _zstd(data: bytes, bytes_max: int) -> bytes:
    # the window is memory the decoder needs besides its output: bound it by the output's bound
    window_bytes_max = min(_ZSTD_WINDOW_BYTES_MAX, max(bytes_max, 1 << 20))
    decompressor = zstandard.ZstdDecompressor(max_window_size=window_bytes_max)
    output = bytearray()
    try:
        if zstandard.get_frame_parameters(data).window_size > window_bytes_max:
            raise _too_large("zstd", bytes_max)
        with decompressor.stream_reader(io.BytesIO(data), read_across_frames=True) as reader:
            while chunk := reader.read(min(_READ_CHUNK_BYTES, bytes_max + 1 - len(output))):
                output += chunk
                if len(output) > bytes_max:
                    raise _too_large("zstd", bytes_max)
        # The stream reader ends quietly when its input ends inside a frame; walking the frames
        # again finds that. It decompresses the same bytes, so it stays within the bound above.
        remaining = data
        while remaining:
            frame = decompressor.decompressobj()
            frame.decompress(remaining)
            if not frame.eof:
                raise DecompressionError("zstd records end inside a zstd frame")
            remaining = frame.unused_data
    except zstandard.ZstdError as exc:
        raise DecompressionError(f"zstd records do not decompress: {exc}") from exc
    return bytes(output)
