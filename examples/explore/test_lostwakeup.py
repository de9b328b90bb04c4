"""The worked example of docs/explore.md as pytest tests: each is explored like
``looplab explore`` (``@pytest.mark.looplab``). The first fails by design (the
lost wake-up); run them with ``pytest examples/explore/test_lostwakeup.py``."""
import pytest

from lostwakeup import main


@pytest.mark.looplab(strategy="pct:d=3", budget=500)
async def test_take_gets_the_job():
    await main()


@pytest.mark.looplab(strategy="delays:2", budget=5000)
async def test_take_gets_the_job_fixed():
    await main(fixed=True)
