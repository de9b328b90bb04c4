"""Runtimes: a kernel plus the port it is driven through, named for users; the lab's
registry of them.

* ``registry`` -- what a runtime is (``RuntimeInfo``), ``register``, lookup,
  availability and plugin discovery;
* ``spec``     -- a spec parsed once into a ``Runtime`` (options, interpreter, pins,
  loop keywords), which travels to child processes as data;
* ``builtin``  -- the nine built-in runtimes, registered like any plugin.

Nothing registers when this package is imported: the built-ins and the plugins load
the first time the registry is read. ``from bench import runtimes`` gives every
public name; ``protocols.runtimes``, the first release's path, still resolves here
inside looplab.
"""
from bench.runtimes import registry as _registry, spec as _spec
from bench.runtimes.registry import *  # noqa: F401,F403 -- the package's face
from bench.runtimes.spec import *  # noqa: F401,F403
from protocols.ports import bind_listener  # noqa: F401 -- its first home was here

__all__ = [*_registry.__all__, *_spec.__all__, "bind_listener"]
