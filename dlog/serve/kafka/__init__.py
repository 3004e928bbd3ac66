"""The Kafka wire codec of the serving tier, sans-IO: bytes in, requests or refusals out; response
messages and records in, bytes out. No sockets, no clock, no asyncio, no stream code.

- `apis`: the one supported-API table (api key -> name, versions, message classes) and the
  ApiVersions answer built from it.
- `frames`: `RequestDecoder` (size-prefixed frames, `request_bytes_max`), request headers,
  request bodies decoded with kafka-python's classes (generated from Kafka's JSON schemas),
  `encode_response`; refusals are values (`RequestRefused`) saying whether to answer and whether
  to close the connection, as a Kafka broker would.
- `records`: record batch v2, decoded from a Produce partition (CRC-32C, magic 2, bounded
  decompression) and encoded for Fetch at a stream position.
- `compression`: bounded gzip, snappy, lz4 and zstd decompression.
- `errors`: the Kafka error codes dlog answers with, by name, with their meaning.
- `sasl`: the SASL mechanisms offered (PLAIN, OAUTHBEARER) and the dlog token a client's SASL
  message carries.
"""

from dlog.serve.kafka.apis import SUPPORTED_APIS, Api, api_versions_response
from dlog.serve.kafka.errors import ErrorCode
from dlog.serve.kafka.frames import (
                                     REQUEST_BYTES_MAX_DEFAULT,
                                     Request,
                                     RequestDecoder,
                                     RequestHeader,
                                     RequestRefused,
                                     SaslToken,
                                     decode_request,
                                     encode_response,
                                     encode_sasl_token,
)
from dlog.serve.kafka.records import (
                                     BATCH_BYTES_MAX_DEFAULT,
                                     BATCH_DECOMPRESSED_BYTES_MAX_DEFAULT,
                                     BatchRefused,
                                     ProducedBatch,
                                     Record,
                                     decode_produce_records,
                                     encode_record_batch,
                                     encode_record_columns,
)

__all__ = [
    "BATCH_BYTES_MAX_DEFAULT", "BATCH_DECOMPRESSED_BYTES_MAX_DEFAULT", "REQUEST_BYTES_MAX_DEFAULT",
    "SUPPORTED_APIS", "Api", "BatchRefused", "ErrorCode", "ProducedBatch", "Record", "Request",
    "RequestDecoder", "RequestHeader", "RequestRefused", "SaslToken", "api_versions_response",
    "decode_produce_records", "decode_request", "encode_record_batch", "encode_record_columns", "encode_response",
    "encode_sasl_token",
]
