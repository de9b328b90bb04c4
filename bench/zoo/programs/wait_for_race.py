"""asyncio.wait_for() and a cancellation that races the inner completion, for the zoo
entry cpython-86296 (standard library only, Python 3.6 syntax: the rows of Python
3.6-3.10, below looplab's minimum).

The entry's stream program, on asyncio's own loop: a task awaits
``wait_for(event.wait(), timeout_s)``; the event is set and, 0 to ``offsets - 1`` loop
passes later, the task is cancelled. A cancelled task that still ended normally had its
cancellation swallowed (bpo-42130: 3.8 to 3.11). A trial whose task had already returned
when the cancel came is not counted. No peers: the race is inside the loop.
"""
import asyncio

import _common


def run(spec, out):
    p = spec["params"]
    loop = asyncio.get_event_loop()

    async def main():
        swallowed = trials = 0
        for trial in range(p["trials"]):
            passes = trial % p["offsets"]        # loop passes between completion and cancel
            ev = asyncio.Event()

            async def waiter():
                await asyncio.wait_for(ev.wait(), p["timeout_s"])
                return "result"
            t = asyncio.ensure_future(waiter())
            for _ in range(2):                   # the waiter and wait_for's inner task park
                await asyncio.sleep(0)
            ev.set()                             # the inner await completes...
            for _ in range(passes):
                await asyncio.sleep(0)
            if not t.cancel():                   # ...and the outer task is cancelled
                await t                          # it had already returned: no race
                continue
            try:
                await t
                swallowed += 1                   # it ended normally: the cancel was lost
            except asyncio.CancelledError:
                pass
            trials += 1
        out.update(swallowed_count=swallowed, trials_count=trials)
    loop.run_until_complete(main())


if __name__ == "__main__":
    raise SystemExit(_common.run(run))
