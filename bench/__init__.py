"""looplab's harness: peers, scenarios, reports, benchmarks and the command line."""
