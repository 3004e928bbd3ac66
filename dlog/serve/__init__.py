"""The serving tier (`dlog serve`): servers that own streams and speak the Kafka protocol, so that
unmodified Kafka clients (librdkafka, kafka-python, aiokafka) produce to and consume from dlog
streams. `dlog.serve.kafka` is its sans-IO wire codec: framing, the supported-API table, request
decoding, response encoding, record batches and the Kafka error codes; no sockets, no clock."""
