"""A deterministic simulation of the ledger layer as it ships: the real client (driver, pool, batcher,
connection, protocol machines) and real bookies (server, connection, core over in-memory journal and
storage ports), on one simulated-time loop over a simulated network and metadata store."""
