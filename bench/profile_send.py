"""``python -m bench.profile_send``: where the per-record ``await producer.send()`` time goes.

Starts one standalone broker (its own process), then, in this process under
``cProfile``, sends ``--records`` 100 B records one ``send()`` call at a time
(as ``bench.worker.hr_produce`` with ``api=send`` does) and prints, for the
functions with the most own time, their cost in microseconds per record. The
profiler's overhead inflates every figure (roughly doubling small functions);
read the split, not the total. The unprofiled total is printed first.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import tempfile
import time
from pathlib import Path

from headrace.testing import procs


async def _send(bootstrap: str, topic: str, records: int) -> float:
    from headrace.client.producer import Producer

    value = b"x" * 100
    producer = await Producer(bootstrap).start()
    try:
        send = producer.send
        started = time.perf_counter()
        for _ in range(records):
            await send(topic, value)
        await producer.flush()
        return time.perf_counter() - started
    finally:
        await producer.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile_send", description=__doc__)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--top", type=int, default=18)
    args = parser.parse_args(argv)
    from headrace.aio import run

    with tempfile.TemporaryDirectory(prefix="headrace-profile-send-") as tmp:
        broker = procs.BrokerProcess(Path(tmp) / "data")
        broker.start()
        try:
            broker.create_topic("profile", 1)
            plain = run(_send(broker.bootstrap, "profile", args.records))
            print(
                f"unprofiled: {args.records:,} records in {plain:.2f} s,"
                f" {plain / args.records * 1e6:.2f} µs per record"
                f" ({args.records / plain:,.0f} records/s)"
            )
            profile = cProfile.Profile()
            profile.enable()
            run(_send(broker.bootstrap, "profile", args.records))
            profile.disable()
        finally:
            broker.kill9()
    stats = pstats.Stats(profile)
    rows = []
    for (filename, line, name), (_, calls, own, cumulative, _) in stats.stats.items():  # type: ignore[attr-defined]
        rows.append((own, cumulative, calls, f"{Path(filename).name}:{line}({name})"))
    rows.sort(reverse=True)
    total_own = sum(r[0] for r in rows)
    print(f"profiled: {total_own / args.records * 1e6:.2f} µs of own time per record")
    print(f"{'own µs/rec':>10} {'cum µs/rec':>10} {'calls/rec':>9}  function")
    for own, cumulative, calls, where in rows[: args.top]:
        print(
            f"{own / args.records * 1e6:10.3f} {cumulative / args.records * 1e6:10.3f}"
            f" {calls / args.records:9.3f}  {where}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
