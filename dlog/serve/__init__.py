"""The serving tier (`dlog serve`): servers that own streams and speak the Kafka protocol, so that
unmodified Kafka clients (librdkafka, kafka-python, aiokafka) produce to and consume from dlog
streams. `dlog.serve.kafka` is its sans-IO wire codec: framing, the supported-API table, request
decoding, response encoding, record batches and the Kafka error codes; no sockets, no clock.
`groups` is the consumer-group coordinator (Kafka's classic group protocol as a pure machine:
requests and the time in, replies and the next wake-up out) and `producer_ids` the block rule
behind InitProducerId. Producer deduplication is shared with native writers: `dlog.core.dedup`."""
