"""A TCP proxy that makes a local server behave like one across a network: each request waits one
round trip (`--rtt-ms`, added when a client speaks after the server has answered, or first on a
connection) and each connection's bytes flow at most `--stream-mbps` MB/s each way (object stores cap a single
stream; concurrency is what makes them fast). Used by bench_remote.py; run in its own process.

    python benchmarks/netem_proxy.py LISTEN_PORT TARGET_PORT --rtt-ms 20 --stream-mbps 50
"""
from __future__ import annotations

import argparse
import asyncio
import time


async def pipe(reader, writer, delay_first, state, rate):
    """Copy one direction of a connection: client -> server with `delay_first` (a round trip per request),
    server -> client with None; both at most `rate` bytes a second."""
    try:
        while True:
            data = await reader.read(1 << 16)
            if not data:
                break
            if delay_first is not None:  # client -> server: a new request pays a round trip
                if state["answered"]:
                    state["answered"] = False
                    await asyncio.sleep(delay_first)
                key = "up_t"
            else:
                state["answered"] = True
                key = "down_t"
            if rate:  # each direction of a connection capped (uploads too)
                state[key] = max(state.get(key, 0.0), time.perf_counter()) + len(data) / rate
                wait = state[key] - time.perf_counter()
                if wait > 0:
                    await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        try:
            writer.close()
        except Exception:
            pass


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("listen", type=int)
    ap.add_argument("target", type=int)
    ap.add_argument("--rtt-ms", type=float, default=20.0)
    ap.add_argument("--stream-mbps", type=float, default=50.0)
    a = ap.parse_args()
    rtt, rate = a.rtt_ms / 1000, a.stream_mbps * 1e6

    async def handle(cr, cw):
        try:
            sr, sw = await asyncio.open_connection("127.0.0.1", a.target)
        except OSError:
            cw.close()
            return
        state = {"answered": True}
        await asyncio.gather(pipe(cr, sw, rtt, state, rate), pipe(sr, cw, None, state, rate))

    async def serve():
        server = await asyncio.start_server(handle, "127.0.0.1", a.listen)
        async with server:
            await server.serve_forever()

    asyncio.run(serve())


if __name__ == "__main__":
    main()
