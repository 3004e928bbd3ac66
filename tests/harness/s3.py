"""An S3 store for the tier tests: moto's server mode as a subprocess on loopback, started and
stopped by pid (the one implementation is dlog_tools.bench.moto, which `dlog bench tier --moto`
runs too)."""

from dlog_tools.bench.moto import ACCESS_KEY, PART_BYTES, REGION, SECRET_KEY, MotoS3

__all__ = ["ACCESS_KEY", "PART_BYTES", "REGION", "SECRET_KEY", "MotoS3"]
