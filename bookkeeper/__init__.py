"""The BookKeeper layer: replicated ledgers. Its top-level modules are the ground every other
package stands on: `errors` (the one error tree), `clock` (the clock port) and `retry` (the one
retry helper). Sub-packages: `protocol` (sans-IO core), `meta` (metadata store), `client` (the
ledger client), `bookie` (the storage server). See docs/design.md for the package map."""
