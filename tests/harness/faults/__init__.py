"""Fault injection on real processes: kill, pause, partition, damage disks; the workload of
writers and readers that records a history; bookies in network namespaces."""
