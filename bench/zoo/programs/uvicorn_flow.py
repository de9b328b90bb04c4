"""uvicorn 0.6/0.7, the real releases, for the zoo entry uvicorn-336 (standard library and
uvicorn only, Python 3.6 syntax: uvicorn 0.6.1's uvloop and httptools do not build for
the Pythons looplab needs).

An ASGI app streams ``body_bytes`` in ``chunk_bytes`` messages (``more_body``) through
uvicorn's h11 protocol on asyncio's loop to a client that reads slowly and resets after
``vanish_after_bytes`` (looplab's ``http_vanish``), so the app's ``send`` is parked in
uvicorn's ``FlowControl.drain()`` when the connection is lost. uvicorn 0.6.1's
``connection_lost`` did not resume the flow, so the app stayed parked for good; 0.7.0
(PR 340) calls ``flow.resume_writing()`` there. The program reports whether the app had
returned ``bound_s`` after the connection was gone.
"""
import asyncio
import time

import _common


def serve(spec, out):
    p = spec["params"]
    import uvicorn
    from uvicorn.main import Server

    loop = asyncio.get_event_loop()
    st = {"sent": 0, "returned_at": None}
    chunk = _common.pattern(p["chunk_bytes"])

    class App:                       # ASGI 2: what both releases run
        def __init__(self, scope):
            self.scope = scope

        async def __call__(self, receive, send):
            try:
                await send({"type": "http.response.start", "status": 200,
                            "headers": [(b"content-length", str(p["body_bytes"]).encode())]})
                while st["sent"] < p["body_bytes"]:
                    st["sent"] += len(chunk)
                    await send({"type": "http.response.body", "body": chunk,
                                "more_body": st["sent"] < p["body_bytes"]})
            finally:
                st["returned_at"] = time.monotonic()

    config = uvicorn.Config(App, http="h11", loop="asyncio", lifespan="off", log_level="critical",
                            access_log=False)
    config.load()
    server = Server(config)

    def protocol():
        return config.http_protocol_class(config=config, server_state=server.server_state)

    async def main():
        for name in sorted(spec["peers"]):
            await loop.connect_accepted_socket(protocol, sock=_common.connect(spec["peers"][name]))
        end = time.monotonic() + p["serve_s"]
        while server.server_state.connections and time.monotonic() < end:
            await asyncio.sleep(0.005)
        lost_at = time.monotonic()
        out["connection_lost"] = not server.server_state.connections
        while st["returned_at"] is None and time.monotonic() < lost_at + p["bound_s"]:
            await asyncio.sleep(0.01)
        out["released"] = st["returned_at"] is not None
        out["sent_bytes"] = st["sent"]
        for task in [t for t in asyncio.Task.all_tasks(loop) if t is not asyncio.Task.current_task(loop)]:
            task.cancel()
        await asyncio.sleep(0)
    loop.run_until_complete(main())
    out["uvicorn"] = uvicorn.__version__


if __name__ == "__main__":
    raise SystemExit(_common.run(serve))
