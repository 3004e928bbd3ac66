"""Metadata: the store port (MetadataStore) with its ZooKeeper implementation, the one asyncio
adapter over kazoo (zk.py), the ZooKeeper layout, and the embedded ZooKeeper server used by
`dlog standalone` and the tests."""
