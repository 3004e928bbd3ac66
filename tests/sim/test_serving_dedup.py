"""An idempotent producer's batch lands whole in one entry whose producer section names it, beside
other producers' batches and plain records; a new owner's `rebuild_dedup` finds every batch written
after the stored snapshot at its offsets, so a resend is a duplicate with its original offset. The
real writer, reader and OwnedStream, on the simulator's in-memory store and modelled ledgers."""

from __future__ import annotations

import asyncio
import random

from dlog import Namespace
from dlog.core.dedup import Accepted, Duplicate, decode_stored, kafka_producer
from dlog.segments.memory import MemoryMetadata
from dlog.serve.kafka import ErrorCode, Record
from dlog.server.owned import OwnedStream, rebuild_dedup
from tests.harness.streamsim.ledgers import SimLedgers
from tests.harness.streamsim.loop import SimulatedClock, SimulatedTimeLoop


def simulated(scenario) -> None:
    loop = SimulatedTimeLoop()
    clock = SimulatedClock(loop)
    metadata = MemoryMetadata(clock=clock)
    ledgers = SimLedgers(random.Random(1), loop)
    rng = random.Random(2)

    async def process() -> Namespace:
        namespace = Namespace("simulated", "dedup", store=metadata.session(), client=ledgers.client(), clock=clock,
                              rng=rng.random)
        await namespace.start()
        return namespace

    try:
        loop.run_until_complete(scenario(process))
    finally:
        loop.close()


def records(prefix: str, count: int) -> list[Record]:
    return [Record(1_700_000_000_000, None, f"{prefix}-{n}".encode() * 20) for n in range(count)]


def test_producer_batches_land_whole_and_a_new_owner_rebuilds_them_from_the_stream():
    async def scenario(process) -> None:
        first = await process()
        await first.create_stream("s", roll_bytes=6_000)  # small entries: batches must not be cut
        writer = await first.open_writer("s", lock_holder={"server": 1}, linger_ms=5.0)
        table, version, replayed = await rebuild_dedup(first, "s", 0)
        assert (table.producer_count, replayed) == (0, 0)
        owned = OwnedStream("s", writer, 0, 0, 1 << 20, table, replay_bytes_max=2_000,
                            save_snapshot=lambda owned, data: None)
        sent = []
        for round_ in range(12):
            for producer in (1, 2):
                batch = records(f"p{producer}-{round_}", 3 + round_ % 4)
                sequence = sum(len(b) for p, _, b in sent if p == producer)
                sent.append((producer, sequence, batch))
            writer.offer(f"plain-{round_}".encode())
        answers = await asyncio.gather(*(owned.produce_idempotent(batch, producer, 0, sequence,
                                                                  sequence + len(batch) - 1, lambda: None)
                                         for producer, sequence, batch in sent))
        assert all(error is ErrorCode.NONE for error, _ in answers)
        await writer.flush()
        offsets = {(producer, sequence): offset for (producer, sequence, _), (_, offset) in zip(sent, answers,
                                                                                                strict=True)}
        # every batch is one run of one entry, at the records the producer sent
        runs, runs_per_entry = [], []
        async with first.open_reader("s", "earliest", follow=False) as reader:
            while (entry := await reader.next_entry()) is not None:
                values = entry.batch.column("value").to_pylist()
                runs_per_entry.append(len(entry.producers))
                for run in entry.producers:
                    runs.append((run.producer, run.first_sequence, entry.first_position + run.first_slot,
                                 values[run.first_slot: run.first_slot + run.records]))
        assert len(runs) == len(sent)
        assert len(runs_per_entry) > 3 and max(runs_per_entry) > 1  # many entries, some shared by producers
        for producer, sequence, batch in sent:
            assert (kafka_producer(producer), sequence, offsets[producer, sequence],
                    [record.value for record in batch]) in runs
        # a new owner: only the entries after the stored snapshot's position are replayed
        await writer.close()
        data, _ = await first.store.dedup_snapshot("s")  # at 0: nothing was stored since the takeover
        assert decode_stored(data)[0] == 0
        second = await process()
        writer2 = await second.open_writer("s", lock_holder={"server": 2})
        end = writer2.segment.first_position
        rebuilt, _, replayed = await rebuild_dedup(second, "s", end)
        assert replayed == len(sent) and rebuilt.producer_count == 2
        producer, sequence, batch = sent[-1]
        assert rebuilt.offer(kafka_producer(producer), sequence, sequence + len(batch) - 1, 0) == \
            Duplicate(offsets[producer, sequence], offsets[producer, sequence] + len(batch) - 1)
        assert isinstance(rebuilt.offer(kafka_producer(producer), sequence + len(batch), sequence + len(batch),
                                        0), Accepted)
        # the rebuild stored a snapshot at the end: the next owner replays nothing
        data, _ = await second.store.dedup_snapshot("s")
        assert decode_stored(data)[0] == end
        await writer2.close()

    simulated(scenario)


def test_producer_sections_point_at_their_records_beside_bulk_runs_of_plain_producers():
    """An entry can hold an idempotent producer's batch after a plain producer's bulk run
    (`offer_records`, more than 8 records: one Arrow run): the section's first slot counts every
    record of the run before it, so a rebuild reads the batch's own records."""
    async def scenario(process) -> None:
        ns = await process()
        await ns.create_stream("mixed", roll_bytes=1 << 20)
        writer = await ns.open_writer("mixed", lock_holder={"server": 1}, linger_ms=5.0)
        table, _, _ = await rebuild_dedup(ns, "mixed", 0)
        owned = OwnedStream("mixed", writer, 0, 0, 1 << 20, table, replay_bytes_max=1 << 20,
                            save_snapshot=lambda owned, data: None)
        plain, idempotent = [], []
        for round_ in range(6):
            plain.append(owned.append(records(f"bulk-{round_}", 12)))
            batch = records(f"p7-{round_}", 3)
            idempotent.append((batch, owned.produce_idempotent(batch, 7, 0, 3 * round_, 3 * round_ + 2,
                                                               lambda: None)))
        together = await asyncio.gather(*plain, *(answer for _, answer in idempotent))  # buffered together
        answers = together[len(plain):]
        assert all(error is ErrorCode.NONE for error, _ in answers)
        sections, shared = [], 0
        async with ns.open_reader("mixed", "earliest", follow=False) as reader:
            while (entry := await reader.next_entry()) is not None:
                values = entry.batch.column("value").to_pylist()
                shared += bool(entry.producers) and entry.batch.num_rows > sum(run.records for run in entry.producers)
                for run in entry.producers:
                    sections.append((entry.first_position + run.first_slot,
                                     values[run.first_slot: run.first_slot + run.records]))
        assert shared > 0 and len(sections) == len(idempotent)  # entries hold bulk runs and producer batches
        assert sections == [(offset, [record.value for record in batch])
                            for (batch, _), (_, offset) in zip(idempotent, answers, strict=True)]
        await writer.close()

    simulated(scenario)
