"""The host: what runs where. ``procs`` starts, stops and measures every child
process (RSS, fds); ``envs`` finds interpreters and builds the environment a
runtime spec's ``@INTERPRETER+PINS`` names.
"""
