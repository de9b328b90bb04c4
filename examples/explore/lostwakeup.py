"""A lost wake-up, the worked example of docs/explore.md: a "take" request checks
for a job, awaits, then clears the Event and waits, so a job whose set() lands in
between is forgotten. ``fixed`` clears first, then checks."""
import asyncio


async def main(fixed=False):
    jobs, wake = [], asyncio.Event()

    async def handle(reader, writer):               # one request per connection
        if await reader.readline() == b"job\n":      # a job: queue it, wake the taker
            jobs.append(b"done\n")
            wake.set()
        else:                                        # take: wait for a job
            if fixed:
                wake.clear()                         # the fix: clear, then check
            if not jobs:                             # the check
                await asyncio.sleep(0)               # any await: a log line, a metric
                if not fixed:
                    wake.clear()                     # forgets a set() since the check
                await wake.wait()
            writer.write(jobs.pop())
        writer.close()

    async def client(request):
        reader, writer = await asyncio.open_connection("127.0.0.1", 8000)
        writer.write(request)
        await reader.readline()
        writer.close()

    async with await asyncio.start_server(handle, "127.0.0.1", 8000):
        await asyncio.gather(client(b"job\n"), client(b"take\n"))


async def fixed():
    await main(fixed=True)
