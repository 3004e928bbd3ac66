"""Seeded histories of producers that pipeline, resend, bump epochs and replay old batches while the
stream's writes fail and its owner dies and is rebuilt from its last snapshot and the entries
after it: every sequence lands exactly once and in order, every acknowledgement names where it
landed, and an acknowledged batch is never accepted again."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from dlog.core.dedup import Accepted, DedupTable, Duplicate, Fenced, InFlight, OutOfOrder, kafka_producer
from dlog.core.sequences import KAFKA_SEQUENCE_MAX, SequenceRule, sequence_rule

RING = KAFKA_SEQUENCE_MAX + 1
STEPS = 400
IN_FLIGHT_MAX = 5  # as a Kafka producer


@dataclass
class Client:
    producer: str
    next_sequence: int
    epoch: int = 0
    sent: list[tuple[int, int, int]] = field(default_factory=list)  # (epoch, first, last) in send order
    unacked: list[tuple[int, int, int]] = field(default_factory=list)
    acked: list[tuple[int, int, int]] = field(default_factory=list)
    resuming: bool = False  # after a failure: sends again from its oldest unacknowledged batch

    def may_send(self) -> bool:
        if self.resuming and not self.unacked:
            self.resuming = False
        return len(self.unacked) < IN_FLIGHT_MAX and not self.resuming

    def resend(self, rng: random.Random) -> tuple[int, int, int]:
        """Any batch in flight may be sent again while it may still land (a timeout racing the
        original); after a failure a producer resends in order, as a Kafka client does and as a
        native writer resumes from `last_sequence`: a table that knows nothing of a lost first
        batch, or a rule with gaps, cannot tell a lower sequence after a higher one from a
        duplicate."""
        return self.unacked[0] if self.resuming else rng.choice(self.unacked)

    def new_batch(self, rng: random.Random) -> tuple[int, int, int]:
        size = rng.randint(1, 4)
        if sequence_rule(self.producer) is SequenceRule.CONSECUTIVE:
            first, last = self.next_sequence, (self.next_sequence + size - 1) % RING
            self.next_sequence = (last + 1) % RING
        else:  # native: the application's own positions, with gaps
            first = self.next_sequence + rng.randint(0, 9)
            last = first + size - 1
            self.next_sequence = last + 1
        batch = (self.epoch, first, last)
        self.sent.append(batch)
        self.unacked.append(batch)
        return batch


class History:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.clients = [Client(kafka_producer(1), 0), Client(kafka_producer(2), KAFKA_SEQUENCE_MAX - 12),
                        Client("importer", 100)]
        self.log: list[tuple[str, int, int, int, int, int]] = []  # producer, epoch, first, last, offsets
        self.snapshot, self.snapshot_position = DedupTable().snapshot(), 0
        self.table = DedupTable()
        self.queue: list[tuple[str, int, int, int]] = []  # pushed, in append order
        self.parked: list[tuple[Client, tuple[int, int, int]]] = []

    def offer(self, client: Client, batch: tuple[int, int, int]) -> None:
        epoch, first, last = batch
        verdict = self.table.offer(client.producer, first, last, 0, epoch)
        if isinstance(verdict, Accepted):
            self.queue.append((client.producer, epoch, first, last))
        elif isinstance(verdict, Duplicate):
            self.acknowledge(client, batch, verdict.first_offset)
        elif isinstance(verdict, InFlight):
            self.parked.append((client, batch))
        else:
            assert isinstance(verdict, (OutOfOrder, Fenced)), verdict  # the client sends again later
            assert batch in client.unacked, f"an acknowledged batch was refused: {verdict}"

    def acknowledge(self, client: Client, batch: tuple[int, int, int], first_offset: int | None) -> None:
        landed = [entry for entry in self.log if entry[:4] == (client.producer, *batch)]
        assert len(landed) == 1, f"{client.producer} {batch} landed {len(landed)} times"
        assert first_offset in (None, landed[0][4]), "an acknowledgement names another offset"
        if batch in client.unacked:
            client.unacked.remove(batch)
            client.acked.append(batch)

    def append_head(self) -> None:
        producer, epoch, first, last = self.queue.pop(0)
        offset = self.log[-1][5] + 1 if self.log else 0
        count = (last - first) % RING + 1
        self.log.append((producer, epoch, first, last, offset, offset + count - 1))
        self.table.on_durable(producer, first, last, offset, offset + count - 1, 0, epoch)
        client = next(c for c in self.clients if c.producer == producer)
        self.acknowledge(client, (epoch, first, last), offset)
        self.retry_parked(producer)

    def fail_all(self) -> None:
        """The writer failed before any bookie saw the queued entries."""
        self.resume_in_order()
        failed, self.queue = self.queue, []
        for producer in dict.fromkeys(entry[0] for entry in failed):
            _, epoch, first, _ = next(entry for entry in failed if entry[0] == producer)
            self.table.on_failed(producer, first, epoch)
        self.parked.clear()  # answered with the failure: re-offered, a later batch could pass an earlier one

    def crash(self) -> None:
        """The owner dies; recovery keeps some prefix of what it had sent; a new owner rebuilds."""
        for _ in range(self.rng.randint(0, len(self.queue))):
            self.append_head()
        self.queue.clear()
        self.parked.clear()
        self.resume_in_order()
        self.table = DedupTable.restore(self.snapshot)
        for producer, epoch, first, last, first_offset, last_offset in self.log[self.snapshot_position:]:
            self.table.on_replayed(producer, first, last, first_offset, last_offset, 0, epoch)

    def resume_in_order(self) -> None:
        for client in self.clients:
            client.resuming = bool(client.unacked)

    def retry_parked(self, producer: str) -> None:
        waiting = [item for item in self.parked if item[0].producer == producer]
        self.parked = [item for item in self.parked if item[0].producer != producer]
        for client, batch in waiting:
            self.offer(client, batch)

    def step(self) -> None:
        client = self.rng.choice(self.clients)
        action = self.rng.choices(["send", "resend", "append", "fail", "crash", "snapshot", "epoch", "old"],
                                  [30, 15, 30, 3, 2, 5, 2, 5])[0]
        if action == "send" and client.may_send():
            self.offer(client, client.new_batch(self.rng))
        elif action == "resend" and client.unacked:
            self.offer(client, client.resend(self.rng))
        elif action == "append" and self.queue:
            self.append_head()
        elif action == "fail":
            self.fail_all()
        elif action == "crash":
            self.crash()
        elif action == "snapshot":  # a segment completes
            self.snapshot, self.snapshot_position = self.table.snapshot(), len(self.log)
        elif action == "epoch" and not client.unacked and client.producer.startswith("kafka:"):
            client.epoch, client.next_sequence = client.epoch + 1, 0  # KIP-360: bump, restart at 0
        elif action == "old" and client.acked:
            epoch, first, last = self.rng.choice(client.acked)
            verdict = self.table.offer(client.producer, first, last, 0, epoch)
            assert isinstance(verdict, (Duplicate, Fenced, InFlight)), f"an acknowledged batch got {verdict}"

    def drain(self) -> None:
        for _ in range(100):
            if not any(client.unacked for client in self.clients):
                return
            while self.queue:
                self.append_head()
            for client in self.clients:
                for batch in list(client.unacked):
                    self.offer(client, batch)
        raise AssertionError("the producers never got everything acknowledged")


@pytest.mark.parametrize("seed", range(60))
def test_every_sequence_lands_once_in_order_whatever_fails(seed):
    history = History(seed)
    try:
        for _ in range(STEPS):
            history.step()
        history.drain()
        for client in history.clients:
            landed = [entry[1:4] for entry in history.log if entry[0] == client.producer]
            assert landed == client.sent, f"{client.producer}: sent {client.sent}, the stream holds {landed}"
            assert landed, "each producer wrote something"
    except AssertionError as error:
        raise AssertionError(f"seed {seed}: {error}") from error
