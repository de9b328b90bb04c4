"""A lost wake-up (docs/explore.md): a worker checks for a job, awaits, then
clears its Event and waits; a job whose set() lands in between is forgotten.

    looplab explore examples/explore/lostwakeup.py:main --strategy delays:1 --out ex
"""
import asyncio


async def serve(fixed: bool):
    jobs, wake = [], asyncio.Event()

    async def handle(reader, writer):           # one request per connection
        if await reader.readline() == b"job\n":  # a client submits a job
            jobs.append(b"done\n")
            wake.set()
        else:                                   # a client waits to take one
            if fixed:
                wake.clear()                    # the fix: clear, then check
            if not jobs:                        # the check
                await asyncio.sleep(0)          # any await: a log line, a metric
                if not fixed:
                    wake.clear()                # forgets a set() made since the check
                await wake.wait()
            writer.write(jobs.pop())
        writer.close()

    async def client(request):
        reader, writer = await asyncio.open_connection("127.0.0.1", 8000)
        writer.write(request)
        reply = await reader.readline()
        writer.close()
        return reply

    async with await asyncio.start_server(handle, "127.0.0.1", 8000):
        await asyncio.gather(client(b"job\n"), client(b"take\n"))


async def main():
    await serve(fixed=False)


async def fixed():
    await serve(fixed=True)
