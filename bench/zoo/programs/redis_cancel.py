"""redis-py's asyncio client, the real releases, for the zoo entry redis-py-2624
(standard library and redis-py only, Python 3.6 syntax).

The thread's repro on one connection (``single_connection_client=True``): a
``GET keyA`` task is cancelled ``cancel_after_s`` after it started -- its command is on
the wire, its reply (``reply_delay_s`` away at looplab's ``resp_server``) is not yet --
and the next ``GET keyB`` is awaited. redis-py up to 4.5.3 returned the connection with
the cancelled command's reply unread, so ``GET keyB`` read ``value:keyA`` (CVE-2023-28859,
issue 2665); 4.5.4 finishes the cancelled command's exchange under a shield. The program
counts the replies that were not for their own command, over ``rounds`` rounds.
"""
import asyncio

import _common


def run(spec, out):
    p = spec["params"]
    import redis
    from redis.asyncio import Redis
    host, port = spec["peers"]["redis"]
    loop = asyncio.get_event_loop()

    async def main():
        r = Redis(host=host, port=int(port), single_connection_client=True)
        wrong = cancelled = answered = 0
        for i in range(p["rounds"]):
            first, second = "key%d" % (2 * i), "key%d" % (2 * i + 1)
            t = asyncio.ensure_future(r.get(first))
            await asyncio.sleep(p["cancel_after_s"])
            t.cancel()
            try:
                await t
            except asyncio.CancelledError:
                cancelled += 1
            got = await asyncio.wait_for(r.get(second), 5)
            answered += 1
            wrong += got != ("value:" + second).encode()
        await r.close()
        out.update(wrong_replies_count=wrong, cancelled_count=cancelled, answered_count=answered)

    loop.run_until_complete(main())
    out["redis"] = redis.__version__


if __name__ == "__main__":
    raise SystemExit(_common.run(run))
