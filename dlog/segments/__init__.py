"""Segments of a stream: segment and stream-config metadata, the segment store in ZooKeeper, and
the record-set codec (Arrow record batches, zstd) that turns records into entries and back."""
