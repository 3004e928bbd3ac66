"""The sans-IO protocol core: quorum math, the wire codec, the entry format, ledger metadata, and
the writer, reader and recovery state machines (events and the time in, effects out). No
sockets, no clock, no event loop, no global random."""
