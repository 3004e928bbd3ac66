"""Security: TLS contexts, signed tokens, principals and roles, authorization decisions, client
settings (client.toml), ZooKeeper credentials and ACL policy, sealed stream passwords.

Everything here is plain code without sockets or an event loop; the bookie, the ledger client,
the metadata store and the tools call it. docs/security.md describes the model.
"""
