"""The bookie: the storage server process. Server and connections, the request core, the
group-committed journal, ledger storage (entry logs + rocksdict index), garbage collection,
registration and cookies, the HTTP admin endpoint and metrics."""
