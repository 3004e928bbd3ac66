"""Auto-recovery: an elected auditor finds ledgers with fewer replicas than their write quorum
(lost bookies, failed replica checks, decommissioning) and marks them in ZooKeeper; replication
workers copy the missing entries to replacement bookies and swap them into the ledgers' metadata
by compare-and-set (RELIABILITY.md R1-R3). The decisions are pure functions (`policy`,
`throttle`); the auditor, the workers and the copier only execute them."""
